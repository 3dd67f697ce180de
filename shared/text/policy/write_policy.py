"""The write policy every writer passes before anything is stored or embedded (SPEC 4.3).

Pure: it decides, the save path acts. Denial means nothing is written; quarantine means the entry is
stored with its reasons but never placed in a prompt (SPEC 5.4).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from shared.text.policy.injection import find_injection
from shared.text.policy.pii import find_pii, redact_pii

__all__ = [
    "PiiHandling",
    "PolicyDecision",
    "apply_metadata_policy",
    "apply_write_policy",
    "check_carried_fields",
]

PiiHandling = Literal["redact", "block", "allow"]
DEFAULT_MAX_CHARS = 8000


@dataclass(frozen=True)
class PolicyDecision:
    """What to store (``text``) and why, or why nothing may be stored (``denied``)."""

    #: the text to store: redacted under ``redact``, otherwise exactly what was given.
    text: str
    #: sorted distinct PII kinds that were replaced (empty unless ``pii_handling="redact"``).
    redactions: tuple[str, ...]
    quarantined: bool
    quarantine_reasons: tuple[str, ...]
    #: ``None`` when allowed; else ``"empty"``, ``"too_long"`` or ``"pii:<KIND>,<KIND>"``.
    denied: str | None

    @property
    def allowed(self) -> bool:
        """Whether the entry may be stored (possibly quarantined)."""
        return self.denied is None


def apply_write_policy(
    text: str, pii_handling: PiiHandling, max_chars: int = DEFAULT_MAX_CHARS
) -> PolicyDecision:
    """Apply size limits, PII handling and injection detection to one memory text."""
    if pii_handling not in get_args(PiiHandling):
        raise ValueError(f"pii_handling must be one of {get_args(PiiHandling)}, not {pii_handling!r}")
    if max_chars < 1:
        raise ValueError(f"max_chars must be at least 1, not {max_chars}")
    if not text.strip():
        return _denied(text, "empty")
    # The limit applies to what the writer sent; placeholders may make the stored text a little longer.
    if len(text) > max_chars:
        return _denied(text, "too_long")
    # Injection runs on the original: redaction could otherwise break up (and hide) an attack phrase.
    reasons = tuple(find_injection(text))
    stored = text
    redactions: tuple[str, ...] = ()
    if pii_handling == "redact":
        stored, kinds = redact_pii(text)
        redactions = tuple(kinds)
    elif pii_handling == "block":
        blocked = sorted({finding.kind for finding in find_pii(text)})
        if blocked:
            return _denied(text, "pii:" + ",".join(blocked))
    return PolicyDecision(stored, redactions, bool(reasons), reasons, None)


def check_carried_fields(
    decision: PolicyDecision, memory_type: str, metadata: Mapping[str, Any]
) -> PolicyDecision:
    """``decision`` (on the text) with the free-form fields an entry carries beside it checked too:
    the type (recall's narrative format shows it) and every string of the metadata, keys included
    (results, listings and exports return it). An attack in either quarantines the entry as one in
    the text does, with ``memory_type`` or ``metadata`` among the reasons; then both are withheld
    wherever the text is (docs/adr/0021-quarantine.md)."""
    reasons = list(decision.quarantine_reasons)
    if find_injection(memory_type):
        reasons.append("memory_type")
    if any(find_injection(s) for s in _strings(metadata)):
        reasons.append("metadata")
    if len(reasons) == len(decision.quarantine_reasons):
        return decision
    return replace(decision, quarantined=True, quarantine_reasons=tuple(reasons))


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, object keys included (iteratively: nesting is the writer's)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def _denied(text: str, reason: str) -> PolicyDecision:
    return PolicyDecision(text=text, redactions=(), quarantined=False, quarantine_reasons=(), denied=reason)


def apply_metadata_policy(
    metadata: dict[str, Any], pii_handling: PiiHandling
) -> tuple[dict[str, Any], tuple[str, ...], str | None]:
    """PII handling for every string inside an entry's ``metadata`` (keys and values, nested):
    ``(metadata to store, kinds redacted, denial reason or None)``. Metadata is stored and
    exported like the text, so it gets the same treatment; injection checks stay on the text,
    which is what reaches a prompt."""
    if pii_handling == "allow" or not metadata:
        return metadata, (), None
    kinds: set[str] = set()

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            if pii_handling == "block":
                kinds.update(f.kind for f in find_pii(value))
                return value
            redacted, found = redact_pii(value)
            kinds.update(found)
            return redacted
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    cleaned = clean(metadata)
    if pii_handling == "block" and kinds:
        return metadata, (), "pii:" + ",".join(sorted(kinds))
    return cleaned, tuple(sorted(kinds)), None
