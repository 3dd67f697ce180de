"""What an agent is handed: one entry per thing said, and the lesson before the raw activity.

A failing tool leaves many near-identical entries behind — an observation per failed call ("refund_payment(…)
error: card declined"), the failure lesson, the failed task's outcome — and a cue about that failure matches
every one of them, so ten results could say one thing ten times. Two steps, over the ranking:

- :func:`lessons_first`: a lesson (``layer="memory"``) is placed before the observations of the session
  it was distilled from (the same owner and ``session_id``) when both are ranked: what was learned
  from a session outranks the calls it was learned from.
- :func:`collapse_similar`: an entry whose words are nearly those of one ranked above it (Jaccard
  similarity of their word sets at least ``SIMILAR_JACCARD``, digits folded), or nearly all
  contained in them, is left out and counted on that one (``Ranked.similar``, ``similar_count``
  on the wire); one that contains an entry ranked above it takes that one's place; an observation
  most of whose words a lesson of its session kept above it repeats is folded into the lesson. Word sets, not
  embeddings: the texts are in hand at this point and the vectors are not, and near-duplicates
  here differ by an order id or a call's input, which a word set sees as a few words out of many.
  A turn of conversation that merely speaks of the same thing shares far fewer of its words
  (measured on LoCoMo: ``make eval``).

A caller that wants every copy asks with ``collapse_similar: false``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from services.recall.ranking import STOP_WORDS, Ranked

__all__ = ["SIMILAR_JACCARD", "collapse_similar", "contained", "lessons_first", "similar", "word_set"]

#: Two entries are near-duplicates when their word sets overlap this much (intersection over union).
#: Chosen before measuring as "more than half again as many shared words as differing ones"; the
#: demo's copies of one failure score 0.64–1.0, LoCoMo's turns almost never reach it (``make eval``
#: reports the rate).
SIMILAR_JACCARD = 0.6
#: An entry is contained in another when this share of its words are in the other's ...
CONTAINED_SHARE = 0.9
#: ... and it has at least this many: on LoCoMo's dev split 7 of 803,286 turn pairs are then
#: contained one in the other, all pleasantries ("Thanks, Melanie! Your kind words mean a lot.").
MIN_CONTAINED_WORDS = 6
#: An observation is folded into a lesson of its own session kept above it when the lesson has this
#: share of its words: the lesson was distilled from it and names the call, if not every input.
SOURCE_SHARE = 0.75
#: Texts with fewer distinct words than this are never called near-duplicates: "Thanks, Mel!" and
#: "Thanks, Caroline!" share half of very little.
MIN_WORDS = 4
_WORD = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")


def word_set(text: str) -> frozenset[str]:
    """The distinct words of ``text``, lower-cased, stop words out, every run of digits one ``0``
    (order A-1042 and order A-1107 are the same words)."""
    words = (_DIGITS.sub("0", w) for w in _WORD.findall(text.lower()))
    return frozenset(w for w in words if w not in STOP_WORDS)


def similar(a: frozenset[str], b: frozenset[str]) -> bool:
    if not a or not b:
        return False
    if len(a) < MIN_WORDS or len(b) < MIN_WORDS:
        return a == b
    shared = len(a & b)
    return shared >= SIMILAR_JACCARD * (len(a) + len(b) - shared)


def lessons_first(ranked: Sequence[Ranked]) -> list[Ranked]:
    """``ranked`` with each lesson moved up to just before the first ranked observation of its
    session, when one is ranked above it; everything else keeps its order."""
    lessons: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(ranked):
        c = r.candidate
        if c.layer == "memory" and c.session_id is not None:
            lessons[(c.owner_key, c.session_id)].append(i)
    if not lessons:
        return list(ranked)
    out: list[Ranked] = []
    moved: set[int] = set()
    for i, r in enumerate(ranked):
        c = r.candidate
        if i in moved:
            continue
        if c.layer == "observation" and c.session_id is not None:
            for j in lessons.get((c.owner_key, c.session_id), ()):
                if j > i and j not in moved:
                    moved.add(j)
                    out.append(ranked[j])
        out.append(r)
    return out


def contained(small: frozenset[str], big: frozenset[str]) -> bool:
    """Whether ``big`` says what ``small`` says and more: nearly all of ``small``'s words (of at
    least ``MIN_CONTAINED_WORDS``) are in it. "create_ticket failed with 'HTTP 429 …'" is in
    "After create_ticket failed with 'HTTP 429 …', retrying create_ticket with backoff_s=30 worked"."""
    if len(small) < MIN_CONTAINED_WORDS or len(big) < len(small):
        return False
    return len(small & big) >= CONTAINED_SHARE * len(small)


def _source_of(r: Ranked, mine: frozenset[str], lesson: Ranked, theirs: frozenset[str]) -> bool:
    """Whether ``r`` is an observation of the session ``lesson`` was distilled from and the lesson
    says most of it (``SOURCE_SHARE`` of its words): the raw call behind "after git_push failed
    with …, retrying git_push with … worked"."""
    c, learned = r.candidate, lesson.candidate
    return (
        c.layer == "observation"
        and learned.layer == "memory"
        and c.session_id is not None
        and (c.owner_key, c.session_id) == (learned.owner_key, learned.session_id)
        and len(mine) >= MIN_WORDS
        and len(mine & theirs) >= SOURCE_SHARE * len(mine)
    )


def collapse_similar(ranked: Sequence[Ranked], limit: int) -> tuple[list[Ranked], int]:
    """The first ``limit`` entries of ``ranked`` that neither nearly repeat nor are contained in
    one kept before them, each with ``similar`` counting the entries folded into it; and how many
    entries of ``ranked`` were read to find them (the rest were not looked at, nor counted).

    An entry that contains one kept before it takes that one's place and count: it says
    everything the other does (the fix that names the failure, over the bare failure)."""
    kept: list[Ranked] = []
    words: list[frozenset[str]] = []
    read = 0
    for r in ranked:
        if len(kept) == limit:
            break
        read += 1
        # A quarantined entry's text is not shown, so it neither stands for others nor is folded.
        mine = frozenset() if r.candidate.quarantined else word_set(r.candidate.text)
        twin = next(
            (
                k
                for k, theirs in enumerate(words)
                if similar(mine, theirs) or contained(mine, theirs) or _source_of(r, mine, kept[k], theirs)
            ),
            None,
        )
        if twin is not None:
            kept[twin] = kept[twin]._replace(similar=kept[twin].similar + 1 + r.similar)
            continue
        inside = [k for k, theirs in enumerate(words) if contained(theirs, mine)]
        if not inside:
            kept.append(r)
            words.append(mine)
            continue
        folded = sum(1 + kept[k].similar for k in inside)
        first = inside[0]
        kept[first], words[first] = r._replace(similar=r.similar + folded), mine
        for k in reversed(inside[1:]):
            del kept[k], words[k]
    return kept, read
