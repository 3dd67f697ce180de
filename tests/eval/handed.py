"""What an agent is handed (issue 26 §3), part of ``make eval``: for the demo's owners and a set
of failure cues, how many near-duplicate pairs recall's top 10 holds and where the lesson that
resolves the failure ranks — with recall's folding (the default) and without it
(``collapse_similar: false``), in the same run.

The demo (services/cli/demo_data.py) is published as ``engram demo`` publishes it — every session
through ``engram.session.ended`` with ``keep_observations`` on, so raw tool calls are kept beside
the lessons — into a fresh stack (a nats-server from the wheel, a throwaway Postgres database,
every service in-process), and the harness waits until every session is distilled or skipped and
every entry is indexed. Then each cue of ``CUES`` is asked by its owner (a service token acting on
its behalf), ``hybrid``, ``top_k`` 10.

- **Near-duplicate pairs**: pairs of results whose texts the embedder places at cosine similarity
  at least ``JUDGE_COSINE`` — a judge independent of the word sets recall folds by. The rate is
  such pairs over all pairs of results, over every cue.
- **Rank of the resolving lesson**: the first result matching the cue's pattern (the lesson that
  says what worked: ``store_credit`` for a declined card refund …), 1-based; ``None`` when it is not
  in the top 10. Goal: no near-duplicate pair, and the lesson in the top 3.

Run alone: ``python -m tests.eval.handed``; results in ``bench-results/handed.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from contracts.subjects import CONFIG_PUT, RECALL
from services.cli.demo_data import demo_sessions
from services.runtime import build_embedder, running_services
from tests.eval.locomo import EMBEDDERS, EvalError, _call, embedder_unavailable, wait_indexed
from tests.eval.stack import eval_stack, script_parser, service_token, write_report
from tests.platform import publish_session

TOP_K = 10
#: Two results are near-duplicates when the embedder puts them this close: the demo's copies of
#: one failure (an observation per failed call, the failure lesson) are at 0.9 and above with
#: all-MiniLM-L6-v2; two different lessons about one tool are below.
JUDGE_COSINE = 0.9
ORG_A, ORG_B = "a", "b"


@dataclass(frozen=True)
class Cue:
    org: str
    owner: str
    cue: str
    #: what the resolving lesson says (a regular expression, case-insensitive)
    resolves: str


CUES = (
    Cue(ORG_A, "end_user:alice", "my card got declined", r"store_credit"),
    Cue(ORG_A, "end_user:alice", "refund card declined", r"store_credit"),
    Cue(ORG_A, "end_user:alice", "the refund to my card failed", r"store_credit"),
    Cue(
        ORG_A,
        "end_user:bob",
        "order lookup by email found nothing",
        r"order number first|retrying lookup_order",
    ),
    Cue(ORG_A, "actor:carol", "create ticket rate limited", r"backoff_s"),
    Cue(ORG_A, "actor:carol", "opening a ticket fails with HTTP 429", r"backoff_s"),
    Cue(ORG_A, "none", "send email digest connection reset", r"port=465"),
    Cue(ORG_A, "none", "the digest e-mail did not go out", r"port=465"),
    Cue(ORG_A, "actor:dev-raj", "tests failing before push", r"TZ"),
    Cue(ORG_A, "actor:dev-raj", "git push rejected non-fast-forward", r"rebase_first"),
    Cue(ORG_A, "actor:dev-mia", "exchange rates API rate limited", r"cache"),
    Cue(ORG_A, "actor:dev-mia", "push rejected: secret detected", r"vault|retrying git_push"),
    Cue(ORG_B, "end_user:gus", "flight sold out", r'fare="M"'),
    Cue(ORG_B, "actor:agent-hana", "flight status returned HTTP 503", r"v2/flights"),
)


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # the embedder's vectors are unit length


async def near_duplicate_pairs(embedder: Any, texts: list[str]) -> tuple[list[tuple[int, int, float]], int]:
    """The near-duplicate pairs among ``texts`` (their places, 1-based, and cosine), and how many
    pairs there are."""
    if len(texts) < 2:
        return [], 0
    vectors = await embedder.embed(texts)
    pairs = [(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))]
    scored = ((i + 1, j + 1, round(_cosine(vectors[i], vectors[j]), 3)) for i, j in pairs)
    return [p for p in scored if p[2] >= JUDGE_COSINE], len(pairs)


async def wait_distilled(pg: asyncpg.Connection, orgs: list[UUID], sessions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = await pg.fetchval(
            "SELECT count(*) FROM audit_log WHERE org_id = ANY($1::uuid[]) "
            "AND kind IN ('distill.completed', 'distill.skipped')",
            orgs,
        )
        if done >= sessions:
            return
        if time.monotonic() > deadline:
            raise EvalError(f"only {done}/{sessions} demo sessions distilled after {timeout:.0f}s")
        await asyncio.sleep(0.3)


async def run(embedder_name: str, timeout: float) -> dict[str, Any]:
    async with eval_stack("engram-handed-", embedder_name, vector_store="") as (settings, nc, pg):
        judge = build_embedder(settings)
        async with running_services(settings):
            return await _measure(nc, pg, judge, timeout)


async def _measure(nc: Any, pg: asyncpg.Connection, judge: Any, timeout: float) -> dict[str, Any]:
    orgs = {ORG_A: (uuid4(), uuid4()), ORG_B: (uuid4(), uuid4())}
    token = {name: service_token(org, "handed-eval", 3600) for name, (org, _) in orgs.items()}
    for name, (_, agent) in orgs.items():
        config = {"agent_config_id": str(agent), "config": {"keep_observations": True}}
        await _call(nc, CONFIG_PUT, config, token[name], timeout=10)
    (org_a, agent_a), (org_b, agent_b) = orgs[ORG_A], orgs[ORG_B]
    sessions = demo_sessions(org_a, agent_a, org_b, agent_b, now=datetime.now(UTC))
    for s in sessions:
        await publish_session(nc, s, token[ORG_A if s["org_id"] == str(org_a) else ORG_B])
    await wait_distilled(pg, [org_a, org_b], len(sessions), timeout)
    for org, _ in orgs.values():
        total = await pg.fetchval("SELECT count(*) FROM memory_entries WHERE org_id = $1", org)
        await wait_indexed(pg, org, total, timeout)
    out: dict[str, Any] = {"sessions": len(sessions), "cues": len(CUES), "judge_cosine": JUDGE_COSINE}
    for label, collapse in (("folded", True), ("as ranked", False)):
        per_cue = []
        for c in CUES:
            org, agent = orgs[c.org]
            kind, _, ident = c.owner.partition(":")
            principal = {"kind": kind} if kind == "none" else {"kind": kind, "id": ident}
            payload = {
                "agent_config_id": str(agent),
                "principal": principal,
                "strategy": "hybrid",
                "cue": c.cue,
                "top_k": TOP_K,
                "collapse_similar": collapse,
            }
            reply = await _call(nc, RECALL, payload, token[c.org], timeout=30)
            texts = [r["text"] for r in reply["results"]]
            close, pairs = await near_duplicate_pairs(judge, texts)
            rank = next((i + 1 for i, t in enumerate(texts) if re.search(c.resolves, t, re.IGNORECASE)), None)
            per_cue.append(
                {
                    "owner": c.owner,
                    "cue": c.cue,
                    "results": len(texts),
                    "near_duplicate_pairs": len(close),
                    "near_duplicates": [
                        {"places": [i, j], "cosine": cos, "texts": [texts[i - 1], texts[j - 1]]}
                        for i, j, cos in close
                    ],
                    "pairs": pairs,
                    "resolving_rank": rank,
                    "folded": sum(int(r.get("similar_count") or 0) for r in reply["results"]),
                    "top3": texts[:3],
                }
            )
        ranks = [p["resolving_rank"] for p in per_cue]
        out[label] = {
            "near_duplicate_pair_rate": round(
                sum(p["near_duplicate_pairs"] for p in per_cue) / max(1, sum(p["pairs"] for p in per_cue)), 4
            ),
            "cues_with_a_near_duplicate_pair": sum(1 for p in per_cue if p["near_duplicate_pairs"]),
            "resolving_in_top3": sum(1 for r in ranks if r is not None and r <= 3),
            "resolving_missing": sum(1 for r in ranks if r is None),
            "resolving_mean_rank": round(statistics.fmean(r for r in ranks if r is not None), 2)
            if any(r is not None for r in ranks)
            else None,
            "per_cue": per_cue,
        }
    return out


def render(result: dict[str, Any]) -> str:
    rows = [
        f"What an agent is handed: {result['cues']} failure cues over the demo's owners, hybrid top {TOP_K}",
        "",
        "| recall | near-duplicate pair rate | cues with a pair | resolving lesson in top 3 | not in top 10 "
        "| mean rank |",
        "|---|---|---|---|---|---|",
    ]
    for label in ("as ranked", "folded"):
        s = result[label]
        rows.append(
            f"| {label} | {s['near_duplicate_pair_rate']:.3f} | {s['cues_with_a_near_duplicate_pair']} | "
            f"{s['resolving_in_top3']}/{result['cues']} | {s['resolving_missing']} | "
            f"{s['resolving_mean_rank']} |"
        )
    rows += [
        "",
        "| owner | cue | rank as ranked | rank folded | pairs as ranked | pairs folded |",
        "|---|---|---|---|---|---|",
    ]
    for before, after in zip(result["as ranked"]["per_cue"], result["folded"]["per_cue"], strict=True):
        rows.append(
            f"| {before['owner']} | {before['cue']} | {before['resolving_rank']} | "
            f"{after['resolving_rank']} | {before['near_duplicate_pairs']} | "
            f"{after['near_duplicate_pairs']} |"
        )
    return "\n".join(rows)


def pick_embedder() -> str:
    """all-MiniLM-L6-v2 (the judge needs meaning, not hashed words) where it runs, else hashing."""
    return "hashing-384" if embedder_unavailable("all-MiniLM-L6-v2") else "all-MiniLM-L6-v2"


async def main(args: argparse.Namespace) -> int:
    name = args.embedder or pick_embedder()
    print(f"[what an agent is handed: {name}]", flush=True)
    result = {"embedder": name, **(await run(name, args.timeout))}
    write_report(args.out, result, render(result))
    return 0


if __name__ == "__main__":
    parser = script_parser(__doc__)
    parser.add_argument("--embedder", choices=EMBEDDERS)
    parser.add_argument("--out", type=Path, default=Path("bench-results/handed.json"))
    parser.add_argument("--timeout", type=float, default=300.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
