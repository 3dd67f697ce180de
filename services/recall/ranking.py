"""Recall strategies (SPEC 5.1, 5.2): pure orderings of already-scoped candidates.

Every function returns ``Ranked`` items in their final order. Ordered strategies (``last_k``,
``importance``, ``full``) put pinned entries first and score by position, ``1 / (1 + i)``, since
they have no relevance to report. Ranked strategies (``pack``, ``hybrid``, ``semantic``) score by
their formula and do not force pinned entries first. Ties always fall back to newest, then id, so
an order never depends on the order the store returned rows in. Quarantined candidates rank like
any other; the budget step replaces their text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from services.recall.candidates import Candidate, display_text
from shared.text.policy.normalize import normalize

__all__ = [
    "FULL_CAP",
    "HALF_LIFE_DAYS",
    "HYBRID_IMPORTANCE_PRIOR",
    "HYBRID_RECENCY_PRIOR",
    "LENGTH_SCALE",
    "NEIGHBOUR_REACH",
    "NEIGHBOUR_SHARE",
    "PACK_CHAR_BUDGET",
    "STOP_WORDS",
    "Ranked",
    "fuse_hybrid",
    "pack_score",
    "rank_full",
    "rank_importance",
    "rank_last_k",
    "rank_pack",
    "rank_semantic",
    "recency",
    "relevance",
    "tokens",
    "with_neighbours",
]

FULL_CAP = 1000
PACK_CHAR_BUDGET = 20_000
HALF_LIFE_DAYS = 30.0
#: ``L0`` of the relevance length damping: the entry length (in tokens) at which damping is 1/(1+ln 2).
LENGTH_SCALE = 20.0
#: Hybrid priors: at most 0.002 together, less than one list's RRF term for any rank below 440 (so
#: being found by one more retriever always outweighs them), and about the gap between ranks 1 and 9
#: of one list (so they break ties and nudge near neighbours, never reorder a list wholesale).
HYBRID_IMPORTANCE_PRIOR = 0.001
HYBRID_RECENCY_PRIOR = 0.001
#: What an entry gains from a hit next to it in its session, as a share of the hit's score: half,
#: the midpoint between ignoring a neighbour and counting it as the hit (chosen before measuring),
#: halving again with each further place (``share ** distance``).
NEIGHBOUR_SHARE = 0.5
#: How many places on each side of a hit its neighbourhood reaches: at three the share is 1/8,
#: and reaching further changed nothing on the evaluation's tune split
#: (docs/adr/0035-hybrid-neighbourhood.md).
NEIGHBOUR_REACH = 2

# fmt: off
STOP_WORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "do", "does", "for", "from", "how", "i",
    "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or", "our", "so",
    "that", "the", "their", "then", "there", "these", "this", "to", "was", "we", "were", "what",
    "when", "where", "which", "who", "why", "will", "with", "you", "your",
})
# fmt: on
_WORD = re.compile(r"\w+")


class Ranked(NamedTuple):
    """A candidate and its score (a named tuple for the reason :class:`Candidate` is one)."""

    candidate: Candidate
    score: float
    #: near-duplicates of this entry that recall left out (services/recall/distinct.py)
    similar: int = 0


def _tiebroken(cands: Iterable[Candidate]) -> list[Candidate]:
    """Newest first, then id ascending; later stable sorts by the primary key keep this as tiebreak."""
    out = sorted(cands, key=lambda c: c.id.int)  # a UUID orders by its int; comparing ints is cheaper
    out.sort(key=lambda c: c.created_at, reverse=True)  # reverse=True keeps the sort stable
    return out


def _ordered(cands: Iterable[Candidate], limit: int, *, by_importance: bool) -> list[Ranked]:
    out = _tiebroken(cands)
    if by_importance:
        out.sort(key=lambda c: c.importance, reverse=True)
    out.sort(key=lambda c: not c.pinned)
    return [Ranked(c, 1.0 / (1 + i)) for i, c in enumerate(out[: max(limit, 0)])]


def _by_score(cands: Iterable[Candidate], score: Callable[[Candidate], float]) -> list[Ranked]:
    ranked = [Ranked(c, score(c)) for c in _tiebroken(cands)]
    ranked.sort(key=lambda r: r.score, reverse=True)
    return ranked


def rank_last_k(cands: Sequence[Candidate], top_k: int) -> list[Ranked]:
    """``last_k``: pinned first, then newest (id breaks ties), the first ``top_k``."""
    return _ordered(cands, top_k, by_importance=False)


def rank_importance(cands: Sequence[Candidate], top_k: int) -> list[Ranked]:
    """``importance``: pinned first, then highest importance, then newest, the first ``top_k``."""
    return _ordered(cands, top_k, by_importance=True)


def rank_full(cands: Sequence[Candidate]) -> list[Ranked]:
    """``full``: pinned first, then newest, capped at ``FULL_CAP`` (1000)."""
    return _ordered(cands, FULL_CAP, by_importance=False)


def tokens(text: str) -> list[str]:
    """Lowercased word tokens (``\\w+``, so unicode letters and digits) minus ``STOP_WORDS``."""
    return [t for t in _WORD.findall(text.lower()) if t not in STOP_WORDS]


def relevance(cue_tokens: set[str], entry_tokens: Sequence[str]) -> float:
    """Cue coverage damped by entry length (SPEC 5.2)::

        relevance = |cue ∩ entry| / |cue|  *  1 / (1 + ln(1 + n / L0))

    with ``cue``/``entry`` the token *sets*, ``n`` the number of entry tokens (repeats counted)
    and ``L0 = LENGTH_SCALE`` (20). Coverage counts each cue token once, so repeating or padding
    an entry never raises it, while the damping strictly falls with length: a long entry cannot win
    by size alone, only by covering more of the cue. In [0, 1); 0 for an empty cue or entry.
    """
    if not cue_tokens or not entry_tokens:
        return 0.0
    coverage = len(cue_tokens.intersection(entry_tokens)) / len(cue_tokens)
    return coverage / (1.0 + math.log1p(len(entry_tokens) / LENGTH_SCALE))


def recency(created_at: datetime, now: datetime) -> float:
    """``0.5 ** (age_days / 30)``: 1 when new, 0.5 at 30 days; future timestamps count as new."""
    age_days = max((now - created_at).total_seconds(), 0.0) / 86_400
    return float(0.5 ** (age_days / HALF_LIFE_DAYS))


def pack_score(candidate: Candidate, cue_tokens: set[str], now: datetime) -> float:
    """``0.60·relevance + 0.25·importance + 0.15·recency``; without cue tokens the relevance term is
    dropped (``0.25·importance + 0.15·recency``)."""
    score = 0.25 * candidate.importance + 0.15 * recency(candidate.created_at, now)
    if cue_tokens:
        score += 0.60 * relevance(cue_tokens, tokens(candidate.text))
    return score


def rank_pack(
    cands: Sequence[Candidate],
    cue: str | None,
    top_k: int,
    now: datetime,
    char_budget: int = PACK_CHAR_BUDGET,
) -> list[Ranked]:
    """``pack`` (SPEC 5.2): score every candidate with :func:`pack_score`, then walk them best first,
    skipping any whose normalized text duplicates one already taken, until ``top_k`` are taken or
    the next one's text would push the total past ``char_budget`` characters — then stop (rank
    order is kept; a later, shorter entry does not jump the queue). Quarantined entries count the
    length of their placeholder. A cue with no tokens beyond stop words counts as no cue.
    """
    cue_tokens = set(tokens(cue or ""))
    taken: list[Ranked] = []
    seen: set[str] = set()
    chars = 0
    for r in _by_score(cands, lambda c: pack_score(c, cue_tokens, now)):
        if len(taken) >= top_k:
            break
        key = normalize(r.candidate.text)
        if key in seen:
            continue
        size = len(display_text(r.candidate))
        if chars + size > char_budget:
            break
        seen.add(key)
        chars += size
        taken.append(r)
    return taken


def _positions(ids: Sequence[UUID], known: dict[UUID, Candidate]) -> dict[UUID, int]:
    """1-based ranks among the ids the caller may see (first occurrence wins)."""
    ranks: dict[UUID, int] = {}
    for i in ids:
        if i in known and i not in ranks:
            ranks[i] = len(ranks) + 1
    return ranks


def fuse_hybrid(
    cands: Sequence[Candidate],
    lexical: Sequence[UUID],
    vector: Sequence[UUID],
    top_k: int,
    now: datetime,
    k: int = 60,
) -> list[Ranked]:
    """``hybrid``: reciprocal rank fusion with importance/recency priors::

        score = Σ_{list ∋ id} 1 / (k + rank)  +  0.001·importance  +  0.001·recency

    Ranks are 1-based and counted after dropping ids that are not in ``cands`` (so entries the
    caller may not see do not shift anyone's score). Candidates in neither list are dropped.
    """
    known = {c.id: c for c in cands}
    lists = [_positions(lexical, known), _positions(vector, known)]
    found = {i for ranks in lists for i in ranks}

    def score(c: Candidate) -> float:
        fused = sum(1.0 / (k + ranks[c.id]) for ranks in lists if c.id in ranks)
        prior = HYBRID_IMPORTANCE_PRIOR * c.importance + HYBRID_RECENCY_PRIOR * recency(c.created_at, now)
        return fused + prior

    return _by_score((known[i] for i in found), score)[: max(top_k, 0)]


def fuse_convex(
    cands: Sequence[Candidate],
    lexical: dict[UUID, float],
    vector: dict[UUID, float],
    top_k: int,
    now: datetime,
    alpha: float = 0.5,
) -> list[Ranked]:
    """``hybrid`` by convex combination of min-max normalized scores (Bruch et al., "An Analysis
    of Fusion Functions for Hybrid Retrieval", TOIS 2023)::

        score = alpha·norm(vector) + (1 - alpha)·norm(lexical)  +  priors

    Each retriever's scores are scaled to [0, 1] over the hits it returned for this query; an
    entry a retriever did not return gets 0 from it. Unlike rank fusion this keeps how much
    better the first hit is than the tenth. ``alpha = 0.5`` weighs both retrievers equally.
    """
    known = {c.id: c for c in cands}
    lex = _min_max({i: s for i, s in lexical.items() if i in known})
    vec = _min_max({i: s for i, s in vector.items() if i in known})

    def score(c: Candidate) -> float:
        fused = alpha * vec.get(c.id, 0.0) + (1 - alpha) * lex.get(c.id, 0.0)
        prior = HYBRID_IMPORTANCE_PRIOR * c.importance + HYBRID_RECENCY_PRIOR * recency(c.created_at, now)
        return fused + prior

    return _by_score((known[i] for i in {*lex, *vec}), score)[: max(top_k, 0)]


def with_neighbours(
    fused: Sequence[Ranked],
    adjacent: dict[UUID, list[tuple[int, Candidate]]],
    share: float = NEIGHBOUR_SHARE,
) -> list[Ranked]:
    """hybrid's neighbourhood: an entry ``d`` places from a hit in its session gains
    ``share ** d`` of the hit's score (of its best such hit; gains do not add up), and joins the
    ranking if no retriever found it. A hit that is a fragment of a conversation ("we named him
    Biscuit") then brings the turns around it that hold the rest ("I adopted a puppy").
    ``adjacent`` maps a hit to its neighbours and their distances (:func:`queries.adjacent`);
    ties fall back to newest, then id.
    """
    score = {r.candidate.id: r.score for r in fused}
    cands = {r.candidate.id: r.candidate for r in fused}
    boosted = dict(score)
    for r in fused:
        for distance, n in adjacent.get(r.candidate.id, ()):
            if n.id == r.candidate.id:
                continue
            cands.setdefault(n.id, n)
            gain = share**distance * r.score
            boosted[n.id] = max(boosted.get(n.id, 0.0), score.get(n.id, 0.0) + gain)
    return _by_score(cands.values(), lambda c: boosted[c.id])


def _min_max(scores: dict[UUID, float]) -> dict[UUID, float]:
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high - low <= 1e-12:
        return {i: 1.0 for i in scores}
    return {i: (s - low) / (high - low) for i, s in scores.items()}


def rank_semantic(cands: Sequence[Candidate], vector_scores: dict[UUID, float], top_k: int) -> list[Ranked]:
    """``semantic``: by vector score, best first; candidates without a score are dropped."""
    scored = [c for c in cands if c.id in vector_scores]
    return _by_score(scored, lambda c: vector_scores[c.id])[: max(top_k, 0)]
