"""Crashes mid-stream: kill -9 the distill worker, kill -9 NATS. Count lost and duplicated
effects — lessons, reinforcements, audit records, memory.written events — all must be zero."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO
from uuid import UUID

import nats
import pytest
from nats.aio.client import Client
from pydantic import SecretStr

from services.runtime import running_services
from shared.embedded.nats_server import NatsServerProcess, free_port
from shared.runtime.settings import EngramSettings
from shared.storage.db.engine import Database
from tests.conftest import TEST_KID, TEST_SECRET
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

REPO = Path(__file__).resolve().parents[2]
#: Short, so what a killed worker held un-acked comes back in seconds rather than a minute.
ACK_WAIT_S = 3.0
#: Kill once at least this many sessions are distilled (and, checked after, before all are).
KILL_AFTER = 10


def _settings(nats_url: str, database_url: str) -> EngramSettings:
    return EngramSettings(
        nats_url=nats_url,
        database_url=database_url,
        token_keys=SecretStr(f"{TEST_KID}={TEST_SECRET}"),
        max_deliver=3,
        redeliver_backoff_s=(0.2, 0.4),
        ack_wait_s=ACK_WAIT_S,
        data_dir=Path(tempfile.mkdtemp(prefix="engram-faults-")),
        embedder="hashing-384",
        _env_file=None,  # type: ignore[call-arg]
    )


class DistillWorker:
    """``engram serve distill`` as its own OS process, so it can be killed like a crashed pod."""

    def __init__(self, settings: EngramSettings, log_dir: Path) -> None:
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        self._env.update(
            ENGRAM_NATS_URL=settings.nats_url,
            ENGRAM_DATABASE_URL=settings.database_url,
            ENGRAM_TOKEN_KEYS=settings.token_keys.get_secret_value(),
            ENGRAM_MAX_DELIVER=str(settings.max_deliver),
            ENGRAM_REDELIVER_BACKOFF_S="[0.2, 0.4]",
            ENGRAM_ACK_WAIT_S=str(settings.ack_wait_s),
            ENGRAM_OTEL_EXPORTER="none",
        )
        self._log_dir = log_dir
        self._started = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self._started += 1
        self._log = (self._log_dir / f"distill-{self._started}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "serve", "distill"],
            cwd=REPO,
            env=self._env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill9(self) -> None:
        assert self.proc is not None
        assert self.proc.poll() is None, "distill worker died on its own"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()


@pytest.fixture
async def fresh_nats(tmp_path: Path) -> AsyncIterator[NatsServerProcess]:
    """A nats-server of this test's own: the distill durable is created by the worker under test."""
    async with nats_server(tmp_path / "nats") as server:
        yield server


async def _drained(nc: Client, durable: str) -> bool:
    info = await nc.jetstream().consumer_info("ENGRAM_SESSIONS", durable)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def _some_distilled(db: Database, org: UUID, what: str) -> int:
    """Wait until ``KILL_AFTER`` sessions are distilled; returns the count seen. The caller kills
    right after, with no await between: that count is what was distilled at the crash (counting
    again after the kill also counted batches the in-process services had fetched before it and
    finished on their own — 600 on a busy machine, as if the crash had come too late)."""
    deadline = time.monotonic() + 60
    while True:
        distilled = await audit_count(db, org, "distill.completed")
        if distilled >= KILL_AFTER:
            return distilled
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.02)


async def test_kill_9_distill_worker_mid_stream_loses_and_doubles_nothing(
    fresh_nats: NatsServerProcess,
    database_url: str,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
    tmp_path: Path,
) -> None:
    """kill -9 of the distill worker mid-backlog, then a new worker: every lesson exactly once."""
    settings = _settings(fresh_nats.url, database_url)
    payloads = sessions(org, agent, range(600))
    expected = expected_lessons(payloads)
    await raise_cap(db, org, agent)
    worker = DistillWorker(settings, tmp_path)
    nc = await nats.connect(fresh_nats.url)
    try:
        async with running_services(settings, ["ingest", "governance-audit"]):
            # Every session is validated before the worker starts, so the worker has a backlog of
            # 600 to distill in batches and this process has nothing else to do while it watches
            # for the kill: when publishing and ingest ran alongside, a busy machine starved this
            # watcher until every session was distilled, and the crash tested nothing.
            await publish_all(nc, payloads, service_token)

            async def validated() -> bool:
                return await _drained(nc, "ingest")

            await eventually(validated, timeout=120, what="ingest validated every session")
            worker.start()

            async def mid_batch() -> bool:
                """Some distilled, and sessions delivered to the worker that it has not committed:
                deliveries are read first, so the later count can only be higher — the batch is
                still uncommitted when the kill follows (a batch committed but maybe already
                acked, as ack-pending alone showed, left nothing to redeliver)."""
                try:
                    info = await nc.jetstream().consumer_info("ENGRAM_SESSIONS", "distill")
                except nats.js.errors.NotFoundError:  # the worker has not created it yet
                    return False
                distilled = await audit_count(db, org, "distill.completed")
                return distilled >= KILL_AFTER and info.delivered.consumer_seq > distilled

            await eventually(mid_batch, timeout=60, interval=0.02, what="the worker holding a batch")
            worker.kill9()
            at_kill = await audit_count(db, org, "distill.completed")
            assert KILL_AFTER <= at_kill < len(payloads), f"kill came too late to test anything ({at_kill})"

            worker.start()

            async def all_distilled() -> bool:
                return await audit_count(db, org, "distill.completed") >= len(payloads)

            await eventually(all_distilled, timeout=120, interval=0.2, what="every session distilled")

            async def drained() -> bool:
                return await _drained(nc, "distill")

            # Redeliveries of what the killed worker held must also have run (and been no-ops).
            await eventually(drained, timeout=60, what="distill consumer drained")
            info = await nc.jetstream().consumer_info("ENGRAM_SESSIONS", "distill")
            redelivered = info.delivered.consumer_seq - len(payloads)
            assert info.config.ack_wait == ACK_WAIT_S, "the durable was not created by the worker under test"
            worker.stop()
        await eventually(lambda: _empty_outbox(db), timeout=30, what="outbox published")

        result = await ledger(db, org, expected)
        events = await written_events(nc, org)
        event_ids = [e["event_id"] for e in events]
        print(
            f"\nkill -9 distill at {at_kill}/{len(payloads)} distilled, {redelivered} redelivered: "
            f"{result.summary()} "
            f"memory.written={len(events)} (unique {len(set(event_ids))})"
        )
        assert redelivered > 0, "the killed worker held nothing un-acked: the crash tested nothing"
        assert result.lost == [], "lessons lost"
        assert result.duplicated == [], "lessons stored twice"
        assert result.unexpected == []
        assert result.miscounted == [], "reinforcement counts off"
        assert result.completed == len(payloads), "distill.completed lost or doubled"
        assert result.chain_ok, result.chain_reason
        assert len(event_ids) == len(set(event_ids)), "memory.written published twice"
        assert len(events) == sum(expected.values()) == await saved_and_reinforced(db, org)
    finally:
        worker.stop()
        await nc.close()


async def _empty_outbox(db: Database) -> bool:
    return await outbox_size(db) == 0


async def test_nats_kill_9_and_restart_mid_stream_loses_and_doubles_nothing(
    database_url: str, db: Database, org: UUID, agent: UUID, service_token: str, tmp_path: Path
) -> None:
    """kill -9 of NATS mid-stream and a restart on the same store: all effects land exactly once."""
    store, port = tmp_path / "nats", free_port()
    server = NatsServerProcess(store, port=port)
    await server.start()
    settings = _settings(server.url, database_url)
    # distill takes up to 100 sessions per transaction: the first wave must outlast a few batches
    # and the watcher's first look: with 1,000 it saw as many as 930 done (distill's batches
    # commit in bursts; a watcher on a thread of its own saw the same).
    first = sessions(org, agent, range(3000))
    second = sessions(org, agent, range(3000, 3100))
    expected = expected_lessons(first + second)
    await raise_cap(db, org, agent)
    nc = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        async with running_services(settings):
            # Publishing goes on across the crash (publish_all retries the same sessions).
            publishing = asyncio.create_task(publish_all(nc, first, service_token))
            at_kill = await _some_distilled(db, org, "some sessions distilled before the crash")
            server.kill()
            assert KILL_AFTER <= at_kill < len(first), f"kill came too late to test anything ({at_kill})"
            await asyncio.sleep(1.0)  # everyone notices the outage
            server = NatsServerProcess(store, port=port)
            await server.start()

            async def reconnected() -> bool:
                return nc.is_connected

            await eventually(reconnected, timeout=30, what="the platform's client reconnected")
            await publishing
            await publish_all(nc, second, service_token)

            async def all_distilled() -> bool:
                return await audit_count(db, org, "distill.completed") >= len(first) + len(second)

            await eventually(all_distilled, timeout=120, interval=0.2, what="every session distilled")

            async def drained() -> bool:
                return await _drained(nc, "ingest") and await _drained(nc, "distill")

            await eventually(drained, timeout=60, what="consumers drained")
            await eventually(lambda: _empty_outbox(db), timeout=30, what="outbox published")

            result = await ledger(db, org, expected)
            events = await written_events(nc, org)
        event_ids = [e["event_id"] for e in events]
        print(
            f"\nkill -9 NATS at {at_kill}/{len(first)} distilled: {result.summary()} "
            f"memory.written={len(events)} (unique {len(set(event_ids))})"
        )
        assert result.lost == [], "lessons lost"
        assert result.duplicated == [], "lessons stored twice"
        assert result.unexpected == []
        assert result.miscounted == [], "reinforcement counts off"
        assert result.completed == len(first) + len(second), "distill.completed lost or doubled"
        assert result.chain_ok, result.chain_reason
        assert len(event_ids) == len(set(event_ids)), "memory.written published twice"
        assert len(events) == sum(expected.values()) == await saved_and_reinforced(db, org)
    finally:
        await nc.close()
        await server.stop()
