"""Real servers for tests (STYLE: tests talk to real things): a fresh ``nats-server`` from the
wheel per use (open, or with authentication as ``engram up`` runs it), and a throwaway Postgres
database — on ``ENGRAM_TEST_DATABASE_URL``, else the machine's Postgres at 127.0.0.1:5432 when it
answers, else the embedded Postgres wheel."""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID, uuid4

import asyncpg

from shared.embedded.nats_server import NatsServerProcess
from shared.embedded.postgres import EmbeddedPostgres
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import (
    GATEWAY,
    SERVICES,
    Grant,
    Permissions,
    gateway_permissions,
    service_permissions,
)
from shared.security.nats_auth.render import NatsUser
from shared.security.nats_auth.store import Identity, NatsIdentities
from shared.storage.db.engine import migrate

__all__ = ["SecuredNatsServer", "nats_server", "secured_nats_server", "throwaway_database"]

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


@asynccontextmanager
async def nats_server(store_dir: Path) -> AsyncIterator[NatsServerProcess]:
    server = NatsServerProcess(store_dir)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


#: A test's eyes on Engram's internals (dead letters, consumer state, internal events): may do
#: anything. Never part of a deployment; services and clients under test never use it.
_EVERYTHING = Permissions(
    publish=(Grant("a test observer", (">",)),), subscribe=(Grant("a test observer", (">",)),)
)


class SecuredNatsServer(NatsServerProcess):
    """A nats-server admitting exactly what ``engram up``'s does (the all-in-one services identity,
    the development client, minted platform clients), the per-service identities of a production
    server (``engram serve <service>``), and an observer for the test itself."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "nats", auth=True)
        self.identities = NatsIdentities(root)
        #: A platform client of its own organization (``engram credentials mint``).
        self.client: Identity = self.identities.mint("tenant", uuid4())
        seed = new_user_seed()
        self.observer = Identity("observer", seed, public_key_of(seed), "_INBOX_observer")
        #: Seeds of the per-service identities, for ``engram serve <service>`` processes.
        self.service_seeds = {name: new_user_seed() for name in SERVICES}
        #: The seed of a production gateway's identity (``engram serve gateway``).
        self.service_seeds[GATEWAY] = new_user_seed()
        self.services: Identity | None = None
        #: ``engram up``'s gateway identity (in-process, like the services').
        self.gateway: Identity | None = None
        #: The users a deployment does not have (the observer, the per-service identities).
        self._extra = [NatsUser(self.observer.public_key, _EVERYTHING, "test observer")]
        self._extra += [
            NatsUser(
                public_key_of(seed),
                gateway_permissions() if name == GATEWAY else service_permissions(name),
                f"engram serve {name}",
            )
            for name, seed in self.service_seeds.items()
        ]

    async def start(self, timeout_s: float = 15.0) -> None:
        if self.services is None:
            run = self.identities.start_run(extra=self._extra)
            self.services, self.gateway = run.services, run.gateway
        await super().start(timeout_s)

    async def mint(self, name: str, org_id: UUID) -> Identity:
        """A new platform client, admitted once this returns (``engram credentials mint``)."""
        identity = self.identities.mint(name, org_id)
        await self._apply()
        return identity

    async def revoke(self, name: str) -> None:
        """Refuse a platform client: once this returns, its open connections are closed
        (``engram credentials revoke``)."""
        self.identities.revoke(name)
        await self._apply()

    async def _apply(self) -> None:
        self.identities.write_auth(self._extra)
        await self.reload()

    def log_lines(self, *needles: str) -> list[str]:
        """Lines of the server's log containing any of ``needles`` (e.g. "Violation")."""
        text = (self.store_dir / "nats-server.log").read_text(errors="replace")
        return [line for line in text.splitlines() if any(n in line for n in needles)]


@asynccontextmanager
async def secured_nats_server(root: Path) -> AsyncIterator[SecuredNatsServer]:
    server = SecuredNatsServer(root)
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
async def throwaway_database(
    admin_url: str | None, tmp_dir: Path, *, migrated: bool = True
) -> AsyncIterator[str]:
    """A new database, migrated unless ``migrated=False``, dropped afterwards; yields its URL."""
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
    if migrated:
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
