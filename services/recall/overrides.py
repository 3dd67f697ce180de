"""Per-request policy overrides (SPEC 5.4): only the axes a config marks relaxable.

Scope, visibility and ownership are never relaxable, even if a config lists them: an override
can only touch the axes this module knows how to apply (``OVERRIDABLE_AXES``) and the config
lists in ``policy.relaxable``. Anything else answers ``USER_OVERRIDE_NOT_PERMITTED``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.config import MemoryConfig
from contracts.errors import InvalidRequest, UserOverrideNotPermitted

__all__ = ["DIAGNOSTICS_VERBOSITIES", "OVERRIDABLE_AXES", "EffectivePolicy", "apply_overrides"]

OVERRIDABLE_AXES = frozenset({"memory_types_allowed", "diagnostics_verbosity"})
DIAGNOSTICS_VERBOSITIES = ("summary", "candidates")
_MAX_TYPES = 50
_MAX_TYPE_CHARS = 200


@dataclass(frozen=True)
class EffectivePolicy:
    #: ``None``: every memory type may be recalled.
    memory_types_allowed: tuple[str, ...] | None
    diagnostics_verbosity: str | None


def _memory_types(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > _MAX_TYPES:
        raise InvalidRequest(f"memory_types_allowed must be null or a list of at most {_MAX_TYPES} strings")
    if not all(isinstance(t, str) and 0 < len(t) <= _MAX_TYPE_CHARS for t in value):
        raise InvalidRequest("memory_types_allowed entries must be non-empty strings")
    return tuple(dict.fromkeys(value))


def _verbosity(value: Any) -> str | None:
    if value is not None and value not in DIAGNOSTICS_VERBOSITIES:
        raise InvalidRequest(f"diagnostics_verbosity must be null or one of {list(DIAGNOSTICS_VERBOSITIES)}")
    return value if value is None else str(value)


def apply_overrides(config: MemoryConfig, override: dict[str, Any] | None) -> EffectivePolicy:
    """The policy one recall runs under: ``config.policy`` with ``override`` laid on top.

    A key present in ``override`` replaces the config's value (``null`` included: for
    ``memory_types_allowed`` it allows every type). Every key must be relaxable (see module
    docstring), else :class:`UserOverrideNotPermitted` naming the first refused key (all of them
    in ``details["keys"]``); a bad value is :class:`InvalidRequest`. Keys are checked before values.
    """
    override = override or {}
    allowed = OVERRIDABLE_AXES.intersection(config.policy.relaxable)
    refused = sorted(key for key in override if key not in allowed)
    if refused:
        raise UserOverrideNotPermitted(
            f"policy_override may not change {refused[0]!r}; relaxable here: {sorted(allowed)}",
            {"keys": refused},
        )
    types = config.policy.memory_types_allowed
    return EffectivePolicy(
        memory_types_allowed=(
            _memory_types(override["memory_types_allowed"])
            if "memory_types_allowed" in override
            else (None if types is None else tuple(types))
        ),
        diagnostics_verbosity=_verbosity(override.get("diagnostics_verbosity")),
    )
