"""What an agent is handed: near-duplicates folded into the entry ranked above them, and a lesson
before the raw observations of its session (services/recall/distinct.py)."""

from __future__ import annotations

from services.recall.budget import serialize_result
from services.recall.distinct import collapse_similar, lessons_first, similar, word_set
from services.recall.ranking import Ranked
from tests.unit.recall_support import cand, ids, ranked, uid

DECLINED = "card declined (issuer code 05: do not honor)"
#: What the demo leaves for end_user:alice after two refunds were declined (issue 26 §3).
OBS_NULL = f"refund_payment(null) error: {DECLINED}"
OBS_1042 = f'refund_payment({{"order_id": "A-1042", "card": "[CARD]", "amount": 89.9}}) error: {DECLINED}'
OBS_1107 = f'refund_payment({{"order_id": "A-1107", "card": "[CARD]", "amount": 42.0}}) error: {DECLINED}'
FAILURE = f"refund_payment failed with '{DECLINED}'."
TASK_1107 = f"Task 'Refund order #A-1107 (wrong size)' failed: {DECLINED}."
TASK_1042 = f"Task 'Refund order #A-1042 (damaged blender)' failed: {DECLINED}."
RESOLVED = (
    f"After refund_payment failed with '{DECLINED}' while working on 'Refund order #A-1042 (damaged "
    'blender)\', retrying refund_payment with method="store_credit" and without card worked.'
)


def test_copies_of_one_failure_are_near_duplicates_and_the_fix_is_not() -> None:
    copies = [OBS_NULL, OBS_1042, OBS_1107, FAILURE]
    for a in copies:
        for b in copies:
            assert similar(word_set(a), word_set(b)), (a, b)
    assert similar(word_set(TASK_1042), word_set(TASK_1107))  # the order id is digits
    for copy in [*copies, TASK_1107]:
        assert not similar(word_set(RESOLVED), word_set(copy))


def test_turns_of_a_conversation_that_share_a_topic_are_not_near_duplicates() -> None:
    """LoCoMo-like turns: the same people and subject, different things said."""
    turns = [
        "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
        "Melanie: The support group sounds powerful, I'm glad you went yesterday!",
        "Caroline: Thanks, Mel!",
        "Melanie: Thanks, Caroline!",
        "Caroline: I'm thinking of going back to school to study counseling.",
    ]
    for i, a in enumerate(turns):
        for b in turns[i + 1 :]:
            assert not similar(word_set(a), word_set(b)), (a, b)


def test_an_exact_short_repeat_is_a_near_duplicate() -> None:
    assert similar(word_set("Thanks, Mel!"), word_set("thanks mel"))
    assert not similar(word_set(""), word_set(""))


def test_near_duplicates_fold_into_the_best_ranked_and_are_counted() -> None:
    items = ranked(
        cand(1, OBS_NULL), cand(2, OBS_1042), cand(3, TASK_1107), cand(4, RESOLVED), cand(5, OBS_1107),
        cand(6, TASK_1042), cand(7, FAILURE), cand(8, "Remember: refunds over $500 need approval."),
    )  # fmt: skip
    kept, read = collapse_similar(items, limit=10)
    assert ids(kept) == [uid(1), uid(3), uid(4), uid(8)]
    assert [r.similar for r in kept] == [3, 1, 0, 0]
    assert read == 8
    # The scores are the kept entries' own.
    assert [r.score for r in kept] == [items[0].score, items[2].score, items[3].score, items[7].score]


def test_folding_stops_reading_once_the_limit_is_kept() -> None:
    items = ranked(cand(1, OBS_NULL), cand(2, OBS_1042), cand(3, RESOLVED), cand(4, TASK_1107))
    kept, read = collapse_similar(items, limit=2)
    assert ids(kept) == [uid(1), uid(3)]
    assert read == 3
    assert kept[0].similar == 1


def test_a_quarantined_entry_is_neither_folded_nor_stands_for_others() -> None:
    items = ranked(cand(1, OBS_NULL, quarantined=True), cand(2, OBS_1042), cand(3, OBS_1107))
    kept, _ = collapse_similar(items, limit=10)
    assert ids(kept) == [uid(1), uid(2)]
    assert [r.similar for r in kept] == [0, 1]


def test_a_lesson_comes_before_the_observations_of_its_session() -> None:
    def obs(n: int, session: str, owner: str = "end_user:alice") -> Ranked:
        return Ranked(cand(n, layer="observation", session_id=session, owner_key=owner), 1.0 / n)

    def lesson(n: int, session: str | None, owner: str = "end_user:alice") -> Ranked:
        return Ranked(cand(n, session_id=session, owner_key=owner), 1.0 / n)

    items = [
        obs(1, "s2"),
        obs(2, "s1"),
        lesson(3, "s1"),
        lesson(4, "s3"),
        obs(5, "s1", owner="end_user:bob"),
        lesson(6, "s1"),
        lesson(7, "s1", owner="end_user:bob"),
        lesson(8, None),
    ]
    # s1's lessons (3, 6) move before its first observation (2); bob's lesson (7) before bob's
    # observation (5); s2 has no lesson ranked; a lesson without a session stays where it is.
    assert ids(lessons_first(items)) == [uid(i) for i in (1, 3, 6, 2, 4, 7, 5, 8)]
    assert lessons_first([]) == []


def test_the_count_reaches_the_wire_in_every_format_when_there_is_one_and_always_in_full() -> None:
    r = Ranked(cand(1, OBS_NULL), 0.5, similar=3)
    for fmt in ("text", "full", "compact", "narrative"):
        assert serialize_result(r, fmt)["similar_count"] == 3  # type: ignore[arg-type]
    for fmt in ("text", "compact", "narrative"):
        assert "similar_count" not in serialize_result(r._replace(similar=0), fmt)  # type: ignore[arg-type]
    assert serialize_result(r._replace(similar=0), "full")["similar_count"] == 0


def test_an_entry_that_contains_one_kept_above_takes_its_place() -> None:
    """The fix names the failure and says what worked: it stands where the bare failure stood,
    counting it; a bare failure after the fix is folded into it."""
    items = ranked(cand(1, FAILURE), cand(2, "Remember: refunds over $500 need approval."), cand(3, RESOLVED))
    kept, _ = collapse_similar(items, limit=10)
    assert ids(kept) == [uid(3), uid(2)]
    assert [r.similar for r in kept] == [1, 0]
    kept, _ = collapse_similar(ranked(cand(3, RESOLVED), cand(1, FAILURE)), limit=10)
    assert ids(kept) == [uid(3)]
    assert kept[0].similar == 1


def test_an_entry_that_contains_two_kept_entries_replaces_both() -> None:
    a = "Alpha bravo charlie delta echo foxtrot."
    b = "Golf hotel india juliet kilo lima."
    both = f"{a} {b} Mike november."
    kept, read = collapse_similar(
        ranked(cand(1, a), cand(2, "Oscar papa quebec romeo."), cand(3, b), cand(4, both)), 10
    )
    assert ids(kept) == [uid(4), uid(2)]
    assert [r.similar for r in kept] == [2, 0]
    assert read == 4


def test_short_texts_are_not_contained_in_longer_ones() -> None:
    """A turn of a few words ("Thanks, Mel!") stays beside the long one that repeats it."""
    kept, _ = collapse_similar(
        ranked(cand(1, "Thanks, Mel!"), cand(2, "Thanks, Mel! I went to the support group and loved it.")), 10
    )
    assert ids(kept) == [uid(1), uid(2)]


def test_an_observation_the_lesson_of_its_session_repeats_is_folded_into_it() -> None:
    """The raw call behind a lesson, once the lesson is kept: folded when the lesson says most of
    its words, kept when the lesson is another session's or another owner's."""
    fix = (
        "After git_push failed with 'pre-receive hook: secret detected in .env' while working on 'Commit "
        'the deploy config\', retrying git_push with files=["deploy.yaml"] worked.'
    )
    call = (
        'git_push({"branch":"deploy-cfg","files":[".env","deploy.yaml"]}) error: '
        "pre-receive hook: secret detected in .env"
    )
    lesson = cand(1, fix, session_id="s1", owner_key="actor:mia")
    for session, owner, folded in (
        ("s1", "actor:mia", True),
        ("s2", "actor:mia", False),
        ("s1", "actor:raj", False),
    ):
        obs = cand(2, call, layer="observation", session_id=session, owner_key=owner)
        kept, _ = collapse_similar(ranked(lesson, obs), 10)
        assert ids(kept) == ([uid(1)] if folded else [uid(1), uid(2)])
