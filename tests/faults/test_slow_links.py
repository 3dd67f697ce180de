"""Slow, lossy links (issue 25 §3): every byte between Engram's services and Postgres, and
between the services (and the platform) and NATS, goes through a userspace proxy that delays it
and cuts connections at random — plus one cut of every connection at once mid-stream. Counts
lost and duplicated effects (must be zero) and the platform's failed publishes while the links
are bad and after they heal (none after)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import nats
import pytest
from nats.aio.client import Client
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from services.runtime import running_services
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings
from shared.storage.db.engine import Database
from tests.conftest import TEST_KID, TEST_SECRET
from tests.faults.proxy import SlowLink
from tests.faults.workload import (
    audit_count,
    expected_lessons,
    ledger,
    outbox_size,
    publish_all,
    raise_cap,
    saved_and_reinforced,
    sessions,
    written_events,
)
from tests.platform import eventually
from tests.support.servers import nats_server

pytestmark = [pytest.mark.faults, pytest.mark.integration]

#: Added to every chunk each way (a round trip costs twice this), while the links are bad.
LATENCY_S = 0.005
#: Chance that a forwarded chunk is the last its connection carries.
RESET_RATE = 0.002
#: Cut every connection once at least this many sessions are distilled.
CUT_AFTER = 10


@pytest.fixture
async def fresh_nats(tmp_path: Path) -> AsyncIterator[NatsServerProcess]:
    async with nats_server(tmp_path / "nats") as server:
        yield server


def _settings(nats_url: str, database_url: str) -> EngramSettings:
    return EngramSettings(
        nats_url=nats_url,
        database_url=database_url,
        token_keys=SecretStr(f"{TEST_KID}={TEST_SECRET}"),
        max_deliver=20,  # a message may meet several cut connections; it must not dead-letter
        redeliver_backoff_s=(0.2, 0.4),
        ack_wait_s=3.0,
        data_dir=Path(tempfile.mkdtemp(prefix="engram-slow-links-")),
        embedder="hashing-384",
        _env_file=None,  # type: ignore[call-arg]
    )


async def _drained(nc: Client, durable: str) -> bool:
    info = await nc.jetstream().consumer_info("ENGRAM_SESSIONS", durable)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def test_slow_lossy_links_to_postgres_and_nats_lose_and_double_nothing(
    fresh_nats: NatsServerProcess,
    database_url: str,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    pg = make_url(database_url)
    bad = sessions(org, agent, range(200))
    healed = sessions(org, agent, range(200, 250))
    expected = expected_lessons(bad + healed)
    await raise_cap(db, org, agent)
    bad_link = {"latency_s": LATENCY_S, "reset_rate": RESET_RATE}
    async with (
        SlowLink(pg.host or "127.0.0.1", pg.port or 5432, **bad_link) as pg_link,
        SlowLink("127.0.0.1", fresh_nats.port, **bad_link, seed=26) as nats_link,
    ):
        proxied_db = pg.set(host="127.0.0.1", port=pg_link.port).render_as_string(hide_password=False)
        settings = _settings(f"nats://127.0.0.1:{nats_link.port}", proxied_db)
        # The platform publishes over the bad link too; the test's own eyes (db, observer) do not.
        nc = await nats.connect(settings.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        observer = await nats.connect(fresh_nats.url)
        try:
            async with running_services(settings):
                # Publishing goes on across the cut (publish_all retries what failed).
                publishing = asyncio.create_task(publish_all(nc, bad, service_token))

                async def some_distilled() -> bool:
                    return await audit_count(db, org, "distill.completed") >= CUT_AFTER

                await eventually(some_distilled, timeout=120, interval=0.05, what="some sessions distilled")
                cut = pg_link.cut_all() + nats_link.cut_all()
                assert cut > 0, "no connection was open to cut"
                failed_during = await publishing

                async def distilled(n: int) -> bool:
                    return await audit_count(db, org, "distill.completed") >= n

                await eventually(
                    lambda: distilled(len(bad)), timeout=180, interval=0.2, what="every session distilled"
                )
                pg_link.heal()
                nats_link.heal()
                failed_after = await publish_all(nc, healed, service_token)
                await eventually(
                    lambda: distilled(len(bad) + len(healed)),
                    timeout=120,
                    interval=0.2,
                    what="the healed link's sessions distilled",
                )

                async def drained() -> bool:
                    return await _drained(observer, "ingest") and await _drained(observer, "distill")

                await eventually(drained, timeout=60, what="consumers drained")

                async def empty_outbox() -> bool:
                    return await outbox_size(db) == 0

                await eventually(empty_outbox, timeout=60, what="outbox published")
            result = await ledger(db, org, expected)
            events = await written_events(observer, org)
        finally:
            await nc.close()
            await observer.close()
    event_ids = [e["event_id"] for e in events]
    duplicated = len(result.duplicated) + len(event_ids) - len(set(event_ids))
    print(
        f"\nFAULT netem: latency_ms={LATENCY_S * 1000:g} reset_rate={RESET_RATE} "
        f"pg_resets={pg_link.stats.resets} nats_resets={nats_link.stats.resets} "
        f"pg_connections={pg_link.stats.connections} nats_connections={nats_link.stats.connections} "
        f"failed_during={failed_during} failed_after={failed_after} "
        f"lost={len(result.lost)} duplicated={duplicated}"
    )
    print(f"slow links: {result.summary()} memory.written={len(events)} (unique {len(set(event_ids))})")
    assert pg_link.stats.resets > 0, "the Postgres link was never cut: nothing tested"
    assert nats_link.stats.resets > 0, "the NATS link was never cut: nothing tested"
    assert result.lost == [], "lessons lost"
    assert result.duplicated == [], "lessons stored twice"
    assert result.unexpected == []
    assert result.miscounted == [], "reinforcement counts off"
    assert result.completed == len(bad) + len(healed), "distill.completed lost or doubled"
    assert result.chain_ok, result.chain_reason
    assert len(event_ids) == len(set(event_ids)), "memory.written published twice"
    assert len(events) == sum(expected.values()) == await saved_and_reinforced(db, org)
    assert failed_after == 0, "publishes failed after the links healed"
