"""Fixtures: real NATS (the wheel's nats-server, fresh per module) and a real Postgres database
(fresh per test session), and Engram's services running against them in-process."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import nats
import pytest
from nats.aio.client import Client
from pydantic import SecretStr

from contracts.common import Principal
from services.runtime import running_services
from shared.auth import ALL_PERMISSIONS, TokenService
from shared.db.engine import Database
from shared.embedded.nats_server import NatsServerProcess
from shared.infra import Infra
from shared.settings import EngramSettings
from shared.testing.servers import nats_server, throwaway_database

TEST_KID = "test-key"
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
    async with nats_server(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(scope="session")
def tokens() -> TokenService:
    return TokenService({TEST_KID: TEST_SECRET})


@pytest.fixture(scope="module")
def settings(
    nats_proc: NatsServerProcess, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> EngramSettings:
    return EngramSettings(
        nats_url=nats_proc.url,
        database_url=database_url,
        # Qdrant Edge keeps its shard here; each module starts with an empty vector store.
        data_dir=tmp_path_factory.mktemp("data"),
        token_keys=SecretStr(f"{TEST_KID}={TEST_SECRET}"),
        max_deliver=3,
        redeliver_backoff_s=(0.2, 0.4),
        session_retention_s=3600,
        # The machine's Redis when it runs (CI starts it); without it the caches degrade to misses.
        redis_url="redis://127.0.0.1:6379/15",
        _env_file=None,  # type: ignore[call-arg]
    )


@pytest.fixture
async def nc(nats_proc: NatsServerProcess) -> AsyncIterator[Client]:
    """A raw nats-py client, as a platform team would use."""
    client = await nats.connect(nats_proc.url)
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
