"""Text normalization and fingerprints for exact-text dedupe (SPEC 4.3).

Dedupe is deliberately exact-after-normalize, not similarity: two wordings of one lesson stay two
entries until governance merges them, so these functions must be stable across releases. Changing
them changes every stored fingerprint.
"""

from __future__ import annotations

import hashlib

__all__ = ["fingerprint", "normalize"]

# Exactly the characters SPEC 4.3 names; trailing punctuation of a sentence must not make a second memory.
_EDGE_CHARS = " .;:,-"


def normalize(text: str) -> str:
    """Lowercase, collapse every whitespace run to one space, strip `` .;:,-`` from both ends."""
    # str.split() with no argument splits on any unicode whitespace run and drops empty pieces.
    return " ".join(text.lower().split()).strip(_EDGE_CHARS)


def fingerprint(text: str) -> str:
    """Hex SHA-256 of the UTF-8 bytes of ``normalize(text)``."""
    return hashlib.sha256(normalize(text).encode("utf-8")).hexdigest()
