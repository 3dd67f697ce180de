"""The trace summary a model sees (SPEC 4.1: at most 25 calls, and which)."""

from __future__ import annotations

from contracts.events import ToolCall
from services.distill.summary import summarize_trace
from tests.factories import make_call, make_session


def _long_trace() -> list[ToolCall]:
    """35 calls: mostly repeats of one tool, with failures, a recovery and a remember note."""
    trace = [make_call("read_file", {"path": f"src/{i}.py"}, output=f"contents {i}") for i in range(35)]
    trace[5] = make_call("run_tests", {"k": "billing"}, error="AssertionError: expected 200, got 500")
    trace[6] = make_call("run_tests", {"k": "billing"}, output="1 passed")
    trace[12] = make_call("git_push", {"branch": "main"}, error="rejected: non-fast-forward")
    trace[20] = make_call("shell", {"cmd": "make"}, error="make: *** [all] Error 2")
    trace[27] = make_call("notes", {"text": "remember: staging uses port 8443"}, output="saved")
    return trace


def test_keeps_at_most_25_of_a_long_trace() -> None:
    """A 35-call trace is cut to 25 calls, and the summary says so."""
    summary = summarize_trace(make_session(tool_trace=_long_trace()))
    assert len(summary.kept_indexes) == 25
    assert summary.total_calls == 35
    assert "kept 25 of 35 calls (errors, recoveries, first/last, distinct tools)" in summary.text


def test_keeps_every_error_recovery_remember_and_edge_call() -> None:
    """Errors, the recovery, the remember note, and the first and last call are always kept."""
    summary = summarize_trace(make_session(tool_trace=_long_trace()))
    assert {0, 5, 6, 12, 20, 27, 34} <= set(summary.kept_indexes)


def test_errors_win_even_when_they_are_most_of_the_trace() -> None:
    """With 25 errors among 40 calls, exactly the 25 errors are kept."""
    trace = [
        make_call(f"tool{i % 3}", {"i": i}, error=f"boom {i}") if i % 8 < 5 else make_call("ok", {"i": i})
        for i in range(40)
    ]
    errors = [i for i, call in enumerate(trace) if call.error is not None]
    assert len(errors) == 25
    assert list(summarize_trace(make_session(tool_trace=trace)).kept_indexes) == errors


def test_renders_kept_calls_in_trace_order() -> None:
    """Kept calls appear as '#<idx> tool(...)' lines in trace order, with their errors."""
    summary = summarize_trace(make_session(tool_trace=_long_trace()))
    call_lines = [line for line in summary.text.splitlines() if line.startswith("#")]
    assert [int(line.split()[0][1:]) for line in call_lines] == list(summary.kept_indexes)
    assert list(summary.kept_indexes) == sorted(summary.kept_indexes)
    assert '#12 git_push({"branch":"main"}) [ERROR: rejected: non-fast-forward]' in call_lines


def test_header_names_task_and_status() -> None:
    """The first line carries the task and how the session ended."""
    session = make_session(task="Fix the flaky CI", status="failed", tool_trace=[make_call()])
    assert (
        summarize_trace(session).text.splitlines()[0] == "Task: Fix the flaky CI | status: failed | steps: 3"
    )


def test_truncates_long_inputs_and_outputs_to_one_line() -> None:
    """Inputs are cut to 200 characters, outputs to 300, and newlines never split a call's line."""
    call = make_call("fetch", {"url": "x" * 1000}, output="line\n" * 500)
    summary = summarize_trace(make_session(tool_trace=[call]))
    line = summary.text.splitlines()[2]
    rendered_input = line[len("#0 fetch(") : line.index(") -> ")]
    rendered_output = line[line.index(") -> ") + len(") -> ") :]
    assert len(rendered_input) == 200
    assert rendered_input.endswith("…")
    assert len(rendered_output) == 300
    assert len(summary.text.splitlines()) == 3


def test_prefers_distinct_tools_over_repeats() -> None:
    """Given room for one more call, a new tool beats another call of a tool already kept."""
    trace = [make_call("read_file", {"i": i}) for i in range(6)] + [make_call("grep", {"q": "x"})]
    trace.append(make_call("read_file", {"i": 99}))
    summary = summarize_trace(make_session(tool_trace=trace), limit=3)
    assert summary.kept_indexes == (0, 6, 7)


def test_prefers_longer_outputs_among_equals() -> None:
    """Among otherwise equal calls, the one with the longer output is kept."""
    trace = [make_call("read_file", {"i": i}, output="x" * (10 if i != 3 else 1500)) for i in range(6)]
    summary = summarize_trace(make_session(tool_trace=trace), limit=3)
    assert summary.kept_indexes == (0, 3, 5)


def test_is_deterministic() -> None:
    """The same session always gives the same summary."""
    session = make_session(tool_trace=_long_trace())
    assert summarize_trace(session) == summarize_trace(session.model_copy())


def test_empty_trace() -> None:
    """A session without calls still has a header and says it kept nothing."""
    summary = summarize_trace(make_session())
    assert summary.kept_indexes == ()
    assert "kept 0 of 0 calls" in summary.text


async def test_the_summary_is_rendered_only_when_a_distiller_reads_it() -> None:
    """Choosing the calls is eager and cheap; rendering them (PII-safe cuts of long fields) waits
    for ``text``, which the built-in distiller never reads: its sessions pay nothing for it."""
    from shared.adapters.distillers.builtin import BuiltinDistiller
    from shared.ports import TraceSummary

    session = make_session(tool_trace=[{"tool": "deploy", "output": "x" * 5000, "error": "boom"}])
    chosen = summarize_trace(session)

    def refuse() -> str:
        raise AssertionError("rendered")

    lazy = TraceSummary(kept_indexes=chosen.kept_indexes, total_calls=chosen.total_calls, render=refuse)
    assert await BuiltinDistiller().distill(session, lazy)
    assert chosen.text.startswith("Task:")
