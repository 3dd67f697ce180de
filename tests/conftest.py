"""Fixtures: real NATS (the wheel's nats-server, fresh per module, with authentication on as
``engram up`` runs it) and a real Postgres database (fresh per test session), and Engram's
services running against them in-process under their least-privilege NATS identity.

``nc`` is a platform client (its own nkey and inbox, the rights a tenant's runner has);
``observer_nc`` is the test's own eyes on internal streams and consumers, which no client may see."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import httpx
import nats
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from nats.aio.client import Client
from pydantic import SecretStr

from contracts.common import Principal
from services.runtime import running_services
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.nats_auth.store import Identity
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from tests.support.servers import SecuredNatsServer, secured_nats_server, throwaway_database

# Hypothesis's timing checks (a deadline per example, "input generation is slow") measure the
# machine, not the code: on a loaded 2-core machine they failed tests that pass idle.
hypothesis_settings.register_profile("engram", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("engram")

TEST_KID = "test-key"
#: The machine's Redis, one database for every test run on it: tests touch only their own keys
#: (organizations are fresh per test) and never FLUSHDB. Not db 15, which older test code flushed.
TEST_REDIS_URL = "redis://127.0.0.1:6379/14"
TEST_SECRET = secrets.token_urlsafe(48)


@pytest.fixture(scope="session")
async def database_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A migrated database for this test run (organizations keep tests apart inside it)."""
    admin = os.environ.get("ENGRAM_TEST_DATABASE_URL")
    async with throwaway_database(admin, tmp_path_factory.mktemp("pg")) as url:
        yield url


@pytest.fixture(scope="module")
async def nats_proc(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NatsServerProcess]:
    """A fresh nats-server per test module, so durable consumers never leak between modules."""
    async with secured_nats_server(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(scope="session")
def tokens() -> TokenService:
    return TokenService({TEST_KID: TEST_SECRET})


@pytest.fixture(scope="module")
def settings(
    nats_proc: NatsServerProcess, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> EngramSettings:
    services = nats_proc.services if isinstance(nats_proc, SecuredNatsServer) else None
    return EngramSettings(
        nats_url=nats_proc.url,
        nats_nkey_seed=SecretStr(services.seed if services is not None else ""),
        database_url=database_url,
        # Qdrant Edge keeps its shard here; each module starts with an empty vector store.
        data_dir=tmp_path_factory.mktemp("data"),
        token_keys=SecretStr(f"{TEST_KID}={TEST_SECRET}"),
        max_deliver=3,
        redeliver_backoff_s=(0.2, 0.4),
        session_retention_s=3600,
        # The machine's Redis when it runs (CI starts it); without it the caches degrade to misses.
        redis_url=TEST_REDIS_URL,
        # Fast and deterministic; the default (all-MiniLM-L6-v2) runs in tests/e2e, the parity test
        # and the tests that name it.
        embedder="hashing-384",
        _env_file=None,  # type: ignore[call-arg]
    )


def nats_options(identity: Identity | None) -> dict[str, Any]:
    """``nats.connect`` keyword arguments for ``identity`` (none on an open server)."""
    if identity is None:
        return {}
    return {"nkeys_seed_str": identity.seed, "inbox_prefix": identity.inbox_prefix}


async def connect_as(server: NatsServerProcess, identity: Identity | None) -> Client:
    return await nats.connect(server.url, **nats_options(identity))


@pytest.fixture
def platform_options(nats_proc: NatsServerProcess) -> dict[str, Any]:
    """The platform client's NATS identity, for ``EngramClient.connect(url, token, **options)``."""
    return nats_options(getattr(nats_proc, "client", None))


@pytest.fixture
async def nc(nats_proc: NatsServerProcess) -> AsyncIterator[Client]:
    """A raw nats-py client with a platform client's NATS identity, as a platform team would use."""
    client = await connect_as(nats_proc, getattr(nats_proc, "client", None))
    yield client
    await client.drain()


@pytest.fixture
async def observer_nc(nats_proc: NatsServerProcess) -> AsyncIterator[Client]:
    """The test's view of internal streams, consumers and events (no platform client has it)."""
    client = await connect_as(nats_proc, getattr(nats_proc, "observer", None))
    yield client
    await client.drain()


@pytest.fixture(scope="module")
async def engram(settings: EngramSettings) -> AsyncIterator[Infra]:
    """ingest, distill and governance-audit running in-process on this module's NATS."""
    async with running_services(settings) as infra:
        yield infra


@pytest.fixture
def org() -> UUID:
    """A fresh organization per test: tests share one database and never see each other."""
    return uuid4()


@pytest.fixture
def agent() -> UUID:
    return uuid4()


@pytest.fixture
def service_token(tokens: TokenService, org: UUID) -> str:
    """What a platform's agent runner holds: a service token with every permission."""
    return tokens.mint(
        org_id=org, principal=Principal(kind="service", id="runner"), permissions=ALL_PERMISSIONS
    )


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, pool_size=2)
    yield database
    await database.close()


@pytest.fixture(scope="module")
async def gateway(
    engram: Infra, settings: EngramSettings, nats_proc: NatsServerProcess
) -> AsyncIterator[str]:
    """The HTTP gateway in front of this module's services, under its own NATS identity (as in
    ``engram up``), on a free port; yields its base URL."""
    from services.gateway.server import running_gateway

    identity = getattr(nats_proc, "gateway", None)
    async with running_gateway(
        settings.model_copy(update={"http_port": 0}), identity.seed if identity is not None else ""
    ) as running:
        yield running.url


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the gateway (no token: each test sends the one it means)."""
    async with httpx.AsyncClient(base_url=gateway, timeout=30.0) as client:
        yield client
