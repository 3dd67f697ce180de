"""Recall strategies (SPEC 5.1, 5.2): exact orders on constructed candidates."""

from __future__ import annotations

import math
from datetime import timedelta
from uuid import uuid4

import pytest

from services.recall.ranking import (
    FULL_CAP,
    HYBRID_IMPORTANCE_PRIOR,
    HYBRID_RECENCY_PRIOR,
    Ranked,
    fuse_hybrid,
    pack_score,
    rank_full,
    rank_importance,
    rank_last_k,
    rank_pack,
    rank_semantic,
    recency,
    relevance,
    tokens,
    with_neighbours,
)
from services.recall.service import above_floor
from tests.unit.recall_support import NOW, cand, ids, uid

# --- ordered strategies -------------------------------------------------------------------------


def test_last_k_is_pinned_first_then_newest_with_id_tiebreak() -> None:
    """last_k puts pinned entries first, then newest; equal timestamps fall back to id order."""
    cands = [
        cand(1, age_days=5),
        cand(2, age_days=1),
        cand(3, age_days=50, pinned=True),
        cand(5, age_days=2),
        cand(4, age_days=2),
        cand(6, age_days=0.5, pinned=True),
    ]
    assert ids(rank_last_k(cands, 10)) == [uid(6), uid(3), uid(2), uid(4), uid(5), uid(1)]
    assert ids(rank_last_k(cands, 3)) == [uid(6), uid(3), uid(2)]


def test_ordered_scores_are_positional() -> None:
    """Ordered strategies have no relevance; their score is 1 / (1 + position)."""
    result = rank_last_k([cand(1, age_days=1), cand(2)], 10)
    assert [r.score for r in result] == [1.0, 0.5]


def test_importance_is_pinned_first_then_importance_then_newest() -> None:
    """importance orders pinned first, then by importance, and newest among equals."""
    cands = [
        cand(1, importance=0.9, age_days=3),
        cand(2, importance=0.2, pinned=True),
        cand(3, importance=0.9, age_days=1),
        cand(4, importance=1.0, age_days=9),
        cand(5, importance=0.1),
    ]
    assert ids(rank_importance(cands, 10)) == [uid(2), uid(4), uid(3), uid(1), uid(5)]
    assert ids(rank_importance(cands, 2)) == [uid(2), uid(4)]


def test_full_is_newest_capped_at_1000() -> None:
    """full returns pinned first then newest, never more than 1000 entries."""
    cands = [cand(n, age_days=n / 100) for n in range(1, FULL_CAP + 6)]
    cands.append(cand(5000, age_days=400, pinned=True))
    result = rank_full(cands)
    assert len(result) == FULL_CAP
    assert ids(result)[:3] == [uid(5000), uid(1), uid(2)]


def test_top_k_zero_or_empty_input_gives_nothing() -> None:
    """No candidates or no room means an empty ranking, not an error."""
    assert rank_last_k([], 10) == []
    assert rank_importance([cand(1)], 0) == []


# --- pack: the formula --------------------------------------------------------------------------


def test_tokens_are_lowercased_words_without_stop_words() -> None:
    """Tokens are lowercased word runs; common stop words are dropped."""
    assert tokens("Retry the UPLOAD with exponential back-off!") == [
        "retry",
        "upload",
        "exponential",
        "back",
        "off",
    ]


def test_relevance_is_coverage_damped_by_length() -> None:
    """relevance = |cue ∩ entry| / |cue| / (1 + ln(1 + n / 20))."""
    entry = tokens("retry upload backoff later")
    assert relevance({"retry", "upload"}, entry) == pytest.approx(1.0 / (1 + math.log(1 + 4 / 20)))
    assert relevance({"retry", "timeout"}, entry) == pytest.approx(0.5 / (1 + math.log(1 + 4 / 20)))
    assert relevance(set(), entry) == 0.0
    assert relevance({"retry"}, []) == 0.0


def test_recency_halves_every_30_days() -> None:
    """recency is 1 for a new entry, 0.5 at 30 days, 0.25 at 60, and never above 1."""
    assert recency(NOW, NOW) == 1.0
    assert recency(NOW - timedelta(days=30), NOW) == pytest.approx(0.5)
    assert recency(NOW - timedelta(days=60), NOW) == pytest.approx(0.25)
    assert recency(NOW + timedelta(days=3), NOW) == 1.0


def test_pack_score_weights() -> None:
    """score = 0.60·relevance + 0.25·importance + 0.15·recency."""
    c = cand(1, "retry the upload", importance=0.8, age_days=30)
    rel = 1.0 / (1 + math.log(1 + 2 / 20))
    assert pack_score(c, {"retry", "upload"}, NOW) == pytest.approx(0.60 * rel + 0.25 * 0.8 + 0.15 * 0.5)


@pytest.mark.parametrize("cue", [None, "", "   ", "the and of"])
def test_empty_cue_scores_importance_and_recency_only(cue: str | None) -> None:
    """Without cue tokens the relevance term is dropped: 0.25·importance + 0.15·recency."""
    cands = [cand(1, "retry upload", importance=0.2), cand(2, "deploy", importance=0.9, age_days=30)]
    result = rank_pack(cands, cue, 10, NOW)
    assert ids(result) == [uid(2), uid(1)]
    assert [r.score for r in result] == pytest.approx([0.25 * 0.9 + 0.15 * 0.5, 0.25 * 0.2 + 0.15 * 1.0])


def test_pack_prefers_relevant_entries() -> None:
    """A matching entry outranks a more important but unrelated one."""
    cands = [
        cand(1, "database migrations need a lock", importance=0.9),
        cand(2, "retry the upload", importance=0.3),
    ]
    assert ids(rank_pack(cands, "why did the upload fail, retry?", 10, NOW)) == [uid(2), uid(1)]


@pytest.mark.parametrize(
    "long_text",
    [
        " ".join(["retry the upload with backoff"] * 10),
        "retry the upload with backoff " + " ".join(f"filler{i}" for i in range(40)),
    ],
    ids=["repeated-10x", "padded-10x"],
)
def test_a_long_entry_does_not_win_by_size(long_text: str) -> None:
    """Repeating or padding a matching entry tenfold ranks it below the concise one."""
    concise = cand(2, "retry the upload with backoff")
    bloated = cand(1, long_text)
    assert ids(rank_pack([bloated, concise], "upload retry backoff", 10, NOW)) == [uid(2), uid(1)]


def test_pack_does_not_force_pinned_first() -> None:
    """pack is a ranked strategy: a pinned but irrelevant entry takes its scored place."""
    cands = [cand(1, "unrelated note", pinned=True, importance=0.1), cand(2, "retry upload", importance=0.1)]
    assert ids(rank_pack(cands, "retry upload", 10, NOW)) == [uid(2), uid(1)]


def test_pack_keeps_top_k() -> None:
    """pack keeps at most top_k entries, the best scored."""
    cands = [cand(n, f"distinct memory {n}", importance=n / 10) for n in range(1, 8)]
    assert ids(rank_pack(cands, None, 3, NOW)) == [uid(7), uid(6), uid(5)]


def test_pack_skips_normalized_duplicates() -> None:
    """An entry whose normalized text equals one already taken is skipped, the next one still comes."""
    cands = [
        cand(1, "Retry the upload.", importance=0.9),
        cand(2, "  retry   THE upload ", importance=0.8),
        cand(3, "something else", importance=0.7),
    ]
    assert ids(rank_pack(cands, None, 10, NOW)) == [uid(1), uid(3)]


def test_pack_stops_at_the_character_budget() -> None:
    """Texts are taken until the next would pass 20,000 characters; then packing stops in rank order."""
    cands = [
        cand(1, "a" * 8_000, importance=0.9),
        cand(2, "b" * 8_000, importance=0.8),
        cand(3, "c" * 8_000, importance=0.7),  # 24,000 in total: does not fit
        cand(4, "short", importance=0.6),  # would fit, but comes after the misfit
    ]
    assert ids(rank_pack(cands, None, 10, NOW)) == [uid(1), uid(2)]
    assert ids(rank_pack([*cands[:2], cand(5, "d" * 4_000, importance=0.1)], None, 10, NOW)) == [
        uid(1),
        uid(2),
        uid(5),
    ]  # exactly 20,000 fits


def test_pack_counts_the_placeholder_of_quarantined_entries() -> None:
    """A quarantined entry ranks like any other and costs its placeholder's length, not its text's."""
    cands = [
        cand(1, "x" * 15_000, importance=0.9, quarantined=True),
        cand(2, "y" * 15_000, importance=0.5),
    ]
    assert ids(rank_pack(cands, None, 10, NOW)) == [uid(1), uid(2)]


# --- hybrid -------------------------------------------------------------------------------------


def test_first_in_both_lists_beats_first_in_one() -> None:
    """An id ranked first by both retrievers outranks one ranked first by only one."""
    cands = [cand(1, importance=1.0), cand(2, importance=0.0, age_days=400), cand(3, importance=1.0)]
    result = fuse_hybrid(cands, [uid(2), uid(1)], [uid(2), uid(3)], 10, NOW)
    assert ids(result)[0] == uid(2)


def test_hybrid_score_is_rrf_plus_small_priors() -> None:
    """score = Σ 1/(60 + rank) + 0.001·importance + 0.001·recency."""
    c = cand(1, importance=0.5, age_days=30)
    (only,) = fuse_hybrid([c], [uid(1)], [uid(9), uid(1)], 10, NOW)
    expected = 1 / 61 + 1 / 61 + HYBRID_IMPORTANCE_PRIOR * 0.5 + HYBRID_RECENCY_PRIOR * 0.5
    assert only.score == pytest.approx(expected)  # uid(9) is not a candidate, so uid(1) is first


def test_priors_break_ties() -> None:
    """Two ids with the same fused rank are ordered by importance, then recency."""
    cands = [cand(1, importance=0.2), cand(2, importance=0.9), cand(3, importance=0.2, age_days=10)]
    assert ids(fuse_hybrid(cands, [uid(1), uid(3)], [uid(2)], 10, NOW))[:2] == [uid(2), uid(1)]
    assert ids(fuse_hybrid(cands, [uid(3)], [uid(1)], 10, NOW)) == [uid(1), uid(3)]


def test_priors_do_not_outweigh_a_second_retriever() -> None:
    """Found by both retrievers beats found by one, whatever the priors say."""
    strong = cand(1, importance=1.0)
    weak = cand(2, importance=0.0, age_days=1_000)
    result = fuse_hybrid([strong, weak], [uid(1), uid(2)], [uid(2)], 10, NOW)
    assert ids(result) == [uid(2), uid(1)]


def test_hybrid_drops_unlisted_candidates_and_keeps_top_k() -> None:
    """Candidates in neither list are dropped; the fused list is cut to top_k."""
    cands = [cand(n) for n in range(1, 6)]
    assert ids(fuse_hybrid(cands, [uid(1), uid(2)], [uid(3)], 10, NOW)) == [uid(1), uid(3), uid(2)]
    assert len(fuse_hybrid(cands, [uid(1), uid(2)], [uid(3)], 2, NOW)) == 2


# --- semantic -----------------------------------------------------------------------------------


def test_semantic_orders_by_vector_score_and_drops_unscored() -> None:
    """semantic is vector score descending; candidates without a score are not returned."""
    cands = [cand(1), cand(2), cand(3), cand(4)]
    scores = {uid(1): 0.2, uid(2): 0.9, uid(3): 0.5, uid(99): 1.0}
    result = rank_semantic(cands, scores, 10)
    assert ids(result) == [uid(2), uid(3), uid(1)]
    assert [r.score for r in result] == [0.9, 0.5, 0.2]
    assert ids(rank_semantic(cands, scores, 1)) == [uid(2)]


def test_quarantined_candidates_rank_like_any_other() -> None:
    """Quarantine does not change ranking; the budget step replaces the text."""
    cands = [cand(1, age_days=1), cand(2, quarantined=True)]
    assert ids(rank_last_k(cands, 10)) == [uid(2), uid(1)]


def test_convex_fusion_combines_normalized_scores_equally() -> None:
    """hybrid (convex): each retriever's scores are min-max scaled, then averaged; a strong hit
    in one retriever beats a middling hit in both, and absent means 0 from that retriever."""
    from services.recall.ranking import fuse_convex

    a, b, c, d = (
        cand(1, importance=0.5),
        cand(2, importance=0.5),
        cand(3, importance=0.5),
        cand(4, importance=0.5),
    )
    lexical = {a.id: 10.0, b.id: 6.0, c.id: 2.0}  # scaled: a 1.0, b 0.5, c 0.0
    vector = {b.id: 0.60, d.id: 0.90, c.id: 0.30}  # scaled: d 1.0, b 0.5, c 0.0
    out = fuse_convex([a, b, c, d], lexical, vector, top_k=10, now=NOW)
    scores = {r.candidate.id: r.score for r in out}
    prior = scores[c.id]  # c scores 0 in both: what is left is the priors
    assert scores[a.id] - prior == pytest.approx(0.5)
    assert scores[d.id] - prior == pytest.approx(0.5)
    assert scores[b.id] - prior == pytest.approx(0.5)
    assert ids(out)[-1] == c.id


def test_convex_fusion_ignores_entries_the_caller_cannot_see() -> None:
    """Scores of ids outside the candidates (not visible) neither appear nor stretch the scale."""
    from services.recall.ranking import fuse_convex

    a, b = cand(1), cand(2)
    hidden = uid(99)
    out = fuse_convex([a, b], {hidden: 100.0, a.id: 2.0, b.id: 1.0}, {}, top_k=10, now=NOW)
    assert ids(out) == [a.id, b.id]
    assert out[0].score - out[1].score == pytest.approx(0.5, abs=0.01)


def test_hybrid_floor_judges_lexical_only_hits_by_the_weakest_dense_hit() -> None:
    """above_floor keeps dense hits at or above the floor; an entry only the lexical leg found is
    kept only when the dense leg was cut off (not complete) with its weakest hit still above."""
    near, far, lexical_only = uuid4(), uuid4(), uuid4()
    vector = {near: 0.8, far: 0.3}
    lexical = {lexical_only: 5.0, far: 1.0}
    assert above_floor(vector, lexical, 0.5, complete=False) == {near}
    assert above_floor(vector, lexical, 0.2, complete=False) == {near, far, lexical_only}
    assert above_floor(vector, lexical, 0.2, complete=True) == {near, far}
    assert above_floor({}, lexical, -1.0, complete=True) == set()


# --- neighbourhood ------------------------------------------------------------------------------


def test_a_hits_neighbours_gain_a_share_that_halves_with_distance() -> None:
    """An entry next to a hit gains half the hit's score, two places away a quarter, and joins
    the ranking though no retriever found it."""
    hit, other = Ranked(cand(1), 0.8), Ranked(cand(2), 0.45)
    adjacent = {uid(1): [(1, cand(10)), (2, cand(11))]}
    out = with_neighbours([hit, other], adjacent)
    assert [(r.candidate.id, r.score) for r in out] == [
        (uid(1), 0.8),
        (uid(2), 0.45),
        (uid(10), pytest.approx(0.4)),
        (uid(11), pytest.approx(0.2)),
    ]


def test_a_neighbour_keeps_its_own_score_plus_its_best_hits_share() -> None:
    """Gains do not add up: an entry between two hits gains the share of the better one, on top
    of its own score; a hit listed as its own neighbour gains nothing."""
    fused = [Ranked(cand(1), 0.6), Ranked(cand(2), 0.2), Ranked(cand(3), 0.4)]
    adjacent = {uid(1): [(1, cand(2)), (1, cand(1))], uid(3): [(1, cand(2))]}
    out = {r.candidate.id: r.score for r in with_neighbours(fused, adjacent)}
    assert out == {uid(1): 0.6, uid(2): pytest.approx(0.2 + 0.3), uid(3): 0.4}
    assert with_neighbours(fused, {}) == sorted(fused, key=lambda r: -r.score)
