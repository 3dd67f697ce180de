"""Per-request policy overrides (SPEC 5.4): only relaxable axes, never scope or visibility."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.config import MemoryConfig, PolicyConfig
from contracts.errors import ErrorCode, InvalidRequest, UserOverrideNotPermitted
from services.recall.overrides import EffectivePolicy, apply_overrides

DEFAULT = MemoryConfig()
NARROW = MemoryConfig(policy=PolicyConfig(memory_types_allowed=["lesson", "fact"]))


@pytest.mark.parametrize("override", [None, {}])
def test_no_override_keeps_the_config(override: dict[str, Any] | None) -> None:
    """Without an override the config's policy applies as stored."""
    assert apply_overrides(DEFAULT, override) == EffectivePolicy(None, None)
    assert apply_overrides(NARROW, override) == EffectivePolicy(("lesson", "fact"), None)


def test_relaxable_axes_can_be_overridden() -> None:
    """memory_types_allowed and diagnostics_verbosity are relaxable by default."""
    policy = apply_overrides(
        NARROW,
        {
            "memory_types_allowed": ["procedural", "lesson", "procedural"],
            "diagnostics_verbosity": "candidates",
        },
    )
    assert policy == EffectivePolicy(("procedural", "lesson"), "candidates")


def test_null_memory_types_allows_every_type() -> None:
    """An explicit null for memory_types_allowed lifts the config's type restriction."""
    assert apply_overrides(NARROW, {"memory_types_allowed": None}).memory_types_allowed is None


@pytest.mark.parametrize("key", ["scope", "visibility", "owner", "principal", "top_k", "unknown_axis"])
def test_other_keys_are_not_permitted(key: str) -> None:
    """Anything but a relaxable axis answers USER_OVERRIDE_NOT_PERMITTED naming the key."""
    with pytest.raises(UserOverrideNotPermitted, match=key) as caught:
        apply_overrides(DEFAULT, {key: "x", "memory_types_allowed": None})
    assert caught.value.code is ErrorCode.USER_OVERRIDE_NOT_PERMITTED
    assert caught.value.details["keys"] == [key]


def test_scope_stays_unrelaxable_even_if_a_config_lists_it() -> None:
    """A config cannot make scope or visibility relaxable by listing them."""
    config = MemoryConfig(policy=PolicyConfig(relaxable=["scope", "visibility", "memory_types_allowed"]))
    for key in ("scope", "visibility"):
        with pytest.raises(UserOverrideNotPermitted, match=key):
            apply_overrides(config, {key: "workload"})


def test_an_axis_the_config_does_not_relax_is_refused() -> None:
    """A config that relaxes nothing refuses even the usually relaxable axes."""
    config = MemoryConfig(policy=PolicyConfig(relaxable=[]))
    with pytest.raises(UserOverrideNotPermitted, match="memory_types_allowed"):
        apply_overrides(config, {"memory_types_allowed": ["lesson"]})


@pytest.mark.parametrize(
    "override",
    [
        {"memory_types_allowed": "lesson"},
        {"memory_types_allowed": [1]},
        {"memory_types_allowed": [""]},
        {"memory_types_allowed": ["x"] * 51},
        {"diagnostics_verbosity": "everything"},
        {"diagnostics_verbosity": 3},
    ],
)
def test_bad_values_are_invalid_requests(override: dict[str, Any]) -> None:
    """A relaxable axis with a malformed value answers INVALID_REQUEST."""
    with pytest.raises(InvalidRequest):
        apply_overrides(DEFAULT, override)
