"""The cluster fault scenario: the deployment of ``harness.py`` under the workload of
``workload.py``, one fault per phase, everything counted.

Part of the workload goes through the two HTTP gateway replicas (recalls, every few sessions), with
failover between them on the client's side, counted apart in the table.

Faults, in order, each while the workload runs: SIGKILL the node leading ``ENGRAM_SESSIONS`` (and
restart it), SIGKILL one replica of each service in turn (restarted as an orchestrator would), a
rolling restart of every process by SIGTERM, a Postgres restart, Redis stopped (and started).
With ``ENGRAM_CLUSTER_UPGRADE=1``, a rolling upgrade after the rolling restart: one replica of
each service on the previous release beside the current code, then all current again (opt-in: its
one run so far lost and doubled nothing but left requests failing after recovery; see
docs/benchmarks.md).

``python -m tests.cluster.scenario [--long] [--out bench-results/cluster.json]`` runs it alone and
prints the table; ``tests/cluster/test_cluster.py`` runs the short form and asserts the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import nats
from nats.aio.client import Client
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from contracts.common import Principal
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.nats_auth.permissions import GATEWAY
from shared.storage.db.engine import Database
from shared.storage.db.models import MemoryEntry
from shared.text.policy import normalize
from tests.cluster.harness import (
    PLATFORM_INBOX,
    READINESS_LOOK_S,
    Cluster,
    ServiceProcess,
    running_cluster,
)
from tests.cluster.recovery import Recovery
from tests.cluster.workload import RECALLS, Purge, Workload, session_for, tag, victim
from tests.faults.workload import (
    audit_count,
    expected_lessons,
    outbox_size,
    raise_cap,
    saved_and_reinforced,
    written_events,
)
from tests.platform import until_nothing_missing
from tests.support.previous_release import PREVIOUS, checkout

#: The share of its time the one recall process (embed and recall together: a Qdrant Edge store is
#: one process's) may spend on the workload's recalls; the rest is headroom for its embedding and
#: for the backlog a fault leaves.
RECALL_BUSY_SHARE = 0.5
#: The workload never runs below this share of its nominal rates (every phase sees requests over
#: every transport).
MIN_INTENSITY = 0.1
#: The bound on each fault's recovery (every condition of ``Recovery.missing``).
RECOVERY_TIMEOUT_S = 240.0
#: What a look at the deployment may raise while the part it reads recovers (a consumer info
#: request while a stream elects its leader, a query while Postgres restarts): "not yet".
TRANSIENT = (OSError, TimeoutError, nats.errors.Error, DBAPIError)


@dataclass(frozen=True)
class Pace:
    """How hard and how long: sessions/s, recalls/s, governance requests/s, and the seconds of
    steady workload before each fault and after each recovery; over the HTTP gateways, recalls/s
    and every n-th session."""

    session_rate: float
    recall_rate: float
    governance_rate: float
    steady_s: float
    http_recall_rate: float
    http_session_every: int


SHORT = Pace(
    session_rate=5, recall_rate=4, governance_rate=1, steady_s=6, http_recall_rate=2, http_session_every=3
)
LONG = Pace(
    session_rate=10, recall_rate=6, governance_rate=2, steady_s=20, http_recall_rate=3, http_session_every=3
)


@dataclass
class FaultRow:
    """One line of the fault table."""

    fault: str
    phase: int
    sessions: int = 0
    #: Requests (over NATS and HTTP) issued during the fault, and how many failed.
    requests: int = 0
    failed_during: int = 0
    #: First to last failed request of the fault (0 when none failed).
    outage_s: float = 0.0
    recover_s: float = 0.0
    failed_after_recovery: int = 0
    lost: int = 0
    duplicated: int = 0
    miscounted: int = 0
    #: Deliveries beyond one per session on ingest's and distill's consumers during the phase.
    redelivered: int = 0
    #: Session publishes retried during the phase (unacknowledged, then sent again, same msg id).
    publish_retries: int = 0
    #: First to last unacknowledged publish attempt during the fault (0 when none).
    publish_outage_s: float = 0.0
    purged_left: int = 0
    #: The HTTP share of ``requests``/``failed_during``/``failed_after_recovery`` (recalls and
    #: session publishes through the gateways), and the requests sent on to the other replica.
    http_requests: int = 0
    http_failed_during: int = 0
    http_failed_after: int = 0
    http_failovers: int = 0
    #: The share of the nominal rates the workload ran at (``fit_intensity``).
    intensity: float = 1.0
    note: str = ""
    errors: dict[str, int] = field(default_factory=dict)
    errors_after: dict[str, int] = field(default_factory=dict)


@dataclass
class Report:
    pace: dict[str, float]
    rows: list[FaultRow]
    sessions: int = 0
    lessons: int = 0
    memory_written: int = 0
    memory_written_unique: int = 0
    saved_and_reinforced: int = 0
    distill_completed: int = 0
    audit_chain_ok: bool = False
    publish_retries: int = 0
    http_requests: int = 0
    http_failovers: int = 0
    duration_s: float = 0.0
    load_average: list[float] = field(default_factory=list)

    def ok(self) -> bool:
        return (
            all(
                r.lost == r.duplicated == r.miscounted == r.purged_left == r.failed_after_recovery == 0
                for r in self.rows
            )
            and self.memory_written == self.memory_written_unique == self.saved_and_reinforced
            and self.distill_completed == self.sessions
            and self.audit_chain_ok
        )

    def table(self) -> str:
        head = (
            f"{'fault':<24} {'sessions':>8} {'requests':>8} {'failed':>6} {'outage s':>8} {'recover s':>9} "
            f"{'after':>5} {'lost':>4} {'dup':>3} {'miscount':>8} {'redeliv':>7} {'retries':>7} "
            f"{'pub outage s':>12} {'purged left':>11} {'http':>5} {'http fail':>9} {'http after':>10} "
            f"{'failover':>8} {'pace':>5}"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            lines.append(
                f"{r.fault:<24} {r.sessions:>8} {r.requests:>8} {r.failed_during:>6} {r.outage_s:>8.1f} "
                f"{r.recover_s:>9.1f} {r.failed_after_recovery:>5} {r.lost:>4} {r.duplicated:>3} "
                f"{r.miscounted:>8} {r.redelivered:>7} {r.publish_retries:>7} "
                f"{r.publish_outage_s:>12.1f} {r.purged_left:>11} {r.http_requests:>5} "
                f"{r.http_failed_during:>9} {r.http_failed_after:>10} {r.http_failovers:>8} "
                f"{r.intensity:>5.2f}"
            )
        lines.append(
            f"sessions {self.sessions}, lessons {self.lessons}, memory.written {self.memory_written} "
            f"(unique {self.memory_written_unique}; saved+reinforced {self.saved_and_reinforced}), "
            f"distill.completed {self.distill_completed}, audit chain ok {self.audit_chain_ok}, "
            f"publish retries {self.publish_retries}, HTTP requests {self.http_requests} "
            f"(failovers {self.http_failovers}), {self.duration_s:.0f} s, load {self.load_average}"
        )
        return "\n".join(lines)


#: Whether the fault sequence includes the rolling upgrade to the previous release and back.
UPGRADE = os.environ.get("ENGRAM_CLUSTER_UPGRADE") == "1"


class Scenario:
    def __init__(self, cluster: Cluster, pace: Pace, previous: Path | str = "not checked out") -> None:
        self.cluster = cluster
        self.pace = pace
        #: The previous release's tree for the rolling upgrade, or why there is none.
        self.previous = previous
        self.org, self.agent = uuid4(), uuid4()
        keys = dict([cluster.token_keys.split("=", 1)])
        self.token = TokenService(keys).mint(
            org_id=self.org, principal=Principal(kind="service", id="runner"), permissions=ALL_PERMISSIONS
        )
        self.db = Database(cluster.database_url, pool_size=2)
        self.rows: list[FaultRow] = []
        self.victims: dict[int, list[dict[str, Any]]] = {}
        self.nc: Client
        self.observer: Client
        self.work: Workload
        self.recovery: Recovery

    # -- conditions ---------------------------------------------------------------------------

    async def _restored(self, since: float) -> None:
        """Until the deployment serves again after the fault at ``since`` (``Recovery.missing``)."""
        await until_nothing_missing(
            lambda: self.recovery.missing(since),
            what="the deployment serving again",
            timeout=RECOVERY_TIMEOUT_S,
            interval=READINESS_LOOK_S,
            transient=TRANSIENT,
        )

    async def _recall_answers(self, since: float, without: str) -> None:
        """Until a recall issued after ``since`` is answered over NATS (``without`` a part)."""

        async def missing() -> list[str]:
            return self.recovery.requests_missing(since, "recall")

        await until_nothing_missing(
            missing, what=f"recall answering without {without}", timeout=RECOVERY_TIMEOUT_S
        )

    async def _owner_rows(self, owner: dict[str, str]) -> int:
        key = f"{owner['kind']}:{owner['id']}"
        async with self.db.read() as s:
            query = (
                select(func.count())
                .select_from(MemoryEntry)
                .where(
                    MemoryEntry.org_id == self.org,  # type: ignore[arg-type]
                    MemoryEntry.owner_key == key,  # type: ignore[arg-type]
                )
            )
            return int((await s.execute(query)).scalar_one())

    async def _deliveries(self) -> int:
        js = self.observer.jetstream()
        total = 0
        for durable in ("ingest", "distill"):
            info = await js.consumer_info("ENGRAM_SESSIONS", durable)
            total += info.delivered.consumer_seq or 0
        return total

    # -- one phase ----------------------------------------------------------------------------

    async def phase(
        self,
        name: str,
        inject: Callable[[], Awaitable[str]],
        repair: Callable[[], Awaitable[str]],
    ) -> None:
        """Steady workload, a victim's memory to purge, the fault, the repair, steady again."""
        number = len(self.rows) + 1
        row = FaultRow(name, number)
        self.work.phase = number
        start = time.monotonic()
        acked_before = sum(len(v) for v in self.work.acked.values())
        retries_before = self.work.publish_retries
        failovers_before = self.work.http_failovers
        deliveries_before = await self._deliveries()
        # The victim's sessions, distilled before the fault; their memory is purged during it.
        owner = victim(number)
        sessions = [
            session_for(self.org, self.agent, 10_000 + number * 10 + k, number, owner) for k in range(3)
        ]
        self.victims[number] = sessions
        await asyncio.gather(*(self.work.publish(p, -number) for p in sessions))
        want = len(expected_lessons(sessions))

        async def victim_unstored() -> list[str]:
            stored = await self._owner_rows(owner)
            return [] if stored >= want else [f"{stored} of {want} lessons of {owner['id']} stored"]

        await until_nothing_missing(
            victim_unstored, what=f"{name}: the victim's lessons stored", timeout=RECOVERY_TIMEOUT_S
        )
        await _steady(start, self.pace.steady_s)
        recalls = [o.seconds for o in self.work.outcomes if o.at >= start and o.kind in RECALLS]
        self.work.intensity = row.intensity = fit_intensity(recalls, self.work.recalls_per_s)

        t_fault = time.monotonic()
        notes = [await inject()]
        purge = Purge(self.nc, self.token, self.agent, owner)
        purging = self.work.spawn(purge.until_receipt())
        notes.append(await repair())
        await self._restored(t_fault)

        async def unpurged() -> list[str]:
            return [] if purging.done() else [purge.status()]

        await until_nothing_missing(unpurged, what=f"{name}: the victim's purge", timeout=RECOVERY_TIMEOUT_S)
        await purging  # its error, if it failed
        t_rec = time.monotonic()
        await _steady(t_rec, self.pace.steady_s)
        end = time.monotonic()

        failed = self.work.failures(t_fault, t_rec)
        row.requests = self.work.count(t_fault, t_rec)
        row.failed_during = len(failed)
        row.outage_s = (max(o.at for o in failed) - min(o.at for o in failed)) if failed else 0.0
        row.recover_s = t_rec - t_fault
        after = self.work.failures(t_rec, end)
        row.failed_after_recovery = len(after)
        row.http_requests = self.work.count(t_fault, t_rec, http=True)
        row.http_failed_during = len(self.work.failures(t_fault, t_rec, http=True))
        row.http_failed_after = len(self.work.failures(t_rec, end, http=True))
        row.http_failovers = self.work.http_failovers - failovers_before
        row.errors_after = dict(Counter(f"{o.kind}:{o.error}" for o in after))
        row.errors = dict(Counter(f"{o.kind}:{o.error}" for o in failed))
        row.note = "; ".join(n for n in notes if n)
        acked_after = sum(len(v) for v in self.work.acked.values())
        row.publish_retries = self.work.publish_retries - retries_before
        unacked = [p.at for p in self.work.publishes if not p.ok and t_fault <= p.at < t_rec]
        row.publish_outage_s = (max(unacked) - min(unacked)) if unacked else 0.0
        row.redelivered = max(
            0, (await self._deliveries() - deliveries_before) - 2 * (acked_after - acked_before)
        )
        self.rows.append(row)
        print(
            f"  {name}: recovered in {row.recover_s:.1f}s, {row.failed_during} failed, {row.note}", flush=True
        )

    # -- the faults ---------------------------------------------------------------------------

    async def run(self) -> Report:
        started = time.monotonic()
        cluster = self.cluster
        self.nc = await nats.connect(**cluster.nats_options(cluster.identities.platform, PLATFORM_INBOX))
        self.observer = await nats.connect(
            **cluster.nats_options(cluster.identities.observer, "_INBOX_observer")
        )
        await raise_cap(self.db, self.org, self.agent)
        pace = self.pace
        self.work = Workload(
            self.nc,
            self.token,
            self.org,
            self.agent,
            pace.session_rate,
            pace.recall_rate,
            pace.governance_rate,
            gateways=[f"http://127.0.0.1:{p.health_port}" for p in cluster.of((GATEWAY,))],
            http_recall_rate=pace.http_recall_rate,
            http_session_every=pace.http_session_every,
        )
        self.recovery = Recovery(cluster, self.work, self.db, self.org)
        self.work.start()
        try:
            await self._faults()
        finally:
            await self.work.stop()
        return await self._report(started)

    async def _faults(self) -> None:
        cluster = self.cluster
        node = None

        async def kill_leader() -> str:
            nonlocal node
            leader = cluster.nats.stream_leader("ENGRAM_SESSIONS")
            assert leader is not None, "ENGRAM_SESSIONS has no leader"
            node = cluster.nats.node(leader)
            node.kill()
            since = time.monotonic()
            await self._recall_answers(since, without=f"NATS node {leader}")
            return f"killed {leader}; served again without it after {time.monotonic() - since:.1f}s"

        async def restart_node() -> str:
            assert node is not None
            await cluster.nats.restart(node)
            return f"{node.name} rejoined"

        await self.phase("nats-leader-kill", kill_leader, restart_node)

        for names in [("ingest",), ("distill",), ("governance-audit",), ("embed", "recall"), ("gateway",)]:
            victim_process = cluster.of(names)[0]
            await self.phase(
                f"kill-9 {victim_process.label}", _kill(victim_process), _restart(victim_process)
            )

        async def nothing() -> str:
            return ""

        async def rolling() -> str:
            codes = []
            for process in cluster.processes:
                codes.append(await process.terminate())
                process.start()
                await process.wait_ready()
            assert codes == [0] * len(codes), f"a SIGTERM'd process did not exit 0: {codes}"
            return f"{len(codes)} processes, exit codes {sorted(set(codes))}"

        await self.phase("rolling-restart", nothing, rolling)

        # A rolling upgrade: one replica of each service (and one gateway) runs the previous
        # release beside the current code under the workload, then every process the current one.
        # (The cluster starts on the current code: its schema is migrated; a rolling upgrade runs
        # the old code on the new schema just the same, while the replicas are replaced.)
        if UPGRADE and isinstance(self.previous, Path):
            previous = self.previous

            async def to_previous() -> str:
                replaced = []
                for names in [
                    ("ingest",),
                    ("distill",),
                    ("governance-audit",),
                    ("embed", "recall"),
                    ("gateway",),
                ]:
                    process = cluster.of(names)[0]
                    await process.terminate()
                    process.start(previous)
                    await process.wait_ready()
                    replaced.append(process.label)
                return f"{', '.join(replaced)} on {PREVIOUS}"

            async def to_current() -> str:
                upgraded = [p for p in cluster.processes if p.release == "previous"]
                for process in upgraded:
                    await process.terminate()
                    process.start()
                    await process.wait_ready()
                return f"{len(upgraded)} processes upgraded"

            await self.phase("upgrade", to_previous, to_current)
        elif UPGRADE:
            print(f"no rolling upgrade: {self.previous}")

        async def restart_postgres() -> str:
            await cluster.postgres.restart()
            # The harness's own pool (not the system under test) drops its dead connections.
            await self.db.engine.dispose()
            return "pg_ctl restart -m fast"

        await self.phase("postgres-restart", restart_postgres, nothing)

        async def stop_redis() -> str:
            cluster.redis.stop()
            since = time.monotonic()
            # The caches degrade to misses: recall keeps answering while Redis is gone.
            await self._recall_answers(since, without="Redis")
            return ""

        async def start_redis() -> str:
            await cluster.redis.start()
            return "stopped, then started empty"

        await self.phase("redis-stop", stop_redis, start_redis)

    # -- the counts ---------------------------------------------------------------------------

    async def _report(self, started: float) -> Report:
        total = sum(len(v) for v in self.work.acked.values())

        async def undistilled() -> list[str]:
            done = await audit_count(self.db, self.org, "distill.completed")
            return [] if done >= total else [f"{done} of {total} acknowledged sessions distilled"]

        await until_nothing_missing(
            undistilled, what="every acknowledged session distilled", timeout=300, transient=TRANSIENT
        )
        js = self.observer.jetstream()

        async def undrained() -> list[str]:
            left = []
            for stream, durable in (
                ("ENGRAM_SESSIONS", "ingest"),
                ("ENGRAM_SESSIONS", "distill"),
                ("ENGRAM_MEMORY", "embed"),
            ):
                info = await js.consumer_info(stream, durable)
                if info.num_pending or info.num_ack_pending:
                    left.append(
                        f"{durable}: {info.num_pending} pending, {info.num_ack_pending} unacknowledged"
                    )
            outbox = await outbox_size(self.db)
            return left + ([f"outbox: {outbox} rows"] if outbox else [])

        await until_nothing_missing(
            undrained, what="consumers drained and the outbox empty", timeout=300, transient=TRANSIENT
        )
        async with self.db.read() as s:
            rows = list(
                (await s.execute(select(MemoryEntry).where(MemoryEntry.org_id == self.org))).scalars()
            )  # type: ignore[arg-type]
        for row in self.rows:
            payloads = self.work.acked.get(row.phase, [])
            row.sessions = len(payloads) + len(self.victims.get(row.phase, []))
            expected = expected_lessons(payloads)
            label = tag(row.phase)
            got = Counter(
                (r.owner_key, normalize(r.text))
                for r in rows
                if label in r.text and not r.owner_key.startswith("end_user:victim-")
            )
            counts = {(r.owner_key, normalize(r.text)): r.reinforcement_count for r in rows}
            row.lost = len(set(expected) - set(got))
            row.duplicated = sum(1 for n in got.values() if n > 1) + len(set(got) - set(expected))
            row.miscounted = sum(1 for k, n in expected.items() if k in counts and counts[k] != n - 1)
            row.purged_left = await self._owner_rows(victim(row.phase))
            answer = await self.work.request(
                "check",
                "engram.recall",
                {"agent_config_id": str(self.agent), "principal": victim(row.phase), "strategy": "full"},
            )
            row.purged_left += len((answer or {}).get("results", [])) if answer is not None else 1
        events = await written_events(self.observer, self.org, timeout=120)
        verify = await self.work.request("check", "engram.audit.verify", {})
        report = Report(
            pace=asdict(self.pace),
            rows=self.rows,
            sessions=total,
            lessons=len(rows),
            memory_written=len(events),
            memory_written_unique=len({e["event_id"] for e in events}),
            saved_and_reinforced=await saved_and_reinforced(self.db, self.org),
            distill_completed=await audit_count(self.db, self.org, "distill.completed"),
            audit_chain_ok=bool(verify and verify.get("ok")),
            publish_retries=self.work.publish_retries,
            http_requests=sum(1 for o in self.work.outcomes if o.http),
            http_failovers=self.work.http_failovers,
            duration_s=time.monotonic() - started,
            load_average=[round(x, 2) for x in os.getloadavg()],
        )
        return report

    async def close(self) -> None:
        for client in (getattr(self, "nc", None), getattr(self, "observer", None)):
            if client is not None:
                await client.close()
        await self.db.close()


def _kill(process: ServiceProcess) -> Callable[[], Awaitable[str]]:
    async def inject() -> str:
        process.kill9()
        return ""

    return inject


def _restart(process: ServiceProcess) -> Callable[[], Awaitable[str]]:
    async def repair() -> str:
        process.start()
        await process.wait_ready()
        return "restarted"

    return repair


def fit_intensity(answer_times: list[float], recalls_per_s: float) -> float:
    """The share of the nominal rates at which the workload keeps the recall process busy at
    most ``RECALL_BUSY_SHARE`` of its time, from the median answer time of recent recalls (timed
    out ones included, at their timeout): 1 on a quiet machine, less where every process gets a
    sliver of a core. The faults, not an overloaded process, are what the scenario measures."""
    if not answer_times:
        return 1.0
    median = sorted(answer_times)[len(answer_times) // 2]
    return max(MIN_INTENSITY, min(1.0, RECALL_BUSY_SHARE / (median * recalls_per_s)))


async def _steady(since: float, seconds: float) -> None:
    """Let the workload run on until ``seconds`` have passed since ``since`` (a span of steady
    load the phase measures, not a wait for a condition)."""
    await asyncio.sleep(max(0.0, since + seconds - time.monotonic()))


async def run(root: Path, pace: Pace) -> Report:
    keys = f"cluster={secrets.token_urlsafe(48)}"
    previous = checkout(PREVIOUS, root) if UPGRADE else "not asked for (ENGRAM_CLUSTER_UPGRADE=1)"
    async with running_cluster(root, keys) as cluster:
        scenario = Scenario(cluster, pace, previous)
        try:
            return await scenario.run()
        finally:
            await scenario.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--long", action="store_true", help="the several-minute workload (default: the CI one)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/cluster.json"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="engram-cluster-"))
    root.chmod(0o755)  # Postgres runs as another user when this runs as root
    report = asyncio.run(run(root, LONG if args.long else SHORT))
    print(report.table())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**asdict(report), "ok": report.ok(), "logs": str(root)}, indent=2))
    print(f"wrote {args.out}; logs under {root}")
    sys.exit(0 if report.ok() else 1)


if __name__ == "__main__":
    main()
