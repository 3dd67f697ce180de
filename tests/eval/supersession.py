"""Knowledge updates (issue 26 §1), part of ``make eval``: how well Engram tells an update from a
look-alike, and whether a question about the present finds the present.

The labelled set is ``tests/eval/data/supersession.jsonl`` (:mod:`tests.eval.supersession_data`:
240 update pairs and 240 non-update look-alikes, from templates).

- **Offline rules** (no model, no servers): supersession precision and recall of
  :func:`shared.text.supersession.judge_pair` over every pair, and per category.
- **Through the write path** (a fresh stack: a nats-server from the wheel, a throwaway Postgres
  database, every service in-process): each pair gets an owner of its own (an end user) in one
  agent config; the old text is saved (``engram.memory.save``, ``wait: true``), then the new one;
  what Postgres then holds gives the end-to-end precision and recall (the candidates' full-text
  neighbourhood included). The same pairs go into a second agent config with
  ``knowledge_updates: false``: the figures without supersession, in the same run.
- **Current first**: for each update pair, its ``question`` (about the present) is asked by its
  owner, ``hybrid``, ``top_k`` 10; the rate at which the new entry ranks first, in both agent
  configs. **History reachable**: its ``past`` question (about before): the rate at which the old
  entry is in the top 5 (with supersession: through the history a past cue reaches).

Run alone: ``python -m tests.eval.supersession``; results in ``bench-results/supersession.json``.
``--offline`` scores the rules only (seconds, no servers). With a model endpoint
(``--model-url``, default ``ENGRAM_DISTILL_MODEL_URL``; ``--model``, default ``ENGRAM_DISTILL_MODEL``)
the rules and the judge are also scored together, as the save path uses them: the pairs the rules
leave undecided but that look related go to the model (skipped where no endpoint is configured).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from contracts.subjects import CONFIG_PUT, MEMORY_SAVE, RECALL
from services.runtime import running_services
from shared.adapters.judges import OpenAICompatJudge
from shared.text.supersession import judge_pair, maybe_related
from tests.eval.handed import pick_embedder
from tests.eval.locomo import EMBEDDERS, EvalError, _call, wait_indexed
from tests.eval.stack import eval_stack, script_parser, service_token, write_report
from tests.eval.supersession_data import Pair, load

TOP_K = 10
PAST_K = 5
IN_FLIGHT = 8


def _scores(said: list[tuple[Pair, bool]]) -> dict[str, Any]:
    tp = sum(1 for p, yes in said if yes and p.label == "update")
    fp = sum(1 for p, yes in said if yes and p.label == "lookalike")
    fn = sum(1 for p, yes in said if not yes and p.label == "update")
    return {
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / (tp + fn), 4) if tp + fn else None,
        "true_positives": tp,
        "false_positives": fp,
        "false_negatives": fn,
    }


def offline(pairs: list[Pair]) -> dict[str, Any]:
    """The rules alone over every pair: overall, per category, and the pairs they got wrong."""
    said = [(p, judge_pair(p.old, p.new).supersedes) for p in pairs]
    per_category: dict[str, Any] = {}
    for category in dict.fromkeys(p.category for p in pairs):
        mine = [(p, yes) for p, yes in said if p.category == category]
        label = mine[0][0].label
        right = sum(1 for p, yes in mine if yes == (p.label == "update"))
        per_category[category] = {"label": label, "pairs": len(mine), "right": right}
    wrong = [
        {"id": p.id, "label": p.label, "old": p.old, "new": p.new}
        for p, yes in said
        if yes != (p.label == "update")
    ]
    return {**_scores(said), "per_category": per_category, "wrong": wrong}


async def with_judge(pairs: list[Pair], url: str, model: str) -> dict[str, Any]:
    """The rules, then the model for related pairs they did not accept (as the save path asks)."""
    judge = OpenAICompatJudge(url, model)
    asked = unanswered = 0
    said: list[tuple[Pair, bool]] = []
    try:
        for p in pairs:
            yes = judge_pair(p.old, p.new).supersedes
            if not yes and maybe_related(p.old, p.new):
                asked += 1
                answer = await judge.supersedes(p.old, p.new)
                unanswered += answer is None
                yes = bool(answer)
            said.append((p, yes))
    finally:
        await judge.aclose()
    return {**_scores(said), "model": model, "asked": asked, "unanswered": unanswered}


def _owner(pair: Pair) -> dict[str, str]:
    return {"kind": "end_user", "id": f"eval-{pair.id}"}


async def _save_all(
    nc: Any, pg: asyncpg.Connection, token: str, agent: UUID, texts: list[tuple[str, Pair]], total: int
) -> None:
    """Save each text for its pair's owner (accepted at once, ``wait`` off: under load a waiting
    save can outlast its deadline), then wait until the agent config holds ``total`` entries."""
    for text, pair in texts:
        body = {
            "agent_config_id": str(agent),
            "principal": _owner(pair),
            "entries": [{"text": text, "memory_type": "fact"}],
        }
        await _call(nc, MEMORY_SAVE, body, token, timeout=30)
    deadline = time.monotonic() + 600
    while True:
        stored = await pg.fetchval("SELECT count(*) FROM memory_entries WHERE agent_config_id = $1", agent)
        if stored >= total:
            return
        if time.monotonic() > deadline:
            raise EvalError(f"only {stored}/{total} entries stored after 600 s")
        await asyncio.sleep(0.5)


async def _rank(nc: Any, token: str, agent: UUID, pair: Pair, cue: str, entry_id: str) -> int | None:
    body = {
        "agent_config_id": str(agent),
        "principal": _owner(pair),
        "strategy": "hybrid",
        "cue": cue,
        "top_k": TOP_K,
    }
    reply = await _call(nc, RECALL, body, token, timeout=30)
    ids = [str(r["id"]) for r in reply["results"]]
    return ids.index(entry_id) + 1 if entry_id in ids else None


async def through_the_stack(pairs: list[Pair], embedder: str, timeout: float) -> dict[str, Any]:
    async with (
        eval_stack("engram-supersession-", embedder, vector_store="") as (settings, nc, pg),
        running_services(settings),
    ):
        return await _measure(nc, pg, pairs, timeout)


async def _measure(nc: Any, pg: asyncpg.Connection, pairs: list[Pair], timeout: float) -> dict[str, Any]:
    org = uuid4()
    token = service_token(org, "supersession-eval", 3600)
    agents = {"with": uuid4(), "without": uuid4()}
    for name, agent in agents.items():
        config = {"retention": {"max_entries": 5000}, "knowledge_updates": name == "with"}
        await _call(nc, CONFIG_PUT, {"agent_config_id": str(agent), "config": config}, token, timeout=10)
    # All old texts first, then all new ones: each pair's owner is its own, so only the order
    # within a pair matters (the old one stored before the new one arrives).
    for agent in agents.values():
        await _save_all(nc, pg, token, agent, [(p.old, p) for p in pairs], len(pairs))
        await _save_all(nc, pg, token, agent, [(p.new, p) for p in pairs], 2 * len(pairs))
    await wait_indexed(pg, org, len(pairs) * 4, timeout)
    ids: dict[tuple[str, str], tuple[str, str]] = {}
    rows = await pg.fetch(
        "SELECT id, agent_config_id, owner_id, text FROM memory_entries WHERE org_id = $1", org
    )
    by_key = {(r["agent_config_id"], r["owner_id"], r["text"]): str(r["id"]) for r in rows}
    for name, agent in agents.items():
        for p in pairs:
            owner = _owner(p)["id"]
            ids[(name, p.id)] = (by_key[(agent, owner, p.old)], by_key[(agent, owner, p.new)])
    gate = asyncio.Semaphore(IN_FLIGHT)
    superseded = {
        (str(r["superseded_by"]), str(r["id"]))
        for r in await pg.fetch(
            "SELECT id, superseded_by FROM memory_entries WHERE org_id = $1 AND valid_until IS NOT NULL", org
        )
    }
    out: dict[str, Any] = {"pairs": len(pairs)}
    for name in agents:
        said = [(p, (ids[(name, p.id)][1], ids[(name, p.id)][0]) in superseded) for p in pairs]
        current: list[int | None] = []
        past: list[int | None] = []
        updates = [p for p in pairs if p.label == "update"]

        async def ask(pair: Pair, name: str = name) -> tuple[int | None, int | None]:
            old, new = ids[(name, pair.id)]
            async with gate:
                assert pair.question is not None
                now = await _rank(nc, token, agents[name], pair, pair.question, new)
                before = await _rank(nc, token, agents[name], pair, pair.past, old) if pair.past else None
            return now, before

        answers = await asyncio.gather(*(ask(p) for p in updates))
        current = [a for a, _ in answers]
        past = [b for (_, b), p in zip(answers, updates, strict=True) if p.past]
        out[name] = {
            **_scores(said),
            "current_first_rate": round(sum(1 for r in current if r == 1) / len(current), 4),
            "current_first_by_category": {
                c: round(
                    sum(1 for r, p in zip(current, updates, strict=True) if p.category == c and r == 1)
                    / sum(1 for p in updates if p.category == c),
                    3,
                )
                for c in dict.fromkeys(p.category for p in updates)
            },
            "history_in_top5_rate": round(
                sum(1 for r in past if r is not None and r <= PAST_K) / len(past), 4
            ),
        }
    return out


def render(result: dict[str, Any]) -> str:
    off = result["offline"]
    rows = [
        f"Knowledge updates: {result['updates']} update pairs, {result['lookalikes']} look-alikes",
        "",
        "| | precision | recall | current entry first (hybrid) | history in top 5 (past cue) |",
        "|---|---|---|---|---|",
        f"| offline rules | {off['precision']} | {off['recall']} | | |",
    ]
    judged = result.get("with_model")
    if judged:
        rows.append(f"| rules + {judged['model']} | {judged['precision']} | {judged['recall']} | | |")
    stack = result.get("stack")
    if stack:
        for name, label in (("without", "write path, knowledge_updates off"), ("with", "write path, on")):
            s = stack[name]
            rows.append(
                f"| {label} | {s['precision']} | {s['recall']} | {s['current_first_rate']} | "
                f"{s['history_in_top5_rate']} |"
            )
    mistakes = Counter(w["label"] for w in off["wrong"])
    rows += ["", f"offline mistakes: {dict(mistakes)} (full list in the JSON)"]
    return "\n".join(rows)


async def main(args: argparse.Namespace) -> int:
    pairs = load()
    result: dict[str, Any] = {
        "updates": sum(p.label == "update" for p in pairs),
        "lookalikes": sum(p.label == "lookalike" for p in pairs),
        "offline": offline(pairs),
    }
    if args.model_url:
        result["with_model"] = await with_judge(pairs, args.model_url, args.model)
    if not args.offline:
        name = args.embedder or pick_embedder()
        print(f"[knowledge updates: {name}]", flush=True)
        result["embedder"] = name
        result["stack"] = await through_the_stack(pairs, name, args.timeout)
    write_report(args.out, result, render(result))
    return 0


if __name__ == "__main__":
    parser = script_parser(__doc__)
    parser.add_argument("--embedder", choices=EMBEDDERS)
    parser.add_argument("--offline", action="store_true", help="score the offline rules only")
    parser.add_argument("--out", type=Path, default=Path("bench-results/supersession.json"))
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--model-url", default=os.environ.get("ENGRAM_DISTILL_MODEL_URL", ""))
    parser.add_argument("--model", default=os.environ.get("ENGRAM_DISTILL_MODEL", "gpt-4o-mini"))
    sys.exit(asyncio.run(main(parser.parse_args())))
