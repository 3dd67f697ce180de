"""The built-in distiller: lessons derived from the trace by rules, when no model is configured.

It reads what a trace states plainly (which calls failed and with what error, which failures were
recovered and how, explicit "remember …" statements, how the session ended) and phrases each as a
self-contained sentence. Same session in, same lessons out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from contracts.events import SessionEnded, ToolCall
from shared.ports import Lesson, TraceSummary
from shared.text.trace_text import as_json, clip, is_nothing, one_line

__all__ = ["MAX_LESSONS", "BuiltinDistiller", "distill_session"]

MAX_LESSONS = 5
#: Explicit statements are capped below MAX_LESSONS so a chatty transcript or a fetched page full
#: of "always …" sentences cannot crowd out what the trace itself teaches.
MAX_STATEMENTS = 3
MAX_TEXT_CHARS = 399

_ERROR_CHARS = 160
_TASK_CHARS = 100
_INPUT_CHARS = 120
_SCAN_CHARS = 20_000

_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_LEAD = r"^(?:(?:please|also|and|so|ok|okay|important|pro tip)\b[\s,:!-]*)*"
_REMEMBER_RE = re.compile(
    _LEAD + r"(?P<verb>remember|note to self)\b(?:\s+that\b)?\s*[:,\-–]?\s*(?P<body>.+)$", re.IGNORECASE
)
_REMEMBER_INLINE_RE = re.compile(r"\b(?P<verb>remember|note to self)\s*:\s*(?P<body>.+)$", re.IGNORECASE)
_RULE_RE = re.compile(_LEAD + r"(?P<body>(?:always|never)\b.+)$", re.IGNORECASE)
_NOT_A_RULE_RE = re.compile(r"^never\s+mind\b", re.IGNORECASE)
_PREFERENCE_RE = re.compile(
    r"\b(?:prefer|prefers|preferred|preference|likes|i like|we like)\b", re.IGNORECASE
)
_BULLET_RE = re.compile(r"^[\s\-*>#•\"'`]+")


class BuiltinDistiller:
    """A :class:`~shared.ports.Distiller` that needs no model; see :func:`distill_session`."""

    name: str = "builtin"

    async def aclose(self) -> None:
        """Nothing held."""

    async def distill(self, session: SessionEnded, summary: TraceSummary) -> list[Lesson]:
        # The rules are cheap, so they read the whole trace rather than the summary's selection.
        return distill_session(session)


def distill_session(session: SessionEnded) -> list[Lesson]:
    """At most five lessons, by importance (highest first) and then text, without duplicates.

    - every failed call: "<tool> failed with '<error>'" — deliberately without the task, so the
      same failure seen again by the same owner reinforces one lesson instead of adding a
      near-copy per task
      (``lesson``, 0.6, +0.1 when the tool failed more than once, +0.1 for the last error of a
      failed session);
    - a recovered one: "After <tool> failed with '<error>' …, retrying <tool> … worked" or
      "… using <other tool> instead worked" (``procedural``, 0.7);
    - "remember …", "note to self: …", "always …", "never …" sentences in transcript turns (not
      the system prompt) and tool outputs (``preference`` when they speak of preferring or liking,
      else ``fact``, 0.8; at most three);
    - the outcome of a failed session, or of a successful one that had failures (``episodic``).
    """
    candidates = [
        *_trace_lessons(session),
        *_statement_lessons(session)[:MAX_STATEMENTS],
        *_outcome_lessons(session),
    ]
    best: dict[str, Lesson] = {}
    for lesson in candidates:
        known = best.get(lesson.text)
        if known is None or lesson.importance > known.importance:
            best[lesson.text] = lesson
    ranked = sorted(best.values(), key=lambda lesson: (-lesson.importance, lesson.text))
    return ranked[:MAX_LESSONS]


def _trace_lessons(session: SessionEnded) -> Iterator[Lesson]:
    trace = session.tool_trace
    failures = [i for i, call in enumerate(trace) if call.error is not None]
    failures_per_tool = Counter(trace[i].tool for i in failures)
    task = _task_quote(session)
    for i in failures:
        failed = trace[i]
        error = clip(one_line(failed.error or ""), _ERROR_CHARS)
        after = f"After {failed.tool} failed with '{error}' while working on {task}"
        retry = next((j for j in range(i + 1, len(trace)) if trace[j].tool == failed.tool), None)
        if retry is not None and trace[retry].error is None:
            yield Lesson(_finish(f"{after}, {_retry_phrase(trace, i, retry)} worked"), 0.7, "procedural")
        elif retry is None and session.status == "success" and _succeeded_elsewhere(trace, i):
            yield Lesson(_finish(f"{after}, using {trace[i + 1].tool} instead worked"), 0.7, "procedural")
        # The failure is a lesson of its own, recovered or not: phrased without the task, the same
        # failure met again by the same owner reinforces it rather than adding a near-copy.
        importance = 0.6
        if failures_per_tool[failed.tool] > 1:
            importance += 0.1
        if session.status == "failed" and i == failures[-1]:
            importance += 0.1
        text = f"{failed.tool} failed with '{error}'"
        yield Lesson(_finish(text), round(importance, 2), "lesson")


def _succeeded_elsewhere(trace: list[ToolCall], failed_index: int) -> bool:
    """Whether the call right after a failure is a different tool that worked on the same thing.

    "The same thing" means the two inputs share a value (the same URL, path, query…); without
    that, the next call is just the next step, not a replacement.
    """
    following = failed_index + 1
    if following >= len(trace):
        return False
    failed, then = trace[failed_index], trace[following]
    return (
        then.error is None and then.tool != failed.tool and bool(_values(failed.input) & _values(then.input))
    )


def _values(value: object) -> set[str]:
    """The distinctive scalar values of a JSON input (short ones like ``true`` or ``1`` say nothing)."""
    texts = (
        one_line(str(leaf)) for leaf in _leaves(value) if leaf is not None and not isinstance(leaf, bool)
    )
    return {text for text in texts if len(text) >= 3}


def _retry_phrase(trace: list[ToolCall], failed_index: int, retry_index: int) -> str:
    """How the failed tool came to work: what ran in between, and whether its input changed."""
    failed, retry = trace[failed_index], trace[retry_index]
    between: list[str] = []
    for call in trace[failed_index + 1 : retry_index]:
        if call.error is None and call.tool not in between:
            between.append(call.tool)
    how = f"retrying {retry.tool} {_input_change(failed.input, retry.input)}"
    if not between:
        return how
    shown = ", ".join(between[:3]) + (" and others" if len(between) > 3 else "")
    return f"running {shown} and then {how}"


def _input_change(before: object, after: object) -> str:
    """How the input of a retry that worked differed from the failed call's: what it set (or
    changed) and what it left out. Values that stayed the same are not the lesson (and are often
    an e-mail address or a card number that storage would only show as a placeholder)."""
    if after == before or (is_nothing(after) and is_nothing(before)):
        return "with the same input"
    if is_nothing(after):
        return "without input"
    old = {} if is_nothing(before) else before
    if not (isinstance(old, dict) and isinstance(after, dict)):
        return f"with input {clip(one_line(as_json(after)), _INPUT_CHARS)}"
    changed = [f"{one_line(k)}={as_json(after[k])}" for k in sorted(after) if old.get(k) != after[k]]
    dropped = [one_line(key) for key in sorted(old) if key not in after]
    parts = [f"with {', '.join(changed)}"] if changed else []
    if dropped:
        parts.append(f"without {', '.join(dropped)}")
    return clip(one_line(" and ".join(parts)), _INPUT_CHARS)


def _statement_lessons(session: SessionEnded) -> list[Lesson]:
    lessons: list[Lesson] = []
    seen: set[str] = set()
    for text in _statement_sources(session):
        for sentence in _SENTENCE_SPLIT_RE.split(text[:_SCAN_CHARS]):
            statement = _statement(sentence)
            if statement is None or statement in seen:
                continue
            seen.add(statement)
            memory_type = "preference" if _PREFERENCE_RE.search(statement) else "fact"
            lessons.append(Lesson(statement, 0.8, memory_type))
    return lessons


def _statement_sources(session: SessionEnded) -> Iterator[str]:
    # The system prompt is configuration, not something the agent learned.
    for turn in session.transcript or []:
        if turn.role.lower() != "system":
            yield turn.content
    for call in session.tool_trace:
        yield from (leaf for leaf in _leaves(call.output) if isinstance(leaf, str))


def _statement(sentence: str) -> str | None:
    """The lesson a sentence states explicitly, or ``None``."""
    sentence = one_line(_BULLET_RE.sub("", sentence))
    match = _REMEMBER_RE.match(sentence) or _REMEMBER_INLINE_RE.search(sentence)
    if match is not None:
        body = match.group("body")
        # "Remember to rotate the keys" only makes sense with its verb.
        statement = sentence[match.start("verb") :] if body.lower().startswith("to ") else body
    else:
        rule = _RULE_RE.match(sentence)
        if rule is None or _NOT_A_RULE_RE.match(rule.group("body")):
            return None
        statement = rule.group("body")
    statement = statement.strip(" \"'`")
    if len(statement) < 8 or len(statement.split()) < 3:
        return None
    return _finish(statement[0].upper() + statement[1:])


def _outcome_lessons(session: SessionEnded) -> Iterator[Lesson]:
    errors = [call for call in session.tool_trace if call.error is not None]
    task = f"Task {_task_quote(session)}" if session.task.strip() else "An untitled task"
    if session.status == "failed":
        if errors:
            last_error = clip(one_line(errors[-1].error or ""), _ERROR_CHARS)
            yield Lesson(_finish(f"{task} failed: {last_error}"), 0.5, "episodic")
        else:
            text = f"{task} failed after {session.steps} steps without any tool reporting an error"
            yield Lesson(_finish(text), 0.5, "episodic")
    elif session.status == "success" and errors:
        tools = sorted({call.tool for call in errors})
        shown = ", ".join(tools[:3]) + (" and others" if len(tools) > 3 else "")
        plural = "s" if len(errors) != 1 else ""
        text = f"{task} succeeded after {len(errors)} failed tool call{plural} ({shown}) along the way"
        yield Lesson(_finish(text), 0.6, "episodic")


def _leaves(value: object, depth: int = 0) -> Iterator[object]:
    """Every scalar inside a JSON value (bounded depth: it comes from untrusted tools)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        if depth < 8:
            for item in value:
                yield from _leaves(item, depth + 1)
    else:
        yield value


def _task_quote(session: SessionEnded) -> str:
    task = clip(one_line(session.task), _TASK_CHARS)
    return f"'{task}'" if task else "an untitled task"


def _finish(text: str) -> str:
    """One sentence, ending in punctuation, short enough to stand alone as a memory."""
    text = one_line(text)
    if text and text[-1] not in ".!?":
        text += "."
    return clip(text, MAX_TEXT_CHARS)
