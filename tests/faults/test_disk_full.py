"""Full disks (issue 25 §4): ``engram up`` with Postgres's data dir and JetStream's store each on a
small tmpfs of its own (mounted by the test, as root; skipped where mounting is not permitted).

Under load, a ballast file (whatever else fills a disk: logs, a dump) first leaves Postgres's
filesystem nearly full — the metrics already say so, nothing has failed yet — then takes the
rest. Writes to Postgres fail ("could not extend file: No space left on device"); the sessions
ingest cannot settle pile up in JetStream until its storage limit refuses publishes too
("insufficient resources"). Every request meanwhile answers ``202`` or ``503 UNAVAILABLE`` — never
``500 INTERNAL`` — and the platform retries what failed, as it must. Then the ballast is deleted
and nothing else is done: the stack drains by itself. Counted: lessons lost or stored twice
(the ledger of tests/faults/workload.py), dead letters (an outage must never dead-letter), and
the audit chain and every B-tree index checked (amcheck) for corruption."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import errors as js_errors
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from contracts.connection import ConnectionInfo
from shared.storage.db.engine import Database
from tests.engram_up import EngramUp, stack_dir
from tests.faults.workload import (
    audit_count,
    expected_lessons,
    ledger,
    outbox_size,
    raise_cap,
    saved_and_reinforced,
    sessions,
)
from tests.platform import eventually, publish_session

pytestmark = [pytest.mark.faults, pytest.mark.e2e]

#: The filesystems: Postgres's holds initdb's ~41 MB and a little data; JetStream's store may use
#: 75% of its 128 MB (shared/embedded/nats_server.py: store_limit), ~96 MB. The other 25% is
#: the headroom JetStream's own files need beyond the bytes it counts (a message block, up to
#: 8 MB, keeps acknowledged messages' space until it is compacted or emptied): on a 12 MB store
#: the filesystem filled before the limit and the streams stopped until nats-server restarted.
PG_FS_MB = 128
NATS_FS_MB = 128
#: Each session carries this much tool output: the copies ingest forwards again at each retry
#: while Postgres is full overflow JetStream's limit within a few retries.
PAD_BYTES = 200 * 1000  # under the 250,000 characters a tool output may have
#: Sessions before the fault; while the disk is full, published to NATS (100 x 200 KB: what
#: platforms publish stays well under JetStream's limit, see docs/adr/0099-full-disks.md on a
#: burst that alone exceeds it) and submitted over HTTP.
HEALTHY = 40
PUBLISHED_WHILE_FULL = 100
SUBMITTED_WHILE_FULL = 40
#: Free space left on Postgres's filesystem by the first ballast: under the alert's 15%.
NEARLY_FULL_SHARE = 0.08
RETRY_S = 0.5


@contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` mounted on ``path`` (skips when mounting is not permitted)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(ballast: Path, leave: int) -> int:
    """Grow ``ballast`` until ``leave`` bytes are free on its filesystem (0: until it is full);
    how many bytes it holds."""
    chunk = b"\0" * (1 << 20)
    with ballast.open("ab") as out:
        while (room := free_bytes(ballast.parent) - leave) > 0:
            try:
                out.write(chunk[: min(room, len(chunk))])
                out.flush()
                os.fsync(out.fileno())
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return ballast.stat().st_size


def padded_sessions(org: UUID, agent: UUID, indexes: Iterable[int]) -> list[dict[str, Any]]:
    out = sessions(org, agent, indexes)
    for payload in out:
        payload["tool_trace"][0]["output"] += " " + "." * PAD_BYTES
    return out


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(metric, its one label's value) → value, from engram up's /metrics."""
    with urllib.request.urlopen(url, timeout=30) as reply:  # noqa: S310 (http, the stack under test)
        body = reply.read().decode()
    return {
        (s.name, next(iter(s.labels.values()), "")): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def jetstream_share(samples: dict[tuple[str, str], float]) -> float:
    """What the EngramJetStreamStorageNearLimit alert computes: stream bytes / storage limit."""
    used = sum(v for (name, _), v in samples.items() if name == "engram_jetstream_stream_bytes")
    limit = samples.get(("engram_jetstream_max_storage_bytes", ""), 0.0)
    return used / limit if limit else 0.0


def disk_share_free(samples: dict[tuple[str, str], float], store: str) -> float:
    """What EngramStoreDiskFilling computes: free / size of a store's filesystem."""
    size = samples.get(("engram_filesystem_size_bytes", store), 0.0)
    return samples.get(("engram_filesystem_free_bytes", store), 0.0) / size if size else 1.0


class Platform:
    """A platform that sends sessions and retries every failure until Engram acknowledges it,
    counting each answer: HTTP statuses, NATS publish errors by kind."""

    def __init__(self, http: httpx.AsyncClient, nc: Client, token: str) -> None:
        self.http, self.nc, self.token = http, nc, token
        self.statuses: Counter[int] = Counter()
        self.codes: Counter[str] = Counter()
        self.nats_errors: Counter[str] = Counter()

    async def submit(self, payload: dict[str, Any]) -> None:
        while True:
            try:
                reply = await self.http.post("/v1/sessions", json=payload)
            except httpx.TransportError:
                self.statuses[0] += 1
            else:
                self.statuses[reply.status_code] += 1
                if reply.status_code == 202:
                    return
                self.codes[reply.json().get("error", {}).get("code", "?")] += 1
            await asyncio.sleep(RETRY_S)

    async def publish(self, payload: dict[str, Any]) -> None:
        while True:
            try:
                await publish_session(self.nc, payload, self.token)
                return
            except js_errors.ServiceUnavailableError as exc:
                self.nats_errors[exc.description or "503"] += 1
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                self.nats_errors[type(exc).__name__] += 1
            await asyncio.sleep(RETRY_S)

    def send(self, published: list[dict[str, Any]], submitted: list[dict[str, Any]]) -> asyncio.Future[Any]:
        return asyncio.gather(*(self.publish(p) for p in published), *(self.submit(p) for p in submitted))


async def btree_corruption(db: Database) -> list[str]:
    """amcheck's bt_index_check over every B-tree index of the database: the ones it faults."""
    async with db.transaction() as s:
        await s.execute(text("CREATE EXTENSION IF NOT EXISTS amcheck"))
    async with db.read() as s:
        indexes = (
            await s.execute(
                text(
                    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "JOIN pg_am a ON a.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE a.amname = 'btree' AND n.nspname = 'public'"
                )
            )
        ).all()
    faulted = []
    for (name,) in indexes:
        try:
            async with db.read() as s:
                await s.execute(text("SELECT bt_index_check(CAST(:name AS regclass), true)"), {"name": name})
        except Exception as exc:  # amcheck raises on the first inconsistency it finds
            faulted.append(f"{name}: {exc}")
    return faulted


async def test_full_disks_answer_unavailable_and_the_stack_recovers_once_space_is_freed() -> None:
    with (
        stack_dir() as data_dir,
        tmpfs(data_dir / "postgres", PG_FS_MB),
        tmpfs(data_dir / "nats", NATS_FS_MB),
    ):
        with EngramUp(data_dir, data_dir / "up.log", env={"ENGRAM_EMBEDDER": "hashing-384"}) as up:
            info = await up.connection()
            connection = ConnectionInfo.model_validate(info)
            org, agent = UUID(info["org_id"]), UUID(info["agent_config_id"])
            at = iter(range(10_000))
            healthy = padded_sessions(org, agent, [next(at) for _ in range(HEALTHY)])
            nearly = padded_sessions(org, agent, [next(at) for _ in range(10)])
            published = padded_sessions(org, agent, [next(at) for _ in range(PUBLISHED_WHILE_FULL)])
            submitted = padded_sessions(org, agent, [next(at) for _ in range(SUBMITTED_WHILE_FULL)])
            #: Small sessions published one by one while the disk is full, until JetStream refuses one.
            probes: list[dict[str, Any]] = []
            db = Database(info["database_url"])
            nc = await nats.connect(connection.nats_url, **connection.nats_options())
            http = httpx.AsyncClient(
                base_url=info["http_url"], headers={"Authorization": f"Bearer {connection.token}"}, timeout=30
            )
            metrics = info["metrics_url"]
            sending: list[asyncio.Future[Any]] = []
            try:
                await raise_cap(db, org, agent)
                platform = Platform(http, nc, connection.token)

                async def distilled(n: int) -> bool:
                    return await audit_count(db, org, "distill.completed") >= n

                # 1. Healthy.
                await platform.send(healthy[::2], healthy[1::2])
                await eventually(
                    lambda: distilled(HEALTHY), timeout=120, interval=0.2, what="healthy distilled"
                )
                assert disk_share_free(await asyncio.to_thread(scrape, metrics), "postgres") > 0.5

                # 2. Nearly full: the alert's condition holds before anything fails.
                ballast = data_dir / "postgres" / "ballast"
                fill(ballast, int(PG_FS_MB * 2**20 * NEARLY_FULL_SHARE))
                warned = await asyncio.to_thread(scrape, metrics)
                platform.statuses.clear()
                await platform.send(nearly[::2], nearly[1::2])
                assert set(platform.statuses) == {202}, platform.statuses
                assert not platform.nats_errors, platform.nats_errors
                await eventually(
                    lambda: distilled(HEALTHY + len(nearly)),
                    timeout=120,
                    interval=0.2,
                    what="nearly-full distilled",
                )

                # 3. Full: Postgres refuses writes; what waits for it fills JetStream to its limit.
                ballast_bytes = fill(ballast, 0)
                filled = time.monotonic()
                platform.statuses.clear()
                sending.append(asyncio.ensure_future(platform.send(published, submitted)))
                share_max = 0.0
                while not (platform.codes["UNAVAILABLE"] and platform.nats_errors["insufficient resources"]):
                    if time.monotonic() - filled > 180:
                        pytest.fail(
                            f"not refused by both stores in 180 s: {platform.statuses} {platform.nats_errors}"
                        )
                    probe = sessions(org, agent, [next(at)])[0]
                    probes.append(probe)
                    sending.append(asyncio.ensure_future(platform.publish(probe)))
                    with suppress(OSError):  # a scrape of a stack this busy may time out: next round
                        share_max = max(share_max, jetstream_share(await asyncio.to_thread(scrape, metrics)))
                    await asyncio.sleep(0.2)  # the probes' pace, not a wait for anything
                full_for = time.monotonic() - filled
                during = Counter(platform.statuses)
                nats_refused = Counter(platform.nats_errors)

                # 4. Space freed; nothing else is done.
                ballast.unlink()
                freed = time.monotonic()
                everything = healthy + nearly + published + submitted + probes
                await asyncio.wait_for(asyncio.gather(*sending), 300)
                await eventually(
                    lambda: distilled(len(everything)),
                    timeout=300,
                    interval=0.2,
                    what="every session distilled",
                )
                recovered = time.monotonic() - freed

                async def settled() -> bool:
                    samples = await asyncio.to_thread(scrape, metrics)
                    lag = (
                        "engram_jetstream_consumer_num_pending",
                        "engram_jetstream_consumer_num_ack_pending",
                    )
                    backlog = [v for (name, _), v in samples.items() if name in lag]
                    return await outbox_size(db) == 0 and not any(backlog)

                await eventually(
                    settled, timeout=120, interval=0.2, what="consumers drained, outbox published"
                )
                after = await asyncio.to_thread(scrape, metrics)
                expected = expected_lessons(everything)
                result = await ledger(db, org, expected)
                saved = await saved_and_reinforced(db, org)
                corrupt = await btree_corruption(db)
                dead_letters = after.get(("engram_jetstream_stream_messages", "ENGRAM_DLQ"), 0.0)
            except BaseException:
                for log in (data_dir / "nats" / "nats-server.log", data_dir / "postgres" / "log"):
                    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
                    print(f"----- {log.name} (last 30 lines) -----", *lines[-30:], sep="\n")
                raise
            finally:
                for task in sending:
                    task.cancel()
                await asyncio.gather(*sending, return_exceptions=True)
                await http.aclose()
                with suppress(Exception):
                    await asyncio.wait_for(nc.close(), 5)
                await db.close()
        pg_log = (data_dir / "postgres" / "log").read_text(errors="replace")
        up_log = up.output()
    http_500 = sum(n for status, n in during.items() if status >= 500 and status != 503)
    refused = nats_refused["insufficient resources"]
    print(
        f"\nFAULT disk-full: sessions={len(everything)} pg_fs_mb={PG_FS_MB} nats_fs_mb={NATS_FS_MB} "
        f"ballast_mb={ballast_bytes / 2**20:.1f} full_s={full_for:.1f} http_503={during[503]} "
        f"http_500={http_500} nats_refused={refused} nats_other={sum(nats_refused.values()) - refused} "
        f"recovered_s={recovered:.1f} dead_letters={dead_letters:g} "
        f"lost={len(result.lost)} duplicated={len(result.duplicated)}"
    )
    print(
        f"disk full: {result.summary()}; JetStream's share of its limit seen while full {share_max:.2f}; "
        f"Postgres's free share when nearly full {disk_share_free(warned, 'postgres'):.3f}; "
        f"Postgres log: PANIC {pg_log.count('PANIC')}, 'could not extend' {pg_log.count('could not extend')}"
    )
    # The metrics said so: Postgres's filesystem before anything failed, JetStream at its limit.
    assert disk_share_free(warned, "postgres") < 0.15
    assert share_max >= 0.8, "JetStream refused publishes without its usage metric near the limit"
    # Clear answers: UNAVAILABLE, never INTERNAL.
    assert during[503] > 0
    assert http_500 == 0, during
    assert set(platform.codes) <= {"UNAVAILABLE"}, platform.codes
    assert "unexpected error while handling a request" not in up_log
    # Nothing acknowledged was lost, nothing done twice, nothing dead-lettered, nothing corrupt.
    assert result.lost == [], "lessons lost"
    assert result.duplicated == [], "lessons stored twice"
    assert result.unexpected == []
    assert result.miscounted == [], "reinforcement counts off"
    assert result.completed == len(everything), "distill.completed lost or doubled"
    assert result.chain_ok, result.chain_reason
    assert saved == sum(expected.values()), "memory.saved counts lost or doubled"
    assert dead_letters == 0, "an outage was dead-lettered"
    assert corrupt == [], corrupt


async def test_a_jetstream_filesystem_filled_by_something_else_recovers_once_space_is_freed() -> None:
    """JetStream's filesystem filled *below* its storage limit (by something else — its limit was
    set from the free space at start): a write meets ENOSPC and nats-server leaves the stream
    failing every write. ``engram up`` restarts it once space is free again; publishes that
    timed out meanwhile are retried by the platform and nothing acknowledged is lost."""
    with stack_dir() as data_dir, tmpfs(data_dir / "nats", NATS_FS_MB):
        with EngramUp(data_dir, data_dir / "up.log", env={"ENGRAM_EMBEDDER": "hashing-384"}) as up:
            info = await up.connection()
            connection = ConnectionInfo.model_validate(info)
            org, agent = UUID(info["org_id"]), UUID(info["agent_config_id"])
            before = sessions(org, agent, range(20))
            during = sessions(org, agent, range(20, 60))
            db = Database(info["database_url"])
            nc = await nats.connect(connection.nats_url, **connection.nats_options())
            http = httpx.AsyncClient(base_url=info["http_url"], timeout=30)
            nats_log = data_dir / "nats" / "nats-server.log"
            sending: asyncio.Future[Any] | None = None
            try:
                await raise_cap(db, org, agent)
                platform = Platform(http, nc, connection.token)

                async def distilled(n: int) -> bool:
                    return await audit_count(db, org, "distill.completed") >= n

                await platform.send(before, [])
                await eventually(
                    lambda: distilled(len(before)), timeout=120, interval=0.2, what="first distilled"
                )

                ballast = data_dir / "nats" / "ballast"
                ballast_bytes = fill(ballast, 0)
                filled = time.monotonic()
                sending = asyncio.ensure_future(platform.send(during, []))

                async def write_failed() -> bool:
                    return b"critical write error" in nats_log.read_bytes().lower()

                await eventually(write_failed, timeout=120, interval=0.2, what="a store write failed")
                # The stream stays failed while the disk is full: the platform's publishes fail.
                await eventually(
                    lambda: sum(platform.nats_errors.values()) > 0,
                    timeout=60,
                    interval=0.2,
                    what="a publish failed",
                )
                failed_while_full = Counter(platform.nats_errors)
                full_for = time.monotonic() - filled

                ballast.unlink()
                freed = time.monotonic()
                await asyncio.wait_for(sending, 300)
                everything = before + during
                await eventually(
                    lambda: distilled(len(everything)),
                    timeout=300,
                    interval=0.2,
                    what="every session distilled",
                )
                recovered = time.monotonic() - freed
                await eventually(
                    lambda: _empty_outbox(db), timeout=120, interval=0.2, what="outbox published"
                )
                result = await ledger(db, org, expected_lessons(everything))
            finally:
                if sending is not None and not sending.done():
                    sending.cancel()
                    await asyncio.gather(sending, return_exceptions=True)
                await http.aclose()
                with suppress(Exception):
                    await asyncio.wait_for(nc.close(), 5)
                await db.close()
        up_log = up.output()
    restarted = up_log.count("restarting it now that")
    print(
        f"\nFAULT disk-full-jetstream-fs: sessions={len(everything)} nats_fs_mb={NATS_FS_MB} "
        f"ballast_mb={ballast_bytes / 2**20:.1f} full_s={full_for:.1f} "
        f"nats_failed={sum(failed_while_full.values())} restarts={restarted} recovered_s={recovered:.1f} "
        f"lost={len(result.lost)} duplicated={len(result.duplicated)}"
    )
    print(f"jetstream filesystem full: {result.summary()}; failed publishes {dict(failed_while_full)}")
    assert restarted >= 1, "nats-server was not restarted"
    assert result.lost == [], "lessons lost"
    assert result.duplicated == [], "lessons stored twice"
    assert result.unexpected == []
    assert result.miscounted == [], "reinforcement counts off"
    assert result.completed == len(everything), "distill.completed lost or doubled"
    assert result.chain_ok, result.chain_reason


async def _empty_outbox(db: Database) -> bool:
    return await outbox_size(db) == 0
