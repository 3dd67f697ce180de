"""The write policy: normalization and fingerprints, PII redaction, injection detection (SPEC 4.3).

Pure functions over text (the standard library plus ``python-stdnum`` check digits and
``phonenumbers`` numbering plans), so every writer (distill, save, append, import) applies exactly
the same rules.
"""

from shared.text.policy.injection import INJECTION_REASONS, find_injection, is_injection
from shared.text.policy.normalize import fingerprint, normalize
from shared.text.policy.pii import PII_KINDS, PiiFinding, clip_outside_pii, find_pii, redact_pii
from shared.text.policy.write_policy import (
    PiiHandling,
    PolicyDecision,
    apply_metadata_policy,
    apply_write_policy,
    check_carried_fields,
)

__all__ = [
    "INJECTION_REASONS",
    "PII_KINDS",
    "PiiFinding",
    "PiiHandling",
    "PolicyDecision",
    "apply_metadata_policy",
    "apply_write_policy",
    "check_carried_fields",
    "clip_outside_pii",
    "find_injection",
    "find_pii",
    "fingerprint",
    "is_injection",
    "normalize",
    "redact_pii",
]
