"""``engram.recall`` and ``engram.recall.expand``: resolve who is asking, apply the config and
the request's narrowing, run the strategy, fit the budget, render, and record the disclosure."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any, TypeVar
from uuid import UUID, uuid4

from cachetools import TTLCache

from contracts.common import Principal
from contracts.config import MemoryConfig, SemanticRecallConfig
from contracts.errors import InvalidRequest, SemanticDisabled, VectorUnavailable
from contracts.recall import (
    MAX_EXPAND_EXAMINED,
    MAX_EXPAND_RETURNED,
    SEMANTIC_MAX_TOP_K,
    ExpandReply,
    ExpandRequest,
    RecallReply,
    RecallRequest,
    RecallResult,
    Strategy,
)
from services.recall.budget import QUARANTINE_PLACEHOLDER, fit_budget
from services.recall.candidates import Candidate, display_metadata
from services.recall.distinct import collapse_similar, lessons_first
from services.recall.overrides import apply_overrides
from services.recall.ranking import (
    NEIGHBOUR_REACH,
    Ranked,
    fuse_convex,
    fuse_hybrid,
    rank_full,
    rank_importance,
    rank_last_k,
    rank_pack,
    rank_semantic,
    with_neighbours,
)
from services.recall.side_effects import Disclosure, SideEffects
from services.recall.time_grounding import cue_periods, grounded
from shared.adapters.vectors.coverage import VectorCoverage
from shared.ports import Embedder, VectorIndex
from shared.runtime.time import utcnow
from shared.security.access import Caller
from shared.security.auth import Credential
from shared.security.tenancy import visible_owner_keys
from shared.storage.cache import CueVectorCache, ResultCache
from shared.storage.config_store import load_config, org_memory_enabled
from shared.storage.db.engine import Database
from shared.storage.entries import recall as queries
from shared.text.lexical import query_weights
from shared.text.memory_block import render_context
from shared.text.supersession import past_cue

__all__ = ["Recall"]

log = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")

#: How many ranked hits each of hybrid's two retrievers contributes to the fusion.
HYBRID_DEPTH = 100
#: How many hits each of hybrid's legs asks the vector store for: a quarter more than it keeps,
#: for those Postgres's re-check drops (expired, erased, filtered since they were indexed). The
#: store's cost grows with it (an HNSW search is ``limit`` wide), so not the double that semantic's
#: few hits can afford.
HYBRID_FETCH = HYBRID_DEPTH + HYBRID_DEPTH // 4
#: With ``collapse_similar``, a cue strategy ranks this many times ``top_k`` entries (at most
#: ``COLLAPSE_SLACK`` more than ``top_k``: a top_k of 1000 is a listing, not a context), so that
#: ``top_k`` distinct ones remain after near-duplicates are folded and lessons lifted.
COLLAPSE_WINDOW = 3
COLLAPSE_SLACK = 100
_CUE_STRATEGIES = {"pack", "semantic", "hybrid"}
_VECTOR_STRATEGIES = {"semantic", "hybrid"}
#: Strategies whose replies the Redis result cache keeps. Not semantic/hybrid: a new entry joins
#: their candidates only once embedded, after the write's invalidation — a cached reply would
#: miss it until the TTL. Not pack/hybrid: their recency prior moves with the clock, so a cached
#: reply would differ from a fresh one. A cached reply must equal a fresh one.
CACHEABLE = frozenset({"last_k", "importance", "full"})


async def _overlapped(query: Awaitable[T], search: Callable[[], Awaitable[U]]) -> tuple[T, U]:
    """``query``'s and ``search()``'s results, the query sent to Postgres before the search runs:
    a vector-store search holds the event loop (Edge searches in-process, holding the GIL), so
    awaiting the two in turn would add the query's round trip to the search's time."""
    task = asyncio.ensure_future(query)
    await asyncio.sleep(0)  # the query's first step: its statement goes out to Postgres
    try:
        found = await search()
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
    return await task, found


class Recall:
    def __init__(
        self,
        db: Database,
        side_effects: SideEffects,
        *,
        embedder: Embedder | None,
        index: VectorIndex | None,
        cue_vectors: CueVectorCache | None = None,
        config_cache_s: float = 1.0,
        results: ResultCache | None = None,
        coverage: VectorCoverage | None = None,
    ) -> None:
        self._db = db
        self._coverage = coverage
        self._effects = side_effects
        self._embedder = embedder
        self._index = index
        # (org, agent config) → (config, memory enabled): a query saved per recall, at the price of a
        # config change taking effect within ``config_cache_s``.
        self._configs: TTLCache[tuple[UUID, UUID], tuple[MemoryConfig, bool]] = TTLCache(
            maxsize=10_000, ttl=config_cache_s
        )
        self._cue_vectors = cue_vectors or CueVectorCache(embedder.name if embedder else "none")
        self._results = results if results is not None and results.enabled else None

    async def _config(self, org_id: UUID, agent_config_id: UUID) -> tuple[MemoryConfig, bool, bool]:
        """The config, whether memory is on, and whether the organization ever used this agent
        config (saved to it or configured it); an unused one is not cached: its first save
        creates it."""
        key = (org_id, agent_config_id)
        cached = self._configs.get(key)
        if cached is not None:
            return (*cached, True)
        async with self._db.read() as session:
            config, version = await load_config(session, org_id, agent_config_id)
            if version == 0:
                return config, False, False
            enabled = config.memory_enabled and await org_memory_enabled(session, org_id)
        self._configs[key] = (config, enabled)
        return config, enabled, True

    async def recall(self, who: Caller, request: RecallRequest) -> RecallReply:
        """``who`` is authorized (``shared.security.access``) for ``request``."""
        credential, caller = who.credential, who.principal
        config, enabled, known = await self._config(credential.org_id, request.agent_config_id)
        # A relevance floor needs relevance: with min_score the strategy cannot quietly fall back.
        explicit = request.strategy is not None or request.min_score is not None
        cue = (request.cue or "").strip()
        strategy: Strategy = request.strategy or self._default_strategy(config, cue)
        if request.min_score is not None and strategy not in _VECTOR_STRATEGIES:
            raise InvalidRequest(
                f"min_score applies to the semantic and hybrid strategies (with a cue), not {strategy!r}"
            )
        # Where a vector strategy cannot run and was not asked for by name (SPEC 5.1).
        fallback: Strategy = config.memory_strategy
        if fallback in _VECTOR_STRATEGIES:
            fallback = "last_k"
        warnings: list[str] = []
        if not known:  # a typo, or a first session launch before its first write: say which
            return _empty(strategy, ["unknown_agent_config"])
        if not enabled:  # memory off: empty context, no recall, no side effects
            return _empty(strategy, warnings)
        policy = apply_overrides(config, request.policy_override)
        if strategy in _VECTOR_STRATEGIES and not config.semantic_recall.enabled:
            if explicit:
                raise SemanticDisabled("semantic recall is disabled for this agent config")
            strategy, warnings = fallback, ["semantic_unavailable_fallback"]
        if strategy in _VECTOR_STRATEGIES and (self._index is None or self._embedder is None):
            if explicit:
                raise VectorUnavailable("the vector index is not available")
            strategy, warnings = fallback, ["semantic_unavailable_fallback"]
        if strategy in _VECTOR_STRATEGIES and cue and not has_content(cue) and request.min_score is not None:
            return _empty(strategy, warnings)  # nothing can be similar to a cue of punctuation
        if strategy in _VECTOR_STRATEGIES and cue and not has_content(cue):
            # Nothing to search by ("?", "!!!"): answer as the config would without a cue, and say so.
            strategy, warnings = fallback, [*warnings, "cue_without_content_fallback"]
        top_k = request.top_k or config.top_k
        if strategy == "semantic" and top_k > SEMANTIC_MAX_TOP_K:
            raise InvalidRequest(f"semantic recall takes top_k from 1 to {SEMANTIC_MAX_TOP_K}")
        owner_keys = visible_owner_keys(caller, config.scope, request.session_id)
        if not owner_keys:  # e.g. an end user who cannot be resolved: no memory, not an error
            return _empty(strategy, warnings)
        cache_key = generation = None
        if self._results is not None and strategy in CACHEABLE:
            material = json.dumps(
                [
                    caller.ref,
                    credential.session_id,
                    owner_keys,
                    strategy,
                    warnings,
                    # The cached strategies ignore the cue: one entry serves every cue.
                    request.model_dump(mode="json", exclude={"principal", "cue"}),
                    config.model_dump(mode="json"),
                ],
                sort_keys=True,
            )
            cache_key = ResultCache.key(credential.org_id, request.agent_config_id, material)
            hit = await self._results.get(cache_key)
            if hit is not None:
                return self._from_cache(hit, credential, request, caller, strategy)
            # Read before the rows are: a reply computed from rows a purge has since erased
            # is then refused by the cache (see ResultCache.put).
            generation = await self._results.generation(credential.org_id, request.agent_config_id)
        scope = _scope(
            credential,
            request,
            config,
            owner_keys,
            layer=None if request.target_layer == "all" else request.target_layer,
            memory_types=policy.memory_types_allowed,
            filters=request.filters,
            # A cue about the past reaches superseded knowledge too; otherwise only what is current.
            history=strategy in _CUE_STRATEGIES and past_cue(cue),
        )
        diagnostics: dict[str, Any] = {}

        async def rank(strategy: Strategy, min_score: float | None) -> list[Ranked]:
            return await self._rank(
                strategy,
                scope,
                cue,
                top_k,
                diagnostics,
                config.semantic_recall,
                min_score,
                collapse=request.collapse_similar,
                asked_at=request.asked_at,
            )

        try:
            ranked = await rank(strategy, request.min_score)
        except VectorUnavailable:
            if explicit:
                raise
            # min_score is a cosine threshold: the fallback (no vectors) has no scores to hold to it.
            strategy, warnings = fallback, [*warnings, "semantic_unavailable_fallback"]
            ranked = await rank(strategy, None)
        if request.collapse_similar and strategy in _CUE_STRATEGIES:
            ranked, _ = collapse_similar(lessons_first(ranked), top_k)
        if strategy in _VECTOR_STRATEGIES and not await self._index_complete(credential.org_id):
            # Some entries' vectors are another embedder's: neither leg (the lexical vectors live
            # beside the dense ones) can find them until `engram reindex`. Answer, but say so.
            warnings.append("semantic_index_incomplete")

        outcome = fit_budget(ranked, request.format, request.token_budget)
        if outcome.quarantined:
            warnings.append("memory_context_quarantined")
        pack_id = uuid4()
        # The results are the ranking's first ones (the budget keeps a prefix): their ids as ranked.
        returned = tuple(r.candidate.id for r in ranked[: len(outcome.results)])
        self._disclose(credential, request, caller, strategy, pack_id, returned)
        reply: dict[str, Any] = {
            "results": outcome.results,
            "context": render_context(outcome.results, strategy, request.format),
            "strategy": strategy,
            "pack_id": pack_id,
            "count": len(outcome.results),
            "matched_count": len(ranked),
            "tokens_used": outcome.tokens_used,
            "truncated": outcome.truncated,
            "warnings": warnings,
        }
        if request.token_budget is not None:
            reply.update(
                excluded_by_budget=outcome.excluded_by_budget,
                excluded_results=outcome.excluded_results,
                excluded_results_truncated=outcome.excluded_results_truncated,
                minimum_budget=outcome.minimum_budget,
            )
        if request.diagnostics is not None:
            reply["diagnostics"] = _diagnostics(request.diagnostics, diagnostics, ranked, outcome.results)
        answer = RecallReply.model_validate(reply)
        if cache_key is not None and self._results is not None:
            await self._cache(cache_key, generation, credential, request, answer, ranked, scope.now)
        return answer

    async def _index_complete(self, org_id: UUID) -> bool:
        return self._coverage is None or await self._coverage.complete(org_id)

    def _default_strategy(self, config: MemoryConfig, cue: str) -> Strategy:
        """The strategy when the caller names none: the config's, except that a cue asks for
        relevance, so a config strategy that ignores cues gives way to ``hybrid`` wherever semantic
        recall can run (docs/adr/0038-cue-without-strategy.md)."""
        if (
            cue
            and config.memory_strategy not in _CUE_STRATEGIES
            and config.semantic_recall.enabled
            and self._index is not None
            and self._embedder is not None
        ):
            return "hybrid"
        return config.memory_strategy

    async def _cache(
        self,
        key: str,
        generation: bytes | None,
        credential: Credential,
        request: RecallRequest,
        answer: RecallReply,
        ranked: list[Ranked],
        now: datetime,
    ) -> None:
        assert self._results is not None
        returned = {r.id for r in answer.results}
        # The reply changes when one of its entries expires: it may be cached until then only.
        expiries = [
            r.candidate.expires_at
            for r in ranked
            if r.candidate.id in returned and r.candidate.expires_at is not None
        ]
        ttl = min((e - now).total_seconds() for e in expiries) if expiries else float(1 << 30)
        if ttl < 1:
            return
        payload = {
            "reply": answer.model_dump(mode="json", exclude_unset=True),
            "ids": [str(r.id) for r in answer.results],
        }
        await self._results.put(
            credential.org_id, request.agent_config_id, key, json.dumps(payload).encode(), ttl, generation
        )

    def _from_cache(
        self,
        raw: bytes,
        credential: Credential,
        request: RecallRequest,
        caller: Principal,
        strategy: Strategy,
    ) -> RecallReply:
        """A cached reply is still a disclosure: a fresh pack id, and the same side effects."""
        data = json.loads(raw)
        pack_id = uuid4()
        self._disclose(credential, request, caller, strategy, pack_id, tuple(UUID(i) for i in data["ids"]))
        return RecallReply.model_validate({**data["reply"], "pack_id": str(pack_id)})

    def _disclose(
        self,
        credential: Credential,
        request: RecallRequest,
        caller: Principal,
        strategy: str,
        pack_id: UUID,
        entry_ids: tuple[UUID, ...],
    ) -> None:
        """Queue the recall's side effects (SPEC 5.6): its record, access counts, audit record.
        Only a hash of the cue is kept: enough to group recalls, not to read what was asked."""
        cue = (request.cue or "").strip()
        self._effects.record(
            Disclosure(
                pack_id=pack_id,
                org_id=credential.org_id,
                agent_config_id=request.agent_config_id,
                caller_ref=caller.ref,
                session_id=request.session_id,
                strategy=strategy,
                cue_hash=hashlib.sha256(cue.encode()).hexdigest() if cue else None,
                entry_ids=entry_ids,
                at=utcnow(),
            )
        )

    async def _rank(
        self,
        strategy: Strategy,
        scope: queries.Scope,
        cue: str,
        top_k: int,
        diag: dict[str, Any],
        semantic: SemanticRecallConfig,
        min_score: float | None = None,
        *,
        collapse: bool = False,
        asked_at: datetime | None = None,
    ) -> list[Ranked]:
        """The strategy's ranking: ``top_k`` entries, or for a cue strategy with ``collapse`` up to
        ``COLLAPSE_WINDOW`` times as many, ``COLLAPSE_SLACK`` more at most (the caller folds them
        down to ``top_k``)."""
        if strategy == "last_k":
            cands = await queries.newest(self._db, scope, top_k)
            diag["scope_query"] = len(cands)
            return rank_last_k(cands, top_k)
        if strategy == "full":
            cands = await queries.newest(self._db, scope, 1000)
            diag["scope_query"] = len(cands)
            return rank_full(cands)
        if strategy == "importance":
            cands = await queries.top_importance(self._db, scope, top_k)
            diag["scope_query"] = len(cands)
            return rank_importance(cands, top_k)
        window = top_k + min(top_k * (COLLAPSE_WINDOW - 1), COLLAPSE_SLACK) if collapse else top_k
        if strategy == "pack":
            cands = await queries.pack_candidates(self._db, scope)
            diag["scope_query"] = len(cands)
            return rank_pack(cands, cue or None, window, scope.now)
        if not cue:
            raise InvalidRequest(f"strategy {strategy!r} needs a cue")
        if strategy == "semantic":
            # Over-fetch: Postgres re-checks each hit (expiry, lifecycle, filters) and may drop some.
            hits = await self._vector_search(cue, scope, window * 2)
            diag["vector_rank"] = len(hits)
            scores = {h.id: h.score for h in hits if min_score is None or h.score >= min_score}
            cands = await queries.by_ids(self._db, scope, list(scores))
            diag["scope_query"] = len(cands)
            return rank_semantic(cands, scores, window)
        # Postgres answers each leg's query while the vector store searches the other's.
        (documents, containing), hits = await _overlapped(
            queries.cue_statistics(self._db, scope, cue),
            lambda: self._vector_search(cue, scope, HYBRID_FETCH),
        )
        weights = query_weights(documents, containing)
        vector = {h.id: h.score for h in hits}
        # The dense hits' ranking inputs are read while the vector store runs the lexical search.
        (fresh, cands), lexical = await _overlapped(
            asyncio.gather(
                queries.unindexed_lexical_scores(self._db, scope, cue, documents, containing),
                queries.ranking_inputs(self._db, scope, list(vector)),
            ),
            lambda: self._lexical_search(weights, scope, HYBRID_FETCH),
        )
        if fresh:  # read-your-writes: what the embed service has not indexed yet
            merged = {**lexical, **fresh}
            lexical = dict(sorted(merged.items(), key=lambda item: (-item[1], str(item[0]))))
        cands += await queries.ranking_inputs(self._db, scope, [i for i in lexical if i not in vector])
        diag["scope_query"] = len(cands)
        # Each leg's best HYBRID_DEPTH that the scope allows, as when the lexical leg ran in
        # Postgres under the scope's predicate (min-max normalization sees the same list).
        known = {c.id for c in cands}
        lexical = best_allowed(lexical, known)
        fetched, vector = vector, best_allowed(vector, known)
        diag["vector_rank"] = len(vector)
        diag["lexical_rank"] = len(lexical)
        # Fused over both legs whole, then floored: the floor changes which entries are
        # returned, never how the others score.
        every = len(cands)
        if semantic.fusion == "rrf":
            fused = fuse_hybrid(cands, list(lexical), list(vector), every, scope.now)
        else:
            fused = fuse_convex(cands, lexical, vector, every, scope.now)
        floor = None
        if min_score is not None:
            # Every dense hit's cosine is known, ranked or not: the floor judges by all of them.
            floor = _Floor(fetched, min_score, complete=len(hits) < HYBRID_FETCH)
            fused = floor.keep(fused)
        # Ranked on ranking_inputs' partial rows: the winners are read whole. Those that would win
        # now are read at once, beside their neighbours (read whole too), which compete for their
        # places; whoever else wins after that (time grounding can lift any hit) is read last.
        # With collapse, the entries after the head that may take a folded one's place are read too.
        head = [r.candidate.id for r in fused[:top_k]]
        wide = [r.candidate.id for r in fused[:window]]
        if semantic.neighbourhood:
            adjacent, read = await asyncio.gather(
                queries.adjacent(self._db, scope, head, NEIGHBOUR_REACH),
                queries.by_ids(self._db, scope, wide),
            )
            whole = {c.id: c for c in read}
            whole.update((c.id, c) for near in adjacent.values() for _, c in near)
            fused = with_neighbours(fused, adjacent)
            if floor is not None:  # a neighbour passes the floor like any other entry
                fused = floor.keep(fused)
        else:
            whole = {c.id: c for c in await queries.by_ids(self._db, scope, wide)}
        if semantic.time_grounding:
            fused = grounded(fused, cue_periods(cue, asked_at or scope.now))
        winners = fused[:window]
        unread = [r.candidate.id for r in winners if r.candidate.id not in whole]
        if unread:
            whole.update((c.id, c) for c in await queries.by_ids(self._db, scope, unread))
        # An entry erased since its ranking inputs were read is left out.
        return [Ranked(whole[r.candidate.id], r.score) for r in winners if r.candidate.id in whole]

    async def _vector_search(self, cue: str, scope: queries.Scope, limit: int) -> list[Any]:
        if self._index is None or self._embedder is None:
            raise VectorUnavailable("the vector index is not available")
        vector = await self._cue_vectors.get(cue)
        if vector is None:
            (vector,) = await self._embedder.embed([cue])
            await self._cue_vectors.put(cue, vector)
        try:
            return list(await self._index.search(vector, scope.tenant(), limit))
        except VectorUnavailable:
            raise
        except Exception as exc:
            log.warning("vector search failed", exc_info=True)
            raise VectorUnavailable("vector search failed") from exc

    async def _lexical_search(
        self, terms: dict[int, float], scope: queries.Scope, limit: int
    ) -> dict[UUID, float]:
        """hybrid's BM25 leg: the cue's IDF-weighted terms against the entries' lexical vectors,
        with the dense leg's tenant filter (shared/text/lexical.py)."""
        if self._index is None:
            raise VectorUnavailable("the vector index is not available")
        try:
            hits = await self._index.search_lexical(terms, scope.tenant(), limit)
        except VectorUnavailable:
            raise
        except Exception as exc:
            log.warning("lexical search failed", exc_info=True)
            raise VectorUnavailable("lexical search failed") from exc
        return {hit.id: hit.score for hit in hits}

    async def expand(self, who: Caller, request: ExpandRequest) -> ExpandReply:
        credential, caller = who.credential, who.principal
        config, enabled, _ = await self._config(credential.org_id, request.agent_config_id)
        requested = list(dict.fromkeys(request.ids))
        examined = requested[:MAX_EXPAND_EXAMINED]
        owner_keys = visible_owner_keys(caller, config.scope, request.session_id) if enabled else ()
        found: list[Candidate] = []
        if owner_keys:
            # An id a cue about the past returned may be history: it expands like any other.
            scope = _scope(credential, request, config, owner_keys, history=True)
            found = await queries.by_ids(self._db, scope, examined)
        by_id = {c.id: c for c in found}
        accessible = [by_id[i] for i in examined if i in by_id]
        returned = accessible[:MAX_EXPAND_RETURNED]
        truncated = len(requested) > len(examined) or len(accessible) > len(returned)
        if returned:
            self._effects.record(
                Disclosure(
                    pack_id=uuid4(),
                    org_id=credential.org_id,
                    agent_config_id=request.agent_config_id,
                    caller_ref=caller.ref,
                    session_id=request.session_id,
                    strategy="expand",
                    cue_hash=None,
                    entry_ids=tuple(c.id for c in returned),
                    at=utcnow(),
                    kind="memory.expanded",
                )
            )
        return ExpandReply(
            results=[_full_result(c) for c in returned],
            truncated=truncated,
            not_found=[i for i in examined if i not in by_id],
        )


def best_allowed(leg: Mapping[UUID, float], allowed: Container[UUID]) -> dict[UUID, float]:
    """A hybrid leg's first ``HYBRID_DEPTH`` hits (best first) among those ``allowed``: what it
    contributes to the fusion once Postgres has re-checked its hits."""
    return dict(islice(((i, s) for i, s in leg.items() if i in allowed), HYBRID_DEPTH))


def has_content(cue: str) -> bool:
    """Whether a cue has a letter or digit to search by (punctuation alone finds nothing)."""
    return any(c.isalnum() for c in cue)


def above_floor(
    vector: dict[UUID, float], others: Iterable[UUID], min_score: float, *, complete: bool
) -> set[UUID]:
    """hybrid's entries whose cosine similarity to the cue is at least ``min_score``.

    The dense leg scored its hits. An entry it did not find (``others``: only the lexical leg
    found it, or it is a hit's neighbour) is not among the dense leg's nearest, so its cosine is
    at most the weakest dense hit's: below the floor when that one is. When the dense leg returned
    fewer than it asked for (``complete``), it returned every entry with a vector, so such an
    entry has none yet and cannot be shown to fit. Otherwise (many entries above the floor
    already) it is kept: its similarity is unknown, not low.
    """
    fits = {i for i, score in vector.items() if score >= min_score}
    weakest = min(vector.values(), default=-1.0)
    if not complete and weakest >= min_score:
        fits |= {i for i in others if i not in vector}
    return fits


@dataclass(frozen=True)
class _Floor:
    """``min_score`` for hybrid (:func:`above_floor`) over a ranking."""

    vector: dict[UUID, float]
    min_score: float
    complete: bool

    def keep(self, ranked: list[Ranked]) -> list[Ranked]:
        ids = [r.candidate.id for r in ranked]
        fits = above_floor(self.vector, ids, self.min_score, complete=self.complete)
        return [r for r in ranked if r.candidate.id in fits]


def _full_result(c: Candidate) -> RecallResult:
    return RecallResult(
        id=c.id,
        text=QUARANTINE_PLACEHOLDER if c.quarantined else c.text,
        score=1.0,
        memory_type=c.memory_type,
        layer=c.layer,
        importance=c.importance,
        created_at=c.created_at,
        session_id=c.session_id,
        metadata=display_metadata(c),
        source=c.source,
        reinforcement_count=c.reinforcement_count,
        quarantined=c.quarantined,
    )


def _scope(
    credential: Credential,
    request: RecallRequest | ExpandRequest,
    config: MemoryConfig,
    owner_keys: tuple[str, ...],
    **narrowing: Any,
) -> queries.Scope:
    """What the caller may see of the request's agent config (SPEC 3): ``owner_keys``, and only the
    request's session when the config's scope is ``session``; then the request's ``narrowing``
    (the other fields of :class:`~shared.storage.entries.recall.Scope`)."""
    return queries.Scope(
        org_id=credential.org_id,
        agent_config_id=request.agent_config_id,
        owner_keys=owner_keys,
        now=utcnow(),
        session_only=request.session_id if config.scope == "session" else None,
        **narrowing,
    )


def _empty(strategy: Strategy, warnings: list[str]) -> RecallReply:
    return RecallReply(
        results=[],
        context="",
        strategy=strategy,
        pack_id=None,
        count=0,
        matched_count=0,
        tokens_used=0,
        truncated=False,
        warnings=warnings,
    )


def _diagnostics(
    level: str, counts: dict[str, Any], ranked: list[Ranked], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """Counts, and with ``candidates`` one bounded decision per candidate — never content."""
    out: dict[str, Any] = {
        "scope_query": counts.get("scope_query", 0),
        "policy_filter": counts.get("policy_filter", 0),
        "vector_rank": counts.get("vector_rank", 0),
        "lexical_rank": counts.get("lexical_rank", 0),
    }
    if level == "candidates":
        returned = {str(r["id"]) for r in results}
        out["candidates"] = [
            {
                "id": str(r.candidate.id),
                "decision": "returned" if str(r.candidate.id) in returned else "excluded",
                "reason": "ranked" if str(r.candidate.id) in returned else "budget",
                "score": round(r.score, 6),
            }
            for r in ranked[:100]
        ]
    return out
