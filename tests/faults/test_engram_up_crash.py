"""A machine crash under ``engram up``: the whole process group and its Postgres SIGKILLed
mid-batch, then ``engram up`` again on the same data dir. Every session is processed exactly once
(counted in Postgres), the backlog drains within a bound, and a stale ``postmaster.pid`` — a dead
PID, or one now belonging to another process — never stops the restart.

The drain bound: what a killed worker held un-acked is redelivered ``ENGRAM_ACK_WAIT_S`` (10 s)
after its delivery, which was before the crash, so a restart drains within seconds of being
ready. With the old 60 s ack_wait the same scenario drained ~56 s after the last publish; the
bound below (45 s from ready) fails that and leaves a loaded machine plenty of room. Set
``ENGRAM_CRASH_ACK_WAIT_S=60`` to measure the old behaviour (the bound is then not asserted).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any
from uuid import UUID

import nats
import pytest
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from contracts.connection import ConnectionInfo
from shared.storage.db.engine import Database
from tests.engram_up import EngramUp, alive, postmaster_pid, stack_dir
from tests.faults.workload import (
    audit_count,
    expected_lessons,
    ledger,
    outbox_size,
    publish_all,
    raise_cap,
    saved_and_reinforced,
    sessions,
)
from tests.platform import eventually

pytestmark = [
    pytest.mark.faults,
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="process checks read /proc"),
]

SESSIONS = 600
KILL_AFTER = 10
#: From the restarted stack being ready to every consumer drained (see the module docstring).
DRAIN_BOUND_S = 45.0
DURABLES = ("ingest", "distill", "embed")
MEASURE_ACK_WAIT = os.environ.get("ENGRAM_CRASH_ACK_WAIT_S", "")


def _env() -> dict[str, str]:
    env = {"ENGRAM_EMBEDDER": "hashing-384"}
    if MEASURE_ACK_WAIT:
        env["ENGRAM_ACK_WAIT_S"] = MEASURE_ACK_WAIT
    return env


def _scrape(url: str) -> dict[tuple[str, str], float]:
    """The consumer gauges of an ``engram up``'s /metrics: (metric, durable) → value."""
    with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 (http, the stack under test)
        text = reply.read().decode()
    return {
        (s.name, s.labels.get("consumer_name", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Stack:
    """The clients of one ``engram up`` run: NATS as the development client, its database."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.connection = ConnectionInfo.model_validate(info)
        self.db = Database(info["database_url"])
        self.nc: Client | None = None

    async def connect(self) -> Client:
        self.nc = await nats.connect(self.connection.nats_url, **self.connection.nats_options())
        return self.nc

    async def drained(self) -> bool:
        gauges = await asyncio.to_thread(_scrape, self.info["metrics_url"])
        return all(
            gauges.get((metric, durable)) == 0
            for durable in DURABLES
            for metric in (
                "engram_jetstream_consumer_num_pending",
                "engram_jetstream_consumer_num_ack_pending",
            )
        )

    async def abandon(self) -> None:
        """After a crash: drop the clients without waiting for the servers that are gone."""
        if self.nc is not None:
            await asyncio.wait_for(self.nc.close(), 5)
        await self.db.close()

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.drain()
        await self.db.close()


async def test_sigkill_of_engram_up_mid_batch_then_restart_processes_every_session_once() -> None:
    """SIGKILL of `engram up` (process group and Postgres) mid-batch, restart on the same data dir:
    every session distilled exactly once, lessons neither lost nor doubled, drained in bound."""
    with stack_dir() as data_dir:
        with EngramUp(data_dir, data_dir / "up-1.log", env=_env()) as first:
            before = Stack(await first.connection())
            org, agent = UUID(before.info["org_id"]), UUID(before.info["agent_config_id"])
            payloads = sessions(org, agent, range(SESSIONS))
            expected = expected_lessons(payloads)
            await raise_cap(before.db, org, agent)
            nc = await before.connect()

            # Published while the stack distills, one at a time, the distilled count read between
            # publishes: the kill comes once KILL_AFTER are distilled, mid-stream. (Publishing
            # first let distill finish all 600 by the kill; a watcher polling beside 600
            # concurrent publishes was starved on a loaded run and first saw 600/600.)
            async def some_distilled() -> bool:
                return await audit_count(before.db, org, "distill.completed") >= KILL_AFTER

            for payload in payloads:
                await publish_all(nc, [payload], before.connection.token)
                if await some_distilled():
                    break
            await eventually(some_distilled, timeout=120, interval=0.02, what="some sessions distilled")
            at_kill = await audit_count(before.db, org, "distill.completed")
            postmaster = postmaster_pid(data_dir)
            first.kill()  # SIGKILL: the process group, and Postgres (its own session)
            killed = time.monotonic()
            await before.abandon()
        assert at_kill < SESSIONS, f"kill came too late to test anything ({at_kill}/{SESSIONS})"
        assert postmaster is not None

        async def postmaster_gone() -> bool:  # SIGKILL is delivered, not necessarily done yet
            return not alive(postmaster)

        await eventually(postmaster_gone, timeout=30, what="the SIGKILLed postmaster gone")
        assert postmaster_pid(data_dir) == postmaster, "a SIGKILLed Postgres leaves its postmaster.pid"

        # The crash left the first run's connection.json; the restart rewrites it once ready.
        (data_dir / "connection.json").unlink()
        with EngramUp(data_dir, data_dir / "up-2.log", env=_env()) as second:
            restarted = time.monotonic()
            after = Stack(await second.connection())
            ready = time.monotonic()
            try:
                # Unsure what reached the stack before the crash, the platform publishes every
                # session again with the same ids: what was stored already must be a no-op.
                await publish_all(await after.connect(), payloads, after.connection.token)
                published = time.monotonic()

                async def drained() -> bool:
                    return (
                        await audit_count(after.db, org, "distill.completed") >= SESSIONS
                        and await after.drained()
                    )

                await eventually(drained, timeout=300, interval=0.1, what="the backlog drained after restart")
                done = time.monotonic()

                async def published_all() -> bool:
                    return await outbox_size(after.db) == 0

                await eventually(published_all, timeout=60, what="outbox published")
                result = await ledger(after.db, org, expected)
                saved = await saved_and_reinforced(after.db, org)
            finally:
                await after.close()
        log = (data_dir / "up-2.log").read_text(errors="replace")
    print(
        f"\nSIGKILL at {at_kill}/{SESSIONS} distilled; "
        f"restart→ready {ready - restarted:.1f} s, ready→drained {done - ready:.1f} s, "
        f"restart→drained {done - restarted:.1f} s, kill→drained {done - killed:.1f} s, "
        f"last publish→drained {done - published:.1f} s; {result.summary()}"
    )
    # The restart itself is clean (the stale postmaster.pid was recognised; no CalledProcessError).
    # A batch that fails later while the backlog drains is retried by design; the ledger below
    # is what must hold.
    started_up = log.split("Engram is up", 1)[0]
    assert "Engram is up" in log, log
    assert "Traceback" not in started_up, started_up
    errors = [line for line in log.splitlines() if "Error" in line and "[parameters" not in line]
    print(f"errors logged after the restart (retried): {errors[:5]}")
    assert result.lost == [], "lessons lost"
    assert result.duplicated == [], "lessons stored twice"
    assert result.unexpected == []
    assert result.miscounted == [], "reinforcement counts off"
    assert result.completed == SESSIONS, "distill.completed lost or doubled"
    assert result.chain_ok, result.chain_reason
    assert saved == sum(expected.values()), "memory.saved counts lost or doubled"
    if not MEASURE_ACK_WAIT:
        assert done - ready < DRAIN_BOUND_S, f"drained {done - ready:.1f} s after the restart was ready"


def _stale_pid_file(data_dir: Path, template: str, pid: int) -> None:
    lines = template.splitlines()
    lines[0] = str(pid)
    (data_dir / "postgres" / "postmaster.pid").write_text("\n".join(lines) + "\n")


async def _up_and_down(data_dir: Path, log_name: str) -> str:
    """Start `engram up` on ``data_dir``, wait until ready, stop it with SIGTERM; its output."""
    with EngramUp(data_dir, data_dir / log_name, env=_env()) as up:
        await up.connection()
        assert await up.stop() == 0
        return up.output()


async def test_engram_up_starts_over_a_stale_postmaster_pid() -> None:
    """A postmaster.pid naming a dead PID, or a live process that is not this data dir's Postgres
    (after a reboot), is recognised as stale: `engram up` starts anyway and says what it removed."""
    with stack_dir() as data_dir:
        with EngramUp(data_dir, data_dir / "up-0.log", env=_env()) as up:
            await up.connection()
            template = (data_dir / "postgres" / "postmaster.pid").read_text()
            assert await up.stop() == 0
        foreign = subprocess.Popen(["sleep", "300"])
        try:
            _stale_pid_file(data_dir, template, foreign.pid)
            out = await _up_and_down(data_dir, "up-foreign.log")
            assert "stale" in out, out
            assert foreign.poll() is None, "the foreign process was touched"
        finally:
            foreign.kill()
            foreign.wait()
        dead = subprocess.Popen(["true"])
        dead.wait()
        _stale_pid_file(data_dir, template, dead.pid)
        out = await _up_and_down(data_dir, "up-dead.log")
        assert "stale" in out, out


async def test_engram_up_says_in_one_line_when_postgres_processes_hold_the_data_dir(tmp_path: Path) -> None:
    """A Postgres process still working in the data dir without its postmaster (which could corrupt
    the data if a new server started beside it): `engram up` exits 1 with one line saying what to
    do, no traceback."""
    with stack_dir() as data_dir:
        pgdata = data_dir / "postgres"
        pgdata.mkdir()
        (pgdata / "postmaster.pid").write_text("999999\n")
        fake = tmp_path / "postgres"  # a process named postgres, working in the data dir
        shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
        backend = subprocess.Popen([str(fake), "300"], cwd=pgdata)
        try:
            with EngramUp(data_dir, data_dir / "up.log", env=_env()) as up:
                assert up.proc is not None
                code = await asyncio.to_thread(up.proc.wait, 120)
                out = up.output()
        finally:
            backend.kill()
            backend.wait()
    assert code == 1, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if "engram up:" in line]
    assert len(lines) == 1, out
    assert re.search(rf"\({backend.pid}\).*kill {backend.pid}", lines[0]), lines[0]
