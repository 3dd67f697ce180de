"""Which recall-quality methods help hybrid on LoCoMo, each measured on its own (``python -m
tests.eval.ablation``): evidence recall@5/@10 per LoCoMo category and overall, on a tune split and
a held-out split of the dev data.

The conversations are stored once through Engram's real write path, as ``make eval`` does
(:mod:`tests.eval.locomo`: all-MiniLM-L6-v2, one agent config per conversation, the shared pool,
one save request per LoCoMo session with its ``session_id`` and ``occurred_at``), and embedded by
the embed service. Then the services stop and, per question, hybrid's two legs are run once
in-process exactly as recall runs them (the dense search and ``cue_statistics`` + the lexical
sparse search, each ``HYBRID_FETCH`` deep, the hits re-checked through
``queries.ranking_inputs`` and each leg cut to its best ``HYBRID_DEPTH``), and so are the
hits' session neighbours (``queries.adjacent``, read from the stored ``session_position``). Every
method re-ranks those same legs with the product's own functions where it has them, so
differences are the methods', not the retrievers' or the machine's; ``convex`` here is what
``make eval``'s hybrid was before neighbourhood and time grounding.

Split: conversations 26 and 30 are the tune split, 41, 42 and 43 held out. Each method's constant
is its literature default or was chosen before measuring, except the neighbourhood's reach, chosen
on the tune split alone (the variants ±1 to ±4 are listed); a method is kept only if it helps on
both splits.

Methods (``VARIANTS``):

- ``convex``: the product's fusion (``fuse_convex``: min-max normalized scores, equal weights).
- ``rrf``: reciprocal rank fusion (k=60), SPEC 5.1's reference.
- ``dbsf``: distribution-based score fusion (each leg's scores scaled by its own mean ± 3 standard
  deviations, Qdrant's DBSF): uses the score distribution, no constant beyond that convention.
- ``entities x2``: query-side question handling: lexemes of capitalized words (names, places)
  count twice in the lexical query. Stop words and question words are already gone (Postgres's
  English stop list), so that part of question handling is the baseline.
- ``mmr``: maximal marginal relevance (λ = 0.5, Carbonell & Goldstein's balanced setting) over the
  fused top 50 by cosine between entry vectors: near-duplicate turns give way to others.
- ``neighbourhood ±r``: ``with_neighbours``: an entry d places from one of the first ten fused
  hits in its session gains 0.5^d of the hit's score, for d up to r, and joins the candidates
  (the product reaches 2).
- ``time grounding``: ``grounded``: entries whose ``occurred_at`` falls within a date the cue
  names come first (``services/recall/time_grounding.py``).
- ``hybrid (product)``: convex, then neighbourhood ±2, then time grounding, as recall runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import numpy as np
from sqlalchemy import func, select

from services.recall.candidates import Candidate
from services.recall.ranking import NEIGHBOUR_REACH, Ranked, fuse_convex, fuse_hybrid, with_neighbours
from services.recall.service import HYBRID_FETCH, best_allowed
from services.recall.time_grounding import Period, cue_periods, grounded
from services.runtime import build_embedder, build_vector_index, running_services
from shared.runtime.settings import EngramSettings
from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.entries import recall as queries
from shared.text.lexical import query_weights, term_index
from tests.eval.locomo import (
    CATEGORY_NAMES,
    Conversation,
    Question,
    default_data_dir,
    load_conversation,
    settle_rows,
    store,
    wait_indexed,
)
from tests.eval.stack import eval_stack, script_parser, service_token, write_report

EMBEDDER = "all-MiniLM-L6-v2"
TUNE = ("26", "30")
#: The neighbourhood reaches compared (the product's is NEIGHBOUR_REACH).
MAX_REACH = 4
TOP_K = 10
KS = (5, 10)


@dataclass
class Legs:
    """One question's retrieval, as recall computes it."""

    question: Question
    conversation: str
    dense: dict[UUID, float]
    lexical: dict[UUID, float]
    lexical_entities: dict[UUID, float]
    #: the legs' hits the scope allows, as ``ranking_inputs`` reads them
    candidates: dict[UUID, Candidate]
    #: each candidate's session neighbours up to MAX_REACH places away (``queries.adjacent``)
    adjacent: dict[UUID, list[tuple[int, Candidate]]]
    periods: list[Period]
    #: entry id -> LoCoMo dia_id, for every stored turn of the conversation
    dia: dict[UUID, str]


Ranker = Callable[[Legs, dict[UUID, np.ndarray]], list[UUID]]


def _ids(ranked: Sequence[Ranked]) -> list[UUID]:
    return [r.candidate.id for r in ranked]


def _convex(legs: Legs, lexical: dict[UUID, float] | None = None) -> list[Ranked]:
    cands = list(legs.candidates.values())
    lex = legs.lexical if lexical is None else lexical
    return fuse_convex(cands, lex, legs.dense, len(cands), utcnow())


def convex(legs: Legs, _: dict[UUID, np.ndarray]) -> list[UUID]:
    return _ids(_convex(legs))


def rrf(legs: Legs, _: dict[UUID, np.ndarray]) -> list[UUID]:
    cands = list(legs.candidates.values())
    return _ids(fuse_hybrid(cands, list(legs.lexical), list(legs.dense), len(cands), utcnow()))


def _dbsf_scale(scores: dict[UUID, float]) -> dict[UUID, float]:
    if len(scores) < 2:
        return dict.fromkeys(scores, 1.0)
    mean, sd = statistics.fmean(scores.values()), statistics.pstdev(scores.values())
    if sd <= 1e-12:
        return dict.fromkeys(scores, 1.0)
    low, high = mean - 3 * sd, mean + 3 * sd
    return {i: min(1.0, max(0.0, (s - low) / (high - low))) for i, s in scores.items()}


def _ordered(scores: dict[UUID, float]) -> list[UUID]:
    return sorted(scores, key=lambda i: (-scores[i], str(i)))


def dbsf(legs: Legs, _: dict[UUID, np.ndarray]) -> list[UUID]:
    lex = _dbsf_scale({i: s for i, s in legs.lexical.items() if i in legs.candidates})
    vec = _dbsf_scale({i: s for i, s in legs.dense.items() if i in legs.candidates})
    return _ordered({i: vec.get(i, 0.0) + lex.get(i, 0.0) for i in {*lex, *vec}})


def entities(legs: Legs, _: dict[UUID, np.ndarray]) -> list[UUID]:
    return _ids(_convex(legs, legs.lexical_entities))


def mmr(legs: Legs, vectors: dict[UUID, np.ndarray], lam: float = 0.5, pool: int = 50) -> list[UUID]:
    fused = {r.candidate.id: r.score for r in _convex(legs)}
    ranked = _ordered(fused)[:pool]
    chosen: list[UUID] = []
    while ranked and len(chosen) < TOP_K:
        best, best_value = ranked[0], -math.inf
        for i in ranked:
            redundancy = max((float(vectors[i] @ vectors[j]) for j in chosen), default=0.0)
            value = lam * fused[i] - (1 - lam) * redundancy
            if value > best_value:
                best, best_value = i, value
        chosen.append(best)
        ranked.remove(best)
    return chosen


def _neighbours(legs: Legs, reach: int) -> list[Ranked]:
    """As recall: the neighbours of the first ``TOP_K`` fused hits."""
    fused = _convex(legs)
    near = {
        r.candidate.id: [(d, c) for d, c in legs.adjacent.get(r.candidate.id, []) if d <= reach]
        for r in fused[:TOP_K]
    }
    return with_neighbours(fused, near)


def neighbourhood(reach: int) -> Ranker:
    return lambda legs, _: _ids(_neighbours(legs, reach))


def time_grounding(legs: Legs, _: dict[UUID, np.ndarray]) -> list[UUID]:
    return _ids(grounded(_convex(legs), legs.periods))


def product(legs: Legs, _: dict[UUID, np.ndarray]) -> list[UUID]:
    return _ids(grounded(_neighbours(legs, NEIGHBOUR_REACH), legs.periods))


VARIANTS: dict[str, Ranker] = {
    "convex": convex,
    "rrf": rrf,
    "dbsf": dbsf,
    "entities x2": entities,
    "mmr": mmr,
    **{f"neighbourhood ±{r}": neighbourhood(r) for r in range(1, MAX_REACH + 1)},
    "time grounding": time_grounding,
    "hybrid (product)": product,
}


def _score(all_legs: list[Legs], ranker: Ranker, vectors: dict[UUID, np.ndarray]) -> dict[str, Any]:
    per_cat: dict[str, dict[int, list[float]]] = defaultdict(lambda: {k: [] for k in KS})
    for legs in all_legs:
        dia = [legs.dia.get(i) for i in ranker(legs, vectors)]
        evidence = set(legs.question.evidence)
        for k in KS:
            r = len({d for d in dia[:k] if d} & evidence) / len(evidence)
            per_cat["overall"][k].append(r)
            per_cat[CATEGORY_NAMES[legs.question.category]][k].append(r)
    return {
        name: {"n": len(v[KS[0]]), **{f"r@{k}": round(statistics.fmean(v[k]), 4) for k in KS}}
        for name, v in per_cat.items()
    }


async def _retrieve(
    settings: EngramSettings, org: UUID, agents: dict[str, UUID], convs: list[Conversation]
) -> tuple[list[Legs], dict[UUID, np.ndarray]]:
    embedder = build_embedder(settings)
    index = build_vector_index(settings, embedder)
    assert index is not None
    db = Database(settings.database_url, pool_size=2)
    out: list[Legs] = []
    vectors: dict[UUID, np.ndarray] = {}
    try:
        for conv in convs:
            agent = agents[conv.name]
            scope = queries.Scope(org_id=org, agent_config_id=agent, owner_keys=("",), now=utcnow())
            tenant = scope.tenant()
            everything = await queries.newest(db, scope, 5000)
            dia = {c.id: str(c.metadata.get("dia_id")) for c in everything}
            for c, v in zip(everything, await embedder.embed([c.text for c in everything]), strict=True):
                vectors[c.id] = np.asarray(v, dtype=np.float32)
            cue_vectors = await embedder.embed([q.question for q in conv.questions])
            for q, cue_vector in zip(conv.questions, cue_vectors, strict=True):
                dense = {h.id: h.score for h in await index.search(cue_vector, tenant, HYBRID_FETCH)}
                documents, containing = await queries.cue_statistics(db, scope, q.question)
                async with db.read() as session:
                    capitalized = " ".join(re.findall(r"\b[A-Z][\w'-]*", q.question))
                    entity_lexemes = set(
                        (
                            await session.execute(
                                select(func.tsvector_to_array(func.to_tsvector("english", capitalized)))
                            )
                        ).scalar_one()
                    )
                weights = query_weights(documents, containing)
                boosted = dict(weights)
                for lexeme in entity_lexemes:
                    if term_index(lexeme) in boosted:
                        boosted[term_index(lexeme)] *= 2
                found = [await index.search_lexical(w, tenant, HYBRID_FETCH) for w in (weights, boosted)]
                hits = {*dense, *(h.id for leg in found for h in leg)}
                cands = {c.id: c for c in await queries.ranking_inputs(db, scope, list(hits))}
                # As recall: each leg's best HYBRID_DEPTH that the scope allows.
                dense = best_allowed(dense, cands)
                lexical, lexical_e = (best_allowed({h.id: h.score for h in leg}, cands) for leg in found)
                adjacent = await queries.adjacent(db, scope, list(cands), MAX_REACH)
                out.append(
                    Legs(
                        q,
                        conv.name,
                        {i: s for i, s in dense.items() if i in cands},
                        lexical,
                        lexical_e,
                        {i: c for i, c in cands.items() if i in dense or i in lexical or i in lexical_e},
                        adjacent,
                        cue_periods(q.question),
                        dia,
                    )
                )
    finally:
        await index.close()
        await db.close()
    return out, vectors


async def main(args: argparse.Namespace) -> int:
    files = sorted(args.data.glob("*.json")) if args.data.is_dir() else []
    if not files:
        print(f"LoCoMo data not found at {args.data}; skipping the ablation.")
        return 0
    convs = [load_conversation(p) for p in files]
    async with eval_stack("engram-ablation-", EMBEDDER) as (settings, nc, pg):
        org = uuid4()
        agents = {c.name: uuid4() for c in convs}
        async with running_services(settings):
            token = service_token(org, "locomo-ablation", 12 * 3600)
            t0 = time.perf_counter()
            await asyncio.gather(*(store(nc, token, agents[c.name], c) for c in convs))
            total = sum(len(c.turns) for c in convs)
            await settle_rows(pg, agents, total, timeout=120)
            stored = await pg.fetchval("SELECT count(*) FROM memory_entries WHERE org_id = $1", org)
            await wait_indexed(pg, org, stored, 900)
            print(f"stored and indexed {stored} turns in {time.perf_counter() - t0:.0f}s", flush=True)
        t0 = time.perf_counter()
        legs, vectors = await _retrieve(settings, org, agents, convs)
        print(f"retrieved {len(legs)} questions' legs in {time.perf_counter() - t0:.0f}s", flush=True)
    splits = {
        "tune": [x for x in legs if x.conversation in TUNE],
        "held-out": [x for x in legs if x.conversation not in TUNE],
        "all": legs,
    }
    results = {
        split: {name: _score(chosen, ranker, vectors) for name, ranker in VARIANTS.items()}
        for split, chosen in splits.items()
    }
    write_report(args.out, results, render(results))
    return 0


def render(results: dict[str, Any]) -> str:
    cats = ["overall", *CATEGORY_NAMES.values()]
    rows = []
    for split, by_variant in results.items():
        rows.append(f"\n{split} (R@5 / R@10)\n")
        rows.append("| method | " + " | ".join(cats) + " |")
        rows.append("|---|" + "---|" * len(cats))
        for name, scored in by_variant.items():
            cells = [f"{scored[c]['r@5']:.3f} / {scored[c]['r@10']:.3f}" if c in scored else "" for c in cats]
            rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    parser = script_parser(__doc__)
    parser.add_argument("--data", type=Path, default=default_data_dir())
    parser.add_argument("--out", type=Path, default=Path("bench-results/ablation.json"))
    sys.exit(asyncio.run(main(parser.parse_args())))
