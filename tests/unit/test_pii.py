"""PII and secret detection and redaction (SPEC 4.3, pii_handling)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.policy import PII_KINDS, find_pii, redact_pii

PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nq3Zk9+abc=\n-----END RSA PRIVATE KEY-----"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"

# (value as it appears in text, kind): every value is redacted wherever it appears between words.
POSITIVES = [
    ("jane.doe+billing@example.co.uk", "EMAIL"),
    ("+44 20 7946 0958", "PHONE"),
    ("(415) 555-0132", "PHONE"),
    ("1-800-555-0199", "PHONE"),
    ("+4915112345678", "PHONE"),
    ("4111 1111 1111 1111", "CARD"),
    ("4111-1111-1111-1111", "CARD"),
    ("3782 822463 10005", "CARD"),
    ("5500000000000004", "CARD"),
    ("DE89 3704 0044 0532 0130 00", "IBAN"),
    ("GB82WEST12345698765432", "IBAN"),
    ("123-45-6789", "NATIONAL_ID"),
    ("AB 12 34 56 C", "NATIONAL_ID"),
    ("10.0.0.12", "IP_ADDRESS"),
    ("2001:db8::ff00:42:8329", "IP_ADDRESS"),
    ("fe80::1", "IP_ADDRESS"),
    ("AKIAIOSFODNN7EXAMPLE", "SECRET"),
    ("sk-proj-Abc123def456ghi789jkl012mno345", "SECRET"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "SECRET"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "SECRET"),
    ("xoxb-123456789012-abcdefghijkl", "SECRET"),
    ("sk_live_abcdefghijklmnop1234", "SECRET"),
    ("rk_live_abcdefghijklmnop1234", "SECRET"),
    ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "SECRET"),
    (JWT, "SECRET"),
    (PRIVATE_KEY, "SECRET"),
]

# (text, kind that must not be found): near misses of each kind.
NEGATIVES = [
    ("write to user at example dot com", "EMAIL"),
    ("mention @oncall or foo@bar in the channel", "EMAIL"),
    ("the deploy took 1500 ms", "PHONE"),
    ("released on 2024-01-15 at 10:30:45", "PHONE"),
    ("build 1700000000 passed", "PHONE"),
    ("+5 points for the retry", "PHONE"),
    ("card 4111 1111 1111 1112 was declined", "CARD"),
    ("order 1234567890123456 shipped", "CARD"),
    ("iban DE89 3704 0044 0532 0130 01", "IBAN"),
    ("iban GB00WEST12345698765432", "IBAN"),
    ("ssn 000-12-3456", "NATIONAL_ID"),
    ("ssn 666-12-3456", "NATIONAL_ID"),
    ("ssn 900-12-3456", "NATIONAL_ID"),
    ("ssn 123-00-4567", "NATIONAL_ID"),
    ("nino GB 12 34 56 C", "NATIONAL_ID"),
    ("upgrade to version 1.2.3.4000", "IP_ADDRESS"),
    ("host 192.168.1.256 is unreachable", "IP_ADDRESS"),
    ("the job ran 12:30:45 with std::vector", "IP_ADDRESS"),
    ("the token: expired yesterday", "SECRET"),
    ("keys look like sk-short or AKIA123", "SECRET"),
    ("send a Bearer token header", "SECRET"),
    ("password=${DB_PASSWORD} from the env", "SECRET"),
]


@pytest.mark.parametrize(("value", "kind"), POSITIVES)
def test_each_kind_is_redacted(value: str, kind: str) -> None:
    """A value of each kind is replaced by its typed placeholder and reported."""
    redacted, kinds = redact_pii(f"note {value} done")
    assert redacted == f"note [{kind}] done"
    assert kinds == [kind]


@pytest.mark.parametrize(("text", "kind"), NEGATIVES)
def test_near_misses_are_kept(text: str, kind: str) -> None:
    """Values failing the checksum or shape of a kind, and ordinary numbers, are not redacted."""
    assert all(finding.kind != kind for finding in find_pii(text))
    assert redact_pii(text) == (text, [])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2. next", "password=[SECRET]. next"),
        ("DB_PASSWORD=s3cr3t", "DB_PASSWORD=[SECRET]"),
        ("api_key: abc123", "api_key: [SECRET]"),
        ("secret='open sesame'", "secret='[SECRET]'"),
        ('{"token": "abcdef"}', '{"token": "[SECRET]"}'),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "AWS_SECRET_ACCESS_KEY=[SECRET]"),
        ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456", "Authorization: Bearer [SECRET]"),
    ],
)
def test_secret_assignments_keep_the_key_name(text: str, expected: str) -> None:
    """For `key=value` secrets only the value is redacted, so the memory still says which secret."""
    assert redact_pii(text) == (expected, ["SECRET"])


def test_secrets_take_precedence_over_other_kinds() -> None:
    """A secret value that also looks like an e-mail is redacted as a secret."""
    assert redact_pii("password=alice@example.com") == ("password=[SECRET]", ["SECRET"])


def test_mixed_text_keeps_the_words() -> None:
    """Only the PII spans change; the lesson around them survives."""
    text = "Alice (alice@example.com, +44 20 7946 0958) paid with 4111 1111 1111 1111 from 10.0.0.12."
    redacted, kinds = redact_pii(text)
    assert redacted == "Alice ([EMAIL], [PHONE]) paid with [CARD] from [IP_ADDRESS]."
    assert kinds == ["CARD", "EMAIL", "IP_ADDRESS", "PHONE"]


def test_kinds_are_sorted_and_distinct() -> None:
    """Each kind is reported once, in sorted order, and only from the known kinds."""
    _, kinds = redact_pii("b@example.com then a@example.com, call (415) 555-0132 or 10.0.0.1")
    assert kinds == ["EMAIL", "IP_ADDRESS", "PHONE"]
    assert set(kinds) <= set(PII_KINDS)


def test_findings_are_ordered_and_disjoint() -> None:
    """find_pii returns non-overlapping spans in text order."""
    findings = find_pii("mail a@example.com; key sk_live_abcdefghijklmnop1234; ip ::1 and 10.0.0.1")
    assert [f.kind for f in findings] == ["EMAIL", "SECRET", "IP_ADDRESS", "IP_ADDRESS"]
    assert all(left.end <= right.start for left, right in itertools.pairwise(findings))


def test_redaction_is_stable() -> None:
    """Redacting an already redacted text finds nothing new."""
    once, _ = redact_pii("password=hunter2 mail a@example.com")
    assert redact_pii(once) == (once, [])


_WORDS = ["deploy", "retry", "the", "customer", "prefers", "invoice", "failed", "with", "on"]


@given(st.lists(st.tuples(st.sampled_from(_WORDS), st.sampled_from(POSITIVES)), min_size=1, max_size=6))
def test_redacted_text_contains_no_pii_value(pairs: list[tuple[str, tuple[str, str]]]) -> None:
    """Whatever words surround them, no PII value survives redaction."""
    text = " ".join(f"{word} {value}" for word, (value, _) in pairs) + " end"
    redacted, kinds = redact_pii(text)
    for _, (value, kind) in pairs:
        assert value not in redacted
        assert kind in kinds
