"""The built-in distiller: lessons from the trace by rules, when no model is configured."""

from __future__ import annotations

from services.distill.summary import summarize_trace
from shared.adapters.distillers.builtin import BuiltinDistiller, distill_session
from shared.ports import Distiller, Lesson
from tests.factories import make_call, make_session, make_turn


async def test_implements_the_distiller_port() -> None:
    """BuiltinDistiller is a Distiller named "builtin" and answers through distill()."""
    distiller = BuiltinDistiller()
    session = make_session(status="failed", tool_trace=[make_call("shell", error="exit 1")])
    assert isinstance(distiller, Distiller)
    assert distiller.name == "builtin"
    assert await distiller.distill(session, summarize_trace(session)) == distill_session(session)


def test_an_unrecovered_failure_becomes_a_task_independent_lesson() -> None:
    """A failed call that never worked later yields "<tool> failed with '<error>'", task left out
    so that the same failure in another task reinforces the same lesson."""
    # The next call (another tool, unrelated input) is just the next step, not a recovery.
    session = make_session(
        task="Deploy the billing service",
        tool_trace=[
            make_call("kubectl_apply", {"f": "deploy.yaml"}, error="forbidden: no RBAC role"),
            make_call("ls"),
        ],
    )
    expected = Lesson(
        "kubectl_apply failed with 'forbidden: no RBAC role'.",
        0.6,
        "lesson",
    )
    assert expected in distill_session(session)


def test_repeated_failures_and_the_fatal_error_matter_more() -> None:
    """A tool failing twice, with the last error of a failed session, is the most important (0.8)."""
    trace = [make_call("shell", {"cmd": "make"}, error="make: Error 2") for _ in range(2)]
    lessons = distill_session(make_session(status="failed", tool_trace=trace))
    assert lessons[0].text.startswith("shell failed with 'make: Error 2'")
    assert lessons[0].importance == 0.8


def test_long_errors_are_cut_to_160_characters() -> None:
    """Error text in a lesson is at most 160 characters, and every lesson stays under 400."""
    session = make_session(status="failed", task="t" * 5000, tool_trace=[make_call("x", error="e" * 1000)])
    lessons = distill_session(session)
    assert "'" + "e" * 159 + "…'" in lessons[0].text
    assert all(len(lesson.text) < 400 for lesson in lessons)


def test_a_retry_that_worked_is_a_procedural_recovery() -> None:
    """Failed, then something else ran, then the same tool worked: a recovery lesson says what helped."""
    session = make_session(
        task="Ship release 1.4",
        tool_trace=[
            make_call("git_push", {"branch": "main"}, error="rejected: non-fast-forward"),
            make_call("git_pull", {"rebase": True}),
            make_call("git_push", {"branch": "main"}),
        ],
    )
    lessons = distill_session(session)
    assert (
        Lesson(
            "After git_push failed with 'rejected: non-fast-forward' while working on 'Ship release 1.4', "
            "running git_pull and then retrying git_push with the same input worked.",
            0.7,
            "procedural",
        )
        in lessons
    )
    # The failure itself is also kept, task-free, so meeting it again elsewhere reinforces it.
    assert Lesson("git_push failed with 'rejected: non-fast-forward'.", 0.6, "lesson") in lessons


def test_a_retry_with_other_input_names_what_changed() -> None:
    """When the same tool worked with different input, the lesson shows what changed in it."""
    session = make_session(
        tool_trace=[
            make_call("http_get", {"url": "http://api/v1/users"}, error="404 Not Found"),
            make_call("http_get", {"url": "http://api/v2/users"}),
        ]
    )
    [recovery] = [lesson for lesson in distill_session(session) if lesson.memory_type == "procedural"]
    assert 'retrying http_get with url="http://api/v2/users" worked.' in recovery.text


def test_another_tool_that_worked_instead_is_a_recovery() -> None:
    """A failed tool followed by another tool that worked on the same input is a recovery."""
    url = "https://example.com/pricing"
    session = make_session(
        tool_trace=[
            make_call("web_fetch", {"url": url}, error="403 Forbidden"),
            make_call("browser_open", [url]),
        ]
    )
    texts = [lesson.text for lesson in distill_session(session)]
    assert any(
        "After web_fetch failed with '403 Forbidden'" in t and "using browser_open instead" in t
        for t in texts
    )


def test_remember_statements_become_their_own_lessons() -> None:
    """'remember …', 'note to self: …', 'always/never …' in turns and tool outputs are lessons (0.8)."""
    session = make_session(
        transcript=[
            make_turn("Please remember that I prefer metric units in reports."),
            make_turn("I don't remember the old password, sorry."),
            make_turn("Always answer in JSON.", role="system"),
        ],
        tool_trace=[
            make_call(
                "notes", output={"saved": "Note to self: the staging database is read-only on Fridays."}
            ),
            make_call("docs", output="Never run migrations without a backup."),
        ],
    )
    assert distill_session(session) == [
        Lesson("I prefer metric units in reports.", 0.8, "preference"),
        Lesson("Never run migrations without a backup.", 0.8, "fact"),
        Lesson("The staging database is read-only on Fridays.", 0.8, "fact"),
    ]


def test_a_failed_session_records_its_last_error() -> None:
    """A failed session yields "Task '<task>' failed: <last error>" at 0.5."""
    session = make_session(
        status="failed",
        task="Migrate the orders table",
        tool_trace=[
            make_call("psql", error="lock timeout"),
            make_call("psql", error="relation does not exist"),
        ],
    )
    assert Lesson(
        "Task 'Migrate the orders table' failed: relation does not exist.", 0.5, "episodic"
    ) in distill_session(session)


def test_a_success_with_failures_gets_a_summary_lesson() -> None:
    """A session that succeeded despite failures says so; a clean success teaches nothing."""
    rough = make_session(task="Build", tool_trace=[make_call("cc", error="segfault"), make_call("cc")])
    clean = make_session(task="Build", tool_trace=[make_call("cc"), make_call("cc")])
    assert Lesson("Task 'Build' succeeded after 1 failed tool call (cc) along the way.", 0.6, "episodic") in (
        distill_session(rough)
    )
    assert distill_session(clean) == []


def test_caps_at_five_deduplicated_lessons_by_importance() -> None:
    """Many findings give at most 5 lessons, without duplicates, by importance then text."""
    trace = [make_call(f"tool{i}", {"i": i}, error=f"error {i}") for i in range(8)]
    trace += [make_call("tool0", {"i": 0}, error="error 0")]
    session = make_session(
        status="failed", tool_trace=trace, transcript=[make_turn("Remember: deploys need approval. " * 3)]
    )
    lessons = distill_session(session)
    assert len(lessons) == 5
    assert len({lesson.text for lesson in lessons}) == 5
    assert lessons == sorted(lessons, key=lambda lesson: (-lesson.importance, lesson.text))
    assert lessons[0] == Lesson("Deploys need approval.", 0.8, "fact")


def test_is_deterministic() -> None:
    """The same session always gives the same lessons, in the same order."""
    session = make_session(
        status="failed",
        tool_trace=[
            make_call(f"t{i % 4}", {"i": i}, error=f"e{i % 3}" if i % 2 else None) for i in range(30)
        ],
        transcript=[make_turn("Always pin versions. Remember: the VPN drops at midnight.")],
    )
    first = distill_session(session)
    assert first == distill_session(session.model_copy(deep=True))
    assert 0 < len(first) <= 5
