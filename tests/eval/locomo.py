"""Recall quality on LoCoMo (``make eval``): evidence recall@5/@10 and recall latency over NATS.

The data (five LoCoMo conversations, CC BY-NC 4.0) is not in this repository: it is read from
``shared/eval/locomo-dev`` beside the checkout (``--data`` or ``ENGRAM_EVAL_DATA`` override it),
and the evaluation is skipped, exit 0, where that folder is absent.

Per embedder (``--embedder``, repeatable; default hashing-384 and all-MiniLM-L6-v2), everything
runs fresh on this machine: a nats-server from the wheel, a throwaway Postgres database, and every
service in-process (as ``engram up`` runs them) with that embedder and Qdrant Edge under a temp dir.

The measurement (``../shared/eval/README.md``):

- One agent config per conversation, all in one organization; its ``retention.max_entries`` is
  raised to 5000 first (``engram.config.put``).
- Every turn becomes one memory through the real write path, ``engram.memory.save`` with a service
  token, ``principal: {"kind": "none"}`` (the shared pool), ``wait: true``, one LoCoMo session a
  request, in order, with ``session_id`` ``"session-<N>"`` (so Engram records each turn's place in
  its session): episodic, importance 0.5, text ``"<speaker>: <text>"`` plus
  ``" [image: <blip_caption>]"`` where the turn shared a photo, ``occurred_at`` the session's date,
  metadata ``{"dia_id", "session", "session_date"}``. Turns the write policy denies are skipped by
  Engram; the harness reports stored vs skipped turns (from Postgres).
- It waits (bounded) until every stored entry has ``embedding_status = 'indexed'``.
- Each question of categories 1-4 is the cue of one ``engram.recall`` per strategy (``pack``,
  ``hybrid``, ``semantic``; ``last_k``/``importance`` take no cue), ``top_k`` 10, over NATS
  request-reply with a few requests in flight. Evidence recall@k = |evidence ∩ the ``dia_id``s
  in the metadata of the first k results| / |evidence|, averaged over questions; latency is
  ``perf_counter`` around each request (so it includes the in-flight queueing), p50/p99.
- Session-level any-hit@5 beside them (issue 26 §4; how peers publish LoCoMo figures): 1 when a
  session holding evidence is among the first five distinct sessions of the results.
- ``hybrid`` again with ``collapse_similar: false`` (docs/adr/0094-what-recall-hands-an-agent.md):
  folding near-duplicates must not cost recall on turns that are not near-duplicates; the count of
  results folded is reported per strategy.
- Then ``hybrid`` again under each of ``HYBRID_VARIANTS`` (the agent configs' ``semantic_recall``
  changed through ``engram.config.put``): without the neighbourhood, without time grounding,
  without both (fusion alone), and with rank fusion, so each method's effect on recall and on
  latency is measured in the same run (cue vectors are cached by then).

Evidence normalization: each evidence string is split on ``;``, ``,`` and whitespace (LoCoMo has
``"D8:6; D9:17"``); each piece must read ``D<session>:<turn>`` with an optional stray colon after
the ``D`` (``"D:11:26"`` → ``D11:26``) and leading zeros dropped; pieces that do not parse (``"D"``)
and ids of turns that do not exist in the conversation (``"D10:19"`` where session 10 ends at 16)
are dropped, listed in the JSON; duplicates count once. Questions left with no evidence are
skipped. Evidence turns that Engram did not store (write-policy skips) stay in the denominator.

Note: the recall service caches cue vectors, and ``semantic`` runs after ``hybrid`` on the same
cues, so ``semantic``'s latency excludes embedding the cue; ``hybrid``'s includes it.

Results go to ``bench-results/eval.json`` and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import nats
from nats.aio.client import Client

from contracts.subjects import CONFIG_PUT, MEMORY_SAVE, RECALL
from services.runtime import running_services
from tests.eval.stack import eval_stack, script_parser, service_token, write_report
from tests.platform import request

EMBEDDERS = ("hashing-384", "all-MiniLM-L6-v2")
#: Asked in this order; ``semantic`` after ``hybrid`` (see the module docstring on the cue cache).
STRATEGIES = ("pack", "hybrid", "semantic")
KS = (5, 10)
#: Session-level any-hit@5 (issue 26 §4): the figure peers publish for LoCoMo.
SESSION_K = 5
SESSION_METRIC = f"session_any_hit@{SESSION_K}"
#: hybrid's settings measured besides the default (``semantic_recall`` of the agent configs).
HYBRID_VARIANTS: dict[str, dict[str, Any]] = {
    "hybrid (no neighbourhood)": {"fusion": "convex", "neighbourhood": False, "time_grounding": True},
    "hybrid (no time grounding)": {"fusion": "convex", "neighbourhood": True, "time_grounding": False},
    "hybrid (fusion alone)": {"fusion": "convex", "neighbourhood": False, "time_grounding": False},
    "hybrid (rrf)": {"fusion": "rrf", "neighbourhood": True, "time_grounding": True},
}
TOP_K = 10
#: hybrid asked with ``collapse_similar: false``, beside the default.
UNFOLDED = "hybrid (not folded)"
SAVE_BATCH = 100
MAX_ENTRIES = 5000
CATEGORIES = (1, 2, 3, 4)
#: LoCoMo's category numbers (Maharana et al. 2024; category 5, adversarial, has no evidence).
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
REFERENCE = (
    ("BM25 (rank_bm25)", 0.446, 0.525),
    ("dense (all-MiniLM-L6-v2, cosine)", 0.390, 0.502),
    ("hybrid (RRF of the two, k=60)", 0.480, 0.584),
)
_EVIDENCE_RE = re.compile(r"D:?0*(\d+):0*(\d+)", re.IGNORECASE)
_SESSION_RE = re.compile(r"session_(\d+)")
REPO = Path(__file__).resolve().parents[2]


class EvalError(RuntimeError):
    """Something in the stack under test did not do its part; the message says what."""


@dataclass(frozen=True)
class Turn:
    dia_id: str
    text: str
    session: int
    session_date: str


@dataclass(frozen=True)
class Question:
    question: str
    category: int
    evidence: tuple[str, ...]


@dataclass
class Conversation:
    name: str
    turns: list[Turn]
    questions: list[Question]
    #: evidence pieces dropped by normalization, and why
    evidence_dropped: list[dict[str, Any]] = field(default_factory=list)
    questions_without_evidence: int = 0


# --------------------------------------------------------------------------------------- data


def default_data_dir() -> Path:
    env = os.environ.get("ENGRAM_EVAL_DATA")
    return Path(env) if env else REPO.parent / "shared" / "eval" / "locomo-dev"


def normalize_evidence(raw: list[str], known: set[str]) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """The evidence ids of one question, and the pieces dropped with the reason."""
    ids: list[str] = []
    dropped: list[tuple[str, str]] = []
    for item in raw:
        for piece in re.split(r"[;,\s]+", str(item).strip()):
            if not piece:
                continue
            m = _EVIDENCE_RE.fullmatch(piece)
            if m is None:
                dropped.append((piece, "unparseable"))
                continue
            dia_id = f"D{int(m[1])}:{int(m[2])}"
            if dia_id not in known:
                dropped.append((piece, "no such turn"))
            elif dia_id not in ids:
                ids.append(dia_id)
    return tuple(ids), dropped


def load_conversation(path: Path) -> Conversation:
    data = json.loads(path.read_text())
    conv = data.get("conversation", data)  # the original release nests the sessions
    turns: list[Turn] = []
    for n in sorted(int(m[1]) for key in conv if (m := _SESSION_RE.fullmatch(key))):
        date = str(conv.get(f"session_{n}_date_time", ""))
        for t in conv[f"session_{n}"]:
            text = f"{t['speaker']}: {t['text']}"
            if t.get("blip_caption"):
                text += f" [image: {t['blip_caption']}]"
            turns.append(Turn(dia_id=t["dia_id"], text=text[:8000], session=n, session_date=date))
    known = {t.dia_id for t in turns}
    out = Conversation(name=path.stem, turns=turns, questions=[])
    for qa in data["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        evidence, dropped = normalize_evidence(list(qa.get("evidence") or []), known)
        for piece, why in dropped:
            out.evidence_dropped.append({"question": qa["question"], "piece": piece, "reason": why})
        if not evidence:
            out.questions_without_evidence += 1
            continue
        out.questions.append(Question(str(qa["question"]), int(qa["category"]), evidence))
    return out


def embedder_unavailable(name: str) -> str | None:
    """Why ``name`` cannot run here, or None (all-MiniLM-L6-v2 runs in onnxruntime: no torch needed)."""
    if name != "all-MiniLM-L6-v2":
        return None
    from shared.adapters.embedders.model_files import ModelFilesError, model_dir

    try:
        model_dir()
    except ModelFilesError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------------ helpers


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _call(
    nc: Client, subject: str, payload: dict[str, Any], token: str, timeout: float
) -> dict[str, Any]:
    for attempt in range(100):
        try:
            data = await request(nc, subject, payload, token, timeout=timeout)
            break
        except nats.errors.NoRespondersError:
            # Seen once, right after a second in-process start: services answering a moment
            # late. Bounded (5 s), and counted nowhere: this harness measures recall, not start-up.
            if attempt == 99:
                raise
            await asyncio.sleep(0.05)
        except TimeoutError as exc:
            raise EvalError(f"{subject}: no reply within {timeout}s") from exc
    if "error" in data:
        raise EvalError(f"{subject} answered an error: {json.dumps(data['error'])[:500]}")
    return data


# ---------------------------------------------------------------------------------- the write


def batches(turns: list[Turn]) -> list[list[Turn]]:
    """The turns in save requests, in order: one LoCoMo session per request (as a platform saves
    a conversation under its session id), split where a session has more than ``SAVE_BATCH``."""
    out: list[list[Turn]] = []
    for t in turns:
        if out and out[-1][-1].session == t.session and len(out[-1]) < SAVE_BATCH:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def session_time(raw: str) -> datetime | None:
    """LoCoMo's ``session_N_date_time`` ("1:56 pm on 8 May, 2023") as a UTC time; None if it
    does not read so (the entry then carries no ``occurred_at``)."""
    try:
        return datetime.strptime(raw.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        return None


async def store(nc: Client, token: str, agent: UUID, conv: Conversation) -> dict[str, Any]:
    """Config first, then every turn through ``engram.memory.save``; the replies' tallies."""
    config = {"retention": {"max_entries": MAX_ENTRIES}}
    await _call(nc, CONFIG_PUT, {"agent_config_id": str(agent), "config": config}, token, timeout=10)
    tally: Counter[str] = Counter()
    for batch in batches(conv.turns):
        payload = {
            "agent_config_id": str(agent),
            "principal": {"kind": "none"},
            "session_id": f"session-{batch[0].session}",
            "wait": True,
            "entries": [
                {
                    "text": t.text,
                    "importance": 0.5,
                    "memory_type": "episodic",
                    "metadata": {"dia_id": t.dia_id, "session": t.session, "session_date": t.session_date},
                    **({"occurred_at": when.isoformat()} if (when := session_time(t.session_date)) else {}),
                }
                for t in batch
            ],
        }
        reply = await _call(nc, MEMORY_SAVE, payload, token, timeout=60)
        if reply.get("status") == 202:  # accepted, but the outcome took longer than the wait
            tally["accepted_without_outcome"] += 1
            continue
        for key in ("saved", "skipped", "reinforced"):
            tally[key] += int(reply.get(key, 0))
    return dict(tally)


async def stored_dia_ids(pg: asyncpg.Connection, agent: UUID) -> set[str]:
    rows = await pg.fetch(
        "SELECT metadata->>'dia_id' AS dia_id FROM memory_entries "
        "WHERE agent_config_id = $1 AND lifecycle = 'active'",
        agent,
    )
    return {r["dia_id"] for r in rows if r["dia_id"]}


async def settle_rows(pg: asyncpg.Connection, agents: dict[str, UUID], expected: int, timeout: float) -> None:
    """Saves answered 202 land a little later: wait for the expected rows (or a stable count)."""
    deadline = time.monotonic() + timeout
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = await pg.fetchval(
            "SELECT count(*) FROM memory_entries WHERE agent_config_id = ANY($1::uuid[])",
            list(agents.values()),
        )
        if count >= expected:
            return
        if count != last:
            last, stable_since = count, time.monotonic()
        elif time.monotonic() - stable_since > 10:
            return
        await asyncio.sleep(0.5)


async def wait_indexed(pg: asyncpg.Connection, org: UUID, total: int, timeout: float) -> float:
    """Poll Postgres until every stored entry of ``org`` is indexed; seconds waited."""
    start = time.monotonic()
    last_print, last_progress, last_indexed = start, start, -1
    while True:
        rows = await pg.fetch(
            "SELECT embedding_status, count(*) AS n FROM memory_entries WHERE org_id = $1 GROUP BY 1", org
        )
        by_status = {r["embedding_status"]: r["n"] for r in rows}
        indexed, failed = by_status.get("indexed", 0), by_status.get("failed", 0)
        now = time.monotonic()
        if failed:
            raise EvalError(
                f"{failed} entries have embedding_status='failed' (services/embed/indexer.py marks that "
                "when the embedder answers with the wrong dimension)"
            )
        if indexed >= total:
            return now - start
        if indexed != last_indexed:
            last_indexed, last_progress = indexed, now
        if now - start > timeout or now - last_progress > min(timeout, 180):
            raise EvalError(
                f"only {indexed}/{total} entries indexed after {now - start:.0f}s "
                f"(statuses {by_status}): the embed service (services/embed/) is not indexing "
                "memory.written entries"
            )
        if now - last_print >= 5:
            print(f"    indexing: {indexed}/{total} ({now - start:.0f}s)", flush=True)
            last_print = now
        await asyncio.sleep(0.5)


# ----------------------------------------------------------------------------------- the read


@dataclass
class Answer:
    question: Question
    dia_ids: list[str | None]
    latency_ms: float
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    strategy_answered: str | None = None
    #: entries recall folded into the results as near-duplicates (their ``similar_count``s)
    folded: int = 0


async def ask(
    nc: Client,
    token: str,
    strategy: str,
    work: list[tuple[UUID, Question]],
    concurrency: int,
    timeout: float,
    extra: dict[str, Any] | None = None,
) -> list[Answer]:
    sem = asyncio.Semaphore(concurrency)

    async def one(agent: UUID, q: Question) -> Answer:
        payload = {
            "agent_config_id": str(agent),
            "principal": {"kind": "none"},
            "strategy": strategy,
            "cue": q.question,
            "top_k": TOP_K,
            **(extra or {}),
        }
        body = json.dumps(payload).encode()
        async with sem:
            t0 = time.perf_counter()
            try:
                msg = await nc.request(
                    RECALL, body, timeout=timeout, headers={"Authorization": f"Bearer {token}"}
                )
            except TimeoutError:
                return Answer(q, [], (time.perf_counter() - t0) * 1000, error=f"no reply within {timeout}s")
            ms = (time.perf_counter() - t0) * 1000
        data = json.loads(msg.data)
        if "error" in data:
            return Answer(q, [], ms, error=json.dumps(data["error"])[:300])
        ids = [((r.get("metadata") or {}).get("dia_id")) for r in data.get("results", [])]
        return Answer(
            q,
            ids,
            ms,
            warnings=list(data.get("warnings") or []),
            strategy_answered=data.get("strategy"),
            folded=sum(int(r.get("similar_count") or 0) for r in data.get("results", [])),
        )

    return list(await asyncio.gather(*(one(agent, q) for agent, q in work)))


def dia_session(dia_id: str) -> str:
    """The LoCoMo session of a turn id: ``"D8:6"`` → ``"D8"``."""
    return dia_id.partition(":")[0]


def session_any_hit(dia_ids: list[str | None], evidence: tuple[str, ...], k: int = SESSION_K) -> float:
    """Session-level any-hit@k, as peers publish LoCoMo figures: 1 when a session holding evidence
    is among the first ``k`` distinct sessions of the results (in the order they first appear)."""
    sessions = list(dict.fromkeys(dia_session(d) for d in dia_ids if d))[:k]
    return 1.0 if {dia_session(e) for e in evidence} & set(sessions) else 0.0


def score(strategy: str, answers: list[Answer]) -> dict[str, Any]:
    ok = [a for a in answers if a.error is None]
    out: dict[str, Any] = {"questions": len(answers), "errors": len(answers) - len(ok)}
    if out["errors"]:
        out["error_examples"] = sorted(Counter(a.error for a in answers if a.error).items())[:5]
    recall: dict[int, list[float]] = {k: [] for k in KS}
    by_cat: dict[int, dict[int, list[float]]] = defaultdict(lambda: {k: [] for k in KS})
    sessions: list[float] = []
    sessions_by_cat: dict[int, list[float]] = defaultdict(list)
    for a in answers:  # an error scores 0: the caller got nothing
        for k in KS:
            got = {d for d in a.dia_ids[:k] if d}
            r = len(got & set(a.question.evidence)) / len(a.question.evidence)
            recall[k].append(r)
            by_cat[a.question.category][k].append(r)
        hit = session_any_hit(a.dia_ids, a.question.evidence)
        sessions.append(hit)
        sessions_by_cat[a.question.category].append(hit)
    for k in KS:
        out[f"r@{k}"] = round(statistics.fmean(recall[k]), 4) if recall[k] else None
    out[SESSION_METRIC] = round(statistics.fmean(sessions), 4) if sessions else None
    out["by_category"] = {
        str(c): {
            "n": len(v[KS[0]]),
            **{f"r@{k}": round(statistics.fmean(v[k]), 4) for k in KS},
            SESSION_METRIC: round(statistics.fmean(sessions_by_cat[c]), 4),
        }
        for c, v in sorted(by_cat.items())
    }
    lat = [a.latency_ms for a in ok]
    out["p50_ms"] = round(_pct(lat, 0.50), 2) if lat else None
    out["p99_ms"] = round(_pct(lat, 0.99), 2) if lat else None
    out["mean_ms"] = round(statistics.fmean(lat), 2) if lat else None
    out["mean_results"] = round(statistics.fmean(len(a.dia_ids) for a in ok), 2) if ok else None
    out["results_without_dia_id"] = sum(1 for a in ok for d in a.dia_ids if not d)
    # Turns are not near-duplicates of each other: what recall folded here it should not have.
    out["folded_as_near_duplicates"] = sum(a.folded for a in ok)
    out["warnings"] = dict(Counter(w for a in ok for w in a.warnings))
    # A fallback (e.g. to last_k when the vector index is unavailable) names another strategy.
    out["answered_with_other_strategy"] = sum(1 for a in ok if a.strategy_answered != strategy)
    return out


# ------------------------------------------------------------------------------------ the run


async def run_embedder(name: str, convs: list[Conversation], args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"embedder": name}
    async with eval_stack("engram-eval-", name, vector_store="") as (settings, nc, pg):
        t0 = time.perf_counter()
        async with running_services(settings):
            result["startup_s"] = round(time.perf_counter() - t0, 2)
            org = uuid4()
            token = service_token(org, "locomo-eval", 12 * 3600)
            agents = {c.name: uuid4() for c in convs}
            print(f"  storing {sum(len(c.turns) for c in convs)} turns ...", flush=True)
            t0 = time.perf_counter()
            # One conversation at a time: a save waits at most its operation's 10 s in the
            # edge's queue (docs/adr/0079-edge-deadline.md), and five batches of 100 turns
            # queued at once outwait that on a loaded machine.
            tallies = [await store(nc, token, agents[c.name], c) for c in convs]
            await settle_rows(pg, agents, sum(len(c.turns) for c in convs), timeout=120)
            result["store_s"] = round(time.perf_counter() - t0, 2)
            storage: dict[str, Any] = {}
            stored_total = 0
            for c, tally in zip(convs, tallies, strict=True):
                ids = await stored_dia_ids(pg, agents[c.name])
                skipped = [t.dia_id for t in c.turns if t.dia_id not in ids]
                evidence = {e for q in c.questions for e in q.evidence}
                storage[c.name] = {
                    "turns": len(c.turns),
                    "stored": len(ids),
                    "skipped": len(skipped),
                    "skipped_dia_ids": skipped[:50],
                    "evidence_turns_not_stored": sorted(evidence - ids),
                    "save_replies": tally,
                }
                stored_total += len(ids)
            quarantined = await pg.fetchval(
                "SELECT count(*) FROM memory_entries WHERE org_id = $1 AND quarantined", org
            )
            result["storage"] = {
                "turns": sum(s["turns"] for s in storage.values()),
                "stored": stored_total,
                "skipped": sum(s["skipped"] for s in storage.values()),
                "quarantined": quarantined,
                "per_conversation": storage,
            }
            print(
                f"  stored {stored_total}/{result['storage']['turns']} turns "
                f"({result['storage']['skipped']} skipped, {quarantined} quarantined) "
                f"in {result['store_s']}s; waiting for the embed service ...",
                flush=True,
            )
            result["index_wait_s"] = round(await wait_indexed(pg, org, stored_total, args.index_timeout), 2)
            print(f"  all {stored_total} entries indexed after {result['index_wait_s']}s", flush=True)

            work = [(agents[c.name], q) for c in convs for q in c.questions]
            result["strategies"] = {}
            for strategy in args.strategy or STRATEGIES:
                # Warm-up (not counted): first-call costs of each code path.
                await ask(nc, token, strategy, work[:8], args.concurrency, args.request_timeout)
                t0 = time.perf_counter()
                answers = await ask(nc, token, strategy, work, args.concurrency, args.request_timeout)
                wall = time.perf_counter() - t0
                scored = score(strategy, answers)
                scored["wall_s"] = round(wall, 2)
                scored["requests_per_s"] = round(len(answers) / wall, 1)
                result["strategies"][strategy] = scored
                print(
                    f"  {strategy:<9} R@5 {scored['r@5']}  R@10 {scored['r@10']}  "
                    f"session@5 {scored[SESSION_METRIC]}  "
                    f"p50 {scored['p50_ms']} ms  p99 {scored['p99_ms']} ms  "
                    f"errors {scored['errors']}  ({wall:.1f}s)",
                    flush=True,
                )
            # hybrid as ranked, without folding near-duplicates (docs/adr/0094-what-recall-
            # hands-an-agent.md): what folding costs or gains on turns that are not
            # near-duplicates of each other.
            answers = await ask(
                nc,
                token,
                "hybrid",
                work,
                args.concurrency,
                args.request_timeout,
                {"collapse_similar": False},
            )
            scored = score("hybrid", answers)
            result["strategies"][UNFOLDED] = scored
            print(
                f"  {UNFOLDED} R@5 {scored['r@5']}  R@10 {scored['r@10']}  "
                f"session@5 {scored[SESSION_METRIC]}",
                flush=True,
            )
            # hybrid again under other settings, each method's effect measured in the same
            # run: rank fusion (SPEC 5.1's RRF) instead of the convex score combination,
            # and without the neighbourhood and/or time grounding.
            for label, semantic_recall in HYBRID_VARIANTS.items() if args.variants else ():
                for agent in agents.values():
                    await _call(
                        nc,
                        CONFIG_PUT,
                        {
                            "agent_config_id": str(agent),
                            "config": {"semantic_recall": semantic_recall},
                        },
                        token,
                        timeout=10,
                    )
                await asyncio.sleep(1.2)  # the recall service trusts a config for a second
                answers = await ask(nc, token, "hybrid", work, args.concurrency, args.request_timeout)
                scored = score("hybrid", answers)
                result["strategies"][label] = scored
                print(
                    f"  {label} R@5 {scored['r@5']}  R@10 {scored['r@10']}  "
                    f"session@5 {scored[SESSION_METRIC]}  "
                    f"p50 {scored['p50_ms']} ms  p99 {scored['p99_ms']} ms",
                    flush=True,
                )
    return result


def render(results: dict[str, Any]) -> str:
    rows = [
        "| embedder | strategy | R@5 | R@10 | session any-hit@5 | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        for strategy, s in run.get("strategies", {}).items():
            extra = f" ({s['errors']} errors)" if s["errors"] else ""
            rows.append(
                f"| {run['embedder']} | {strategy}{extra} | {s['r@5']:.3f} | {s['r@10']:.3f} | "
                f"{s[SESSION_METRIC]:.3f} | {s['p50_ms']} | {s['p99_ms']} |"
            )
        if "error" in run:
            rows.append(f"| {run['embedder']} | FAILED: {run['error'][:120]} | | | | | |")
    for name, reason in results["skipped_embedders"].items():
        rows.append(f"| {name} | skipped: {reason[:120]} | | | | | |")
    for label, r5, r10 in REFERENCE:
        rows.append(f"| reference | {label} | {r5:.3f} | {r10:.3f} | | | |")
    rows += ["", "Per LoCoMo category, R@5 / R@10 / session any-hit@5:", ""]
    rows.append("| embedder | strategy | " + " | ".join(CATEGORY_NAMES.values()) + " |")
    rows.append("|---|---|" + "---|" * len(CATEGORY_NAMES))
    for run in results["runs"]:
        for strategy, s in run.get("strategies", {}).items():
            cats = s.get("by_category", {})
            cells = [
                f"{cats[str(c)]['r@5']:.3f} / {cats[str(c)]['r@10']:.3f} / {cats[str(c)][SESSION_METRIC]:.3f}"
                if str(c) in cats
                else ""
                for c in CATEGORY_NAMES
            ]
            rows.append(f"| {run['embedder']} | {strategy} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


async def main(args: argparse.Namespace) -> int:
    data_dir: Path = args.data
    files = sorted(data_dir.glob("*.json")) if data_dir.is_dir() else []
    if not files:
        print(f"LoCoMo data not found at {data_dir} (set --data or ENGRAM_EVAL_DATA); skipping the eval.")
        return 0
    convs = [load_conversation(p) for p in files]
    questions = sum(len(c.questions) for c in convs)
    print(
        f"LoCoMo: {len(convs)} conversations, {sum(len(c.turns) for c in convs)} turns, "
        f"{questions} questions (categories 1-4 with evidence) from {data_dir}",
        flush=True,
    )
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "dataset": {
            "path": str(data_dir),
            "conversations": [c.name for c in convs],
            "turns": sum(len(c.turns) for c in convs),
            "questions": questions,
            "questions_by_category": dict(Counter(str(q.category) for c in convs for q in c.questions)),
            "questions_without_evidence": sum(c.questions_without_evidence for c in convs),
            "evidence_dropped": [{"conversation": c.name, **d} for c in convs for d in c.evidence_dropped],
        },
        "settings": {
            "top_k": TOP_K,
            "ks": list(KS),
            "concurrency": args.concurrency,
            "strategies": STRATEGIES,
        },
        "reference": [{"method": m, "r@5": a, "r@10": b} for m, a, b in REFERENCE],
        "runs": [],
        "skipped_embedders": {},
    }
    failed = False
    for name in args.embedder or EMBEDDERS:
        reason = embedder_unavailable(name)
        if reason:
            print(f"[{name}] skipped: {reason}", flush=True)
            results["skipped_embedders"][name] = reason
            continue
        print(f"[{name}]", flush=True)
        t0 = time.perf_counter()
        try:
            run = await run_embedder(name, convs, args)
        except EvalError as exc:
            print(f"[{name}] FAILED: {exc}", file=sys.stderr, flush=True)
            run, failed = {"embedder": name, "error": str(exc)}, True
        run["total_s"] = round(time.perf_counter() - t0, 1)
        results["runs"].append(run)
    print()
    write_report(args.out, results, render(results))
    return 1 if failed else 0


if __name__ == "__main__":
    parser = script_parser(__doc__)
    parser.add_argument("--embedder", action="append", choices=EMBEDDERS, help="repeatable; default: both")
    parser.add_argument("--data", type=Path, default=default_data_dir())
    parser.add_argument("--out", type=Path, default=Path("bench-results/eval.json"))
    parser.add_argument("--concurrency", type=int, default=8, help="recall requests in flight")
    parser.add_argument("--index-timeout", type=float, default=900.0, help="seconds to wait for embeddings")
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument(
        "--strategy", action="append", choices=STRATEGIES, help="repeatable; default: all, in order"
    )
    parser.add_argument(
        "--no-variants",
        dest="variants",
        action="store_false",
        help="skip hybrid's method variants (a shorter run on a loaded machine)",
    )
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main(parser.parse_args())))
