"""The distill gate (SPEC 4.1)."""

from __future__ import annotations

import pytest

from contracts.config import MemoryConfig
from services.distill.gate import distill_gate
from tests.factories import make_session


def test_distills_a_successful_session_with_enough_steps() -> None:
    """A successful two-step session with memory on everywhere is distilled."""
    assert distill_gate(make_session(steps=2), MemoryConfig(), org_memory_enabled=True) is None


def test_distills_failed_sessions_on_purpose() -> None:
    """Failed sessions are distilled: failures are what lessons are made of."""
    assert distill_gate(make_session(status="failed"), MemoryConfig(), org_memory_enabled=True) is None


def test_skips_when_memory_is_disabled_for_the_agent_config() -> None:
    """memory_enabled=false on the agent config skips with memory_disabled."""
    config = MemoryConfig(memory_enabled=False)
    assert distill_gate(make_session(), config, org_memory_enabled=True) == "memory_disabled"


def test_skips_when_memory_is_disabled_for_the_org() -> None:
    """The org-level switch turns distill off even when the agent config has memory on."""
    assert distill_gate(make_session(), MemoryConfig(), org_memory_enabled=False) == "org_memory_disabled"


def test_skips_when_writes_are_disabled() -> None:
    """memory_write_enabled=false skips with write_disabled (reads may still be on)."""
    config = MemoryConfig(memory_write_enabled=False)
    assert distill_gate(make_session(), config, org_memory_enabled=True) == "write_disabled"


@pytest.mark.parametrize("status", ["cancelled", "timeout"])
def test_skips_cancelled_and_timed_out_sessions(status: str) -> None:
    """Cancelled and timed-out sessions skip with status_<status>."""
    reason = distill_gate(make_session(status=status), MemoryConfig(), org_memory_enabled=True)
    assert reason == f"status_{status}"


@pytest.mark.parametrize("steps", [0, 1])
def test_skips_sessions_with_fewer_than_two_steps(steps: int) -> None:
    """A session of zero or one step skips with too_few_steps."""
    reason = distill_gate(make_session(steps=steps), MemoryConfig(), org_memory_enabled=True)
    assert reason == "too_few_steps"


def test_first_failing_condition_decides_the_reason() -> None:
    """With everything wrong at once the reason is the first check: memory_disabled."""
    config = MemoryConfig(memory_enabled=False, memory_write_enabled=False)
    session = make_session(status="cancelled", steps=0)
    assert distill_gate(session, config, org_memory_enabled=False) == "memory_disabled"
