"""Normalization and fingerprints (SPEC 4.3): exact-text dedupe after normalize."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.text.policy import fingerprint, normalize


def test_case_spacing_and_edge_punctuation_share_a_fingerprint() -> None:
    """Case, whitespace runs and edge punctuation do not make a second memory."""
    assert fingerprint("  Hello,  World. ") == fingerprint("hello, world")


def test_other_wording_has_another_fingerprint() -> None:
    """Dedupe is exact after normalize: dropping inner punctuation is a different text."""
    assert fingerprint("hello world") != fingerprint("hello, world")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Hello,  World. ", "hello, world"),
        ("Retry\twith\n\nthe  SANITIZED name;", "retry with the sanitized name"),
        ("-- note: keep v1.2 --", "note: keep v1.2"),
        (" .;:,- ", ""),
        ("a\u00a0\u2003b", "a b"),
    ],
)
def test_normalize_examples(raw: str, expected: str) -> None:
    """normalize lowercases, collapses every whitespace run and strips only ` .;:,-` at the ends."""
    assert normalize(raw) == expected


def test_fingerprint_is_hex_sha256_of_normalized_utf8() -> None:
    """The fingerprint is the hex SHA-256 of the UTF-8 of the normalized text."""
    expected = hashlib.sha256("café au lait".encode()).hexdigest()
    assert fingerprint(" Café  au LAIT. ") == expected


@given(st.text())
def test_normalize_is_idempotent(text: str) -> None:
    """Normalizing twice changes nothing, so stored texts re-fingerprint identically."""
    assert normalize(normalize(text)) == normalize(text)


@given(st.text())
def test_fingerprint_ignores_prior_normalization(text: str) -> None:
    """A writer that normalizes first gets the same fingerprint as one that does not."""
    assert fingerprint(normalize(text)) == fingerprint(text)
