"""Knowledge updates (SPEC 7.2): does a new entry update or contradict an older one of the same
owner? The offline rules over the two texts (docs/adr/0103-knowledge-updates.md).

A pair is an update when both texts speak of the **same subject** (the words before the
predicate: "Alice", "my sister", "to deploy the app"; "I", "my", "the user" are all the owner)
and either

- **contradict** each other: one negates what the other says, the rest equal ("Alice eats meat" →
  "Alice no longer eats meat"), or
- name the **same attribute** with a **changed value**. An attribute is a family of trigger words
  ("lives", "moved to", "relocated" are one: residence). A single-valued attribute (residence,
  employer, role, a favourite *x*, plan, time zone, relationship status) is updated by any value
  that replaces the old one; one that only adds to it ("… in Boston with her cat") is not. A
  multi-valued one (likes, prefers, uses, eats, procedures) holds several values at once, so the
  new text must also say that something changed ("now", "switched", "no longer", "instead" …) and
  share a word of the old value ("prefers dark mode" → "now prefers light mode").

Anything else is not an update: another subject ("Alice's sister"), another attribute, the same
value said again, an addition ("also likes chess"). Wrongly superseding hides a true memory, so
the rules lean to "no"; :func:`maybe_related` says which undecided pairs a model may judge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "ELIGIBLE_LAYER",
    "INELIGIBLE_TYPES",
    "Reading",
    "Verdict",
    "could_update",
    "eligible",
    "judge_pair",
    "maybe_related",
    "past_cue",
    "read",
    "search_words",
]

#: Only remembered knowledge is superseded: observations are raw activity.
ELIGIBLE_LAYER = "memory"
#: Types never superseded: an episode records that something happened or was said (a later one
#: does not make it untrue; LoCoMo's turns are episodic), and a LangGraph item is replaced by a
#: ``put`` on its own key, while items under other keys are independent by LangGraph's contract.
INELIGIBLE_TYPES = frozenset({"episodic", "langgraph"})


def eligible(memory_type: str, layer: str, quarantined: bool = False) -> bool:
    """Whether an entry of this kind takes part in supersession (as the old or the new one)."""
    return layer == ELIGIBLE_LAYER and memory_type not in INELIGIBLE_TYPES and not quarantined


def _words(spaced: str) -> frozenset[str]:
    return frozenset(spaced.split())


_TOKEN_RE = re.compile(r"[a-z0-9_]+(?:'[a-z]+)?|,")
_SELF = frozenset(
    {"i", "me", "my", "mine", "myself", "i'm", "i've", "user", "user's", "customer", "customer's"}
)
_ARTICLES = frozenset({"the", "a", "an"})
_AUX = _words(
    "is are was were am be been being has have had will would does do did should must can "
    "could may might shall it's she's he's they're we're gets got holds hold says say said"
)
_NEGATIONS = _words(
    "not no never doesn't don't isn't aren't won't cannot can't didn't hasn't haven't wasn't "
    "weren't nor neither longer stopped quit gave"
)
#: Words saying that something changed (the new text's).
_CHANGE = _words(
    "now currently switched switch changed change anymore instead stopped quit became become "
    "newly nowadays updated replaced recently since started upgraded downgraded longer moved "
    "relocated transferred new also additionally extra another first must latest left"
)
#: Change words that do not make a multi-valued attribute's new value a replacement ("also").
_ADDITIVE = frozenset({"also", "additionally", "too", "well", "another", "extra"})
_FILLER = _words(
    "in to at for of on with by from as and or but her his their its our your she he they it "
    "we you that this these those there here than over into onto out up so just very really "
    "still then when which who what where days finally actually officially well too be only "
    "going forward any more s all some much lot lots usually always mostly"
)


@dataclass(frozen=True)
class _Family:
    name: str
    triggers: frozenset[str]
    single: bool


_FAMILIES = (
    _Family(
        "residence",
        _words(
            "live lives living lived reside resides resided residing moved move moves moving "
            "relocated relocate relocates relocating based home address apartment house"
        ),
        True,
    ),
    _Family(
        "employer",
        _words("work works working worked employer employed job joined join company hired office"),
        True,
    ),
    _Family("role", _words("title role position promoted promotion"), True),
    _Family(
        "relationship",
        _words("single married divorced engaged dating widowed separated"),
        True,
    ),
    _Family("timezone", _words("timezone zone"), True),
    _Family("plan", _words("plan subscription tier"), True),
    _Family(
        "preference",
        _words(
            "prefer prefers preferred preference like likes liked love loves loved enjoy "
            "enjoys hate hates dislike dislikes fan rather"
        ),
        False,
    ),
    _Family(
        "usage",
        _words("use uses using used editor ide browser drives drive runs run laptop phone"),
        False,
    ),
    _Family(
        "diet",
        _words("eat eats eating ate drink drinks drinking diet vegetarian vegan pescatarian"),
        False,
    ),
    _Family("speaks", _words("speak speaks speaking language"), False),
)
_RELATIONSHIP = next(f.triggers for f in _FAMILIES if f.name == "relationship")
_TRIGGERS = frozenset(t for f in _FAMILIES for t in f.triggers) | {"favorite", "favourite"}
#: Nouns after a possessive that make the possessor the subject ("Alice's job", "my favourite").
_ATTRIBUTE_NOUNS = _words(
    "favorite favourite job employer home address role title position plan "
    "subscription tier timezone time diet editor browser phone laptop language "
    "preference"
)
#: Trigger nouns that name a multi-valued attribute's category ("as her editor"): sharing one
#: counts as sharing the old value's head.
_HEAD_NOUNS = _words("editor ide browser laptop phone language diet")
#: How a procedure or a conditional lesson begins: its goal or condition is its subject.
_PROCEDURE_OPENERS = frozenset({"to", "when", "before", "after", "if", "for", "whenever"})
_MAX_SUBJECT = 4
#: Words that open a sentence before its subject ("These days Alice …").
_LEADING = frozenset(
    {"these", "days", "lately", "so", "well", "actually", "finally", "officially", "and", "but"}
)


def _stem(word: str) -> str:
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


@dataclass(frozen=True)
class Reading:
    """What the rules read from one text."""

    subject: str | None
    #: attribute names ("residence", "favorite:color", "procedure")
    attributes: frozenset[str]
    #: content words that are neither subject, trigger, change word, negation nor filler (stemmed)
    values: frozenset[str]
    #: the values the text says were left ("left Boston", "switched from Vim", "replaced Emacs")
    departed: frozenset[str]
    #: every content word, triggers included (stemmed): what a contradiction compares
    content: frozenset[str]
    negated: bool
    changed: bool
    additive: bool
    words: frozenset[str]


@lru_cache(maxsize=4096)
def read(text: str) -> Reading:
    """The subject, attributes and values of one text (cached: a batch compares a text often)."""
    tokens = _TOKEN_RE.findall(text.lower().replace("\u2019", "'"))
    words = [t for t in tokens if t != ","]
    subject, body = _subject(tokens)
    attributes: set[str] = set()
    triggers: set[str] = set()
    for i, word in enumerate(body):
        if word in ("favorite", "favourite") and i + 1 < len(body):
            noun = body[i + 1]
            attributes.add(f"favorite:{_stem(noun)}")
            triggers.update((word, noun))
            continue
        for family in _FAMILIES:
            if word in family.triggers:
                attributes.add(family.name)
                triggers.add(word)
    if subject is not None and subject.startswith("procedure:"):
        attributes.add("procedure")
    subject_words = set(subject.split()) if subject else set()
    negated = any(w in _NEGATIONS for w in body) or "no longer" in " ".join(body)
    changed = any(w in _CHANGE for w in body)
    additive = any(w in _ADDITIVE for w in body)
    content = frozenset(
        _stem(w)
        for w in body
        if w not in _FILLER
        and w not in _AUX
        and w not in _NEGATIONS
        and w not in _CHANGE
        and w not in _ARTICLES
        and w not in _SELF
    )
    # A relationship status is its own value ("single" → "engaged").
    masked = {_stem(t) for t in triggers if t not in _RELATIONSHIP}
    values = frozenset(v for v in content if v not in masked and v not in subject_words)
    departed = _departed(body) & values
    return Reading(
        subject=subject,
        departed=departed,
        attributes=frozenset(attributes),
        values=values - {","},
        content=content - {","},
        negated=negated,
        changed=changed,
        additive=additive,
        words=frozenset(_stem(w) for w in words),
    )


_DEPARTING = frozenset({"left", "from", "replaced", "quit"})
_DEPARTED_END = frozenset({"and", "to", "for", "with", "by", "in", "at", "this", "last", "now", ","})


def _departed(body: list[str]) -> frozenset[str]:
    out: set[str] = set()
    for i, word in enumerate(body):
        if word in _DEPARTING:
            for nxt in body[i + 1 : i + 5]:
                if nxt in _DEPARTED_END:
                    break
                out.add(_stem(nxt))
    return frozenset(out)


def _subject(tokens: list[str]) -> tuple[str | None, list[str]]:
    """The subject (normalized: the owner is ``self``) and the words after it; None when the
    text has no recognisable subject within its first words."""
    words = list(tokens)
    if words and words[0] in _PROCEDURE_OPENERS and "," in words[:16]:
        cut = words.index(",")
        goal = [_stem(w) for w in words[1:cut] if w not in _ARTICLES and w not in _FILLER]
        return ("procedure:" + " ".join(goal), [w for w in words[cut + 1 :] if w != ","])
    words = [w for w in words if w != ","]
    span: list[str] = []
    for i, word in enumerate(words):
        if word in _AUX or word in _NEGATIONS or word in _CHANGE or word in _TRIGGERS:
            break
        if word.endswith("'s") and i + 1 < len(words) and words[i + 1] in _ATTRIBUTE_NOUNS:
            span.append(word[:-2])
            return _normalize_subject(span), words[i + 1 :]
        if word in ("my", "user's", "customer's") and i + 1 < len(words) and words[i + 1] in _ATTRIBUTE_NOUNS:
            span.append(word)
            return _normalize_subject(span), words[i + 1 :]
        span.append(word)
        if len(span) > _MAX_SUBJECT:
            return None, words
    else:
        return None, words
    if not span:
        return "self", words  # "Lives in Boston now": about the owner
    return _normalize_subject(span), words[len(span) :]


def _normalize_subject(span: list[str]) -> str:
    kept = ["self" if w in _SELF else _stem(w) for w in span if w not in _ARTICLES and w not in _LEADING]
    # "the user" / "user" / "I" are one subject; "my sister" stays "self sister".
    return " ".join(kept) or "self"


@dataclass(frozen=True)
class Verdict:
    supersedes: bool
    #: why (an audit record's detail): contradiction, changed:<attribute>, or what blocked it
    reason: str


def judge_pair(old_text: str, new_text: str) -> Verdict:
    """Whether ``new_text`` updates or contradicts ``old_text`` (both the same owner's)."""
    old, new = read(old_text), read(new_text)
    if old.subject is None or new.subject is None or old.subject != new.subject:
        return Verdict(False, "other_subject")
    if (
        old.negated != new.negated
        and _overlap(old.content, new.content) >= 0.6
        and len(new.content - old.content) <= 1
    ):
        return Verdict(True, "contradiction")
    if (
        old.negated != new.negated
        and old.values
        and old.values <= new.values
        and len(new.values - old.values) <= 1
        and (old.attributes & new.attributes or not new.attributes)
    ):
        return Verdict(True, "contradiction")  # "gave up coffee this year"
    if old.values and old.values <= new.departed and new.values - new.departed:
        return Verdict(True, "replaced")  # "switched from window seats to aisle seats"
    common = old.attributes & new.attributes
    if not common:
        return Verdict(False, "other_attribute")
    if new.values <= old.values:
        return Verdict(False, "same_value")
    single = {f.name for f in _FAMILIES if f.single}
    for attribute in sorted(common):
        if attribute in single or attribute.startswith("favorite:"):
            current = new.values - new.departed
            if old.values and current and not old.values <= current:
                return Verdict(True, f"changed:{attribute}")
            continue
        # Multi-valued: the new text must say it replaces, and name something of the old value.
        additive = new.additive and attribute != "procedure"  # a procedure's new step is an update
        shared = old.values & new.values or old.words & new.words & _HEAD_NOUNS
        if new.changed and not additive and shared and old.values != new.values:
            return Verdict(True, f"changed:{attribute}")
        if new.negated != old.negated and old.values & new.values:
            return Verdict(True, f"changed:{attribute}")
    return Verdict(False, "added_value")


def could_update(text: str, *, with_model: bool = False) -> bool:
    """Whether a new text could supersede anything: the rules need a subject and an attribute, a
    negation or a value it says was left; a model judge a subject. Most distilled lessons
    ("refund_payment failed with …") have none, and then no candidate is looked up."""
    reading = read(text)
    if reading.subject is None:
        return False
    return with_model or bool(reading.attributes or reading.negated or reading.departed)


def search_words(text: str) -> list[str]:
    """The words to find a new text's candidates by: its own, and the trigger words of the
    attributes it names ("I moved to Oslo" also looks for "live", "home", "based" …), so an older
    entry about the same attribute is found even when the two share no word ("My home is in
    Prague": the owner is "I" in one and "my" in the other, both stop words to full-text search)."""
    reading = read(text)
    words = [w for w in _TOKEN_RE.findall(text.lower().replace("\u2019", "'")) if w != ","]
    for attribute in sorted(reading.attributes):
        if attribute.startswith("favorite:"):
            words += ["favorite", "favourite", attribute.split(":", 1)[1]]
        for family in _FAMILIES:
            if family.name == attribute:
                words += sorted(family.triggers)
    return list(dict.fromkeys(words))


def maybe_related(old_text: str, new_text: str) -> bool:
    """Whether a pair the rules did not call an update is close enough for a model to judge:
    the same subject, and an attribute or most content words in common."""
    old, new = read(old_text), read(new_text)
    if old.subject is None or old.subject != new.subject:
        return False
    return bool(old.attributes & new.attributes) or _overlap(old.content, new.content) >= 0.5


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / max(1, min(len(a), len(b)))


_PAST_RE = re.compile(
    r"\b(before|previous|previously|formerly|former|used to|earlier|originally|at first|past|prior|"
    r"no longer|anymore|old|older|history|changed|did|was|were)\b",
    re.IGNORECASE,
)


def past_cue(cue: str) -> bool:
    """Whether a recall cue asks about the past ("where did Alice live before …"): then recall
    also reaches superseded knowledge (history), not only what is current."""
    return bool(_PAST_RE.search(cue))
