"""Real servers for tests (STYLE: tests talk to real things): a fresh ``nats-server`` from the
wheel per use, and a throwaway Postgres database — on ``ENGRAM_TEST_DATABASE_URL``, else the
machine's Postgres at 127.0.0.1:5432 when it answers, else the embedded Postgres wheel."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from shared.db.engine import migrate
from shared.embedded.nats_server import NatsServerProcess
from shared.embedded.postgres import EmbeddedPostgres

__all__ = ["nats_server", "throwaway_database"]

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


@asynccontextmanager
async def nats_server(store_dir: Path) -> AsyncIterator[NatsServerProcess]:
    server = NatsServerProcess(store_dir)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _answers(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


@asynccontextmanager
async def throwaway_database(admin_url: str | None, tmp_dir: Path) -> AsyncIterator[str]:
    """A new, migrated database, dropped afterwards; yields its URL."""
    embedded: EmbeddedPostgres | None = None
    if not admin_url:
        if _answers("127.0.0.1", 5432):
            admin_url = LOCAL_POSTGRES
        else:
            embedded = EmbeddedPostgres(tmp_dir)
            admin_url = _with_database(await embedded.start(), "postgres")
    name = f"engram_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(_asyncpg_dsn(admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = _with_database(admin_url, name)
    await migrate(url)
    try:
        yield url
    finally:
        admin = await asyncpg.connect(_asyncpg_dsn(admin_url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        if embedded is not None:
            await embedded.stop()
        await asyncio.sleep(0)
