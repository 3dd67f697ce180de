"""The tests' wait on a condition: it names what it waited for and what was still missing."""

from __future__ import annotations

import pytest

from tests.platform import eventually, until_nothing_missing


async def test_a_timed_out_wait_names_each_part_still_missing() -> None:
    """A wait that times out says what it waited for and every part missing at the last look."""
    looks = 0

    async def missing() -> list[str]:
        nonlocal looks
        looks += 1
        return ["ingest-1 not ready: /readyz 503, failing: nats", f"NATS recall: look {looks}"]

    with pytest.raises(AssertionError) as failure:
        await until_nothing_missing(missing, what="the deployment serving again", timeout=0.2, interval=0.01)
    message = str(failure.value)
    assert "the deployment serving again" in message
    assert "ingest-1 not ready: /readyz 503, failing: nats" in message
    assert f"NATS recall: look {looks}" in message  # the last look, not the first


async def test_a_transient_error_is_not_yet_and_shown_as_seen() -> None:
    """A look that raises a transient error counts as "not yet", and the error is what it saw."""

    async def missing() -> list[str]:
        raise ConnectionRefusedError("Postgres restarting")

    with pytest.raises(AssertionError, match="ConnectionRefusedError: Postgres restarting"):
        await until_nothing_missing(
            missing, what="rows", timeout=0.1, interval=0.01, transient=(ConnectionRefusedError,)
        )


async def test_a_wait_returns_once_nothing_is_missing() -> None:
    """The wait returns at the first look that finds nothing missing."""
    left = ["a", "b"]

    async def missing() -> list[str]:
        return [left.pop()] if left else []

    await until_nothing_missing(missing, what="both", timeout=30)
    assert left == []


async def test_eventually_names_its_condition() -> None:
    """``eventually`` (a yes/no condition) fails naming what it waited for."""

    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match="the thing"):
        await eventually(never, timeout=0.1, interval=0.01, what="the thing")
