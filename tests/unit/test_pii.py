"""PII and secret detection and redaction (SPEC 4.3, pii_handling).

Every kind has positives (redacted wherever they stand between words) and near misses that must be
kept: a value failing its checksum or shape, and ordinary numbers of the same look (versions,
durations, dates, order numbers, big amounts). Ids that are bare digit runs are only redacted when
the word naming them comes first (``CONTEXTUAL``).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.text.policy import PII_KINDS, find_pii, redact_pii

PGP_KEY = "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----"
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nq3Zk9+abc=\n-----END RSA PRIVATE KEY-----"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"

# (value as it appears in text, kind): every value is redacted wherever it appears between words.
POSITIVES = [
    ("jane.doe+billing@example.co.uk", "EMAIL"),
    ("user_name-1@mail.example.org", "EMAIL"),
    ("ALICE@EXAMPLE.COM", "EMAIL"),
    ("+44 20 7946 0958", "PHONE"),
    ("(415) 555-0132", "PHONE"),
    ("1-800-555-0199", "PHONE"),
    ("+4915112345678", "PHONE"),
    ("+44 (0)20 7946 0958", "PHONE"),
    ("+33 6 12 34 56 78", "PHONE"),
    ("0044 20 7946 0958", "PHONE"),
    ("415.555.0132", "PHONE"),
    # National numbers with their trunk "0", valid in one of PHONE_REGIONS (libphonenumber).
    ("020 7946 0958", "PHONE"),
    ("(030) 1234567", "PHONE"),
    ("0151 12345678", "PHONE"),
    ("06 12 34 56 78", "PHONE"),
    ("0412 345 678", "PHONE"),
    ("4111 1111 1111 1111", "CARD"),
    ("4111-1111-1111-1111", "CARD"),
    ("3782 822463 10005", "CARD"),
    ("5500000000000004", "CARD"),
    ("DE89 3704 0044 0532 0130 00", "IBAN"),
    ("GB82WEST12345698765432", "IBAN"),
    ("FR14 2004 1010 0505 0001 3M02 606", "IBAN"),
    ("NL91ABNA0417164300", "IBAN"),
    ("123-45-6789", "NATIONAL_ID"),  # US SSN
    ("912-70-1234", "NATIONAL_ID"),  # US ITIN
    ("AB 12 34 56 C", "NATIONAL_ID"),  # UK NINO
    ("AB123456C", "NATIONAL_ID"),
    ("12345678Z", "NATIONAL_ID"),  # ES DNI
    ("X1234567L", "NATIONAL_ID"),  # ES NIE
    ("RSSMRA85T10A562S", "NATIONAL_ID"),  # IT codice fiscale
    ("1 84 12 76 451 089 46", "NATIONAL_ID"),  # FR NIR
    ("184127645108946", "NATIONAL_ID"),
    ("131052-308T", "NATIONAL_ID"),  # FI HETU
    ("85.07.30-033.28", "NATIONAL_ID"),  # BE national number
    ("390.533.447-05", "NATIONAL_ID"),  # BR CPF
    ("11010519491231002X", "NATIONAL_ID"),  # CN resident id
    ("10.0.0.12", "IP_ADDRESS"),
    ("2001:db8::ff00:42:8329", "IP_ADDRESS"),
    ("fe80::1", "IP_ADDRESS"),
    ("192.168.1.254", "IP_ADDRESS"),
    ("::ffff:192.0.2.1", "IP_ADDRESS"),
    ("2001:0db8:85a3:0000:0000:8a2e:0370:7334", "IP_ADDRESS"),
    ("AKIAIOSFODNN7EXAMPLE", "SECRET"),
    ("sk-proj-Abc123def456ghi789jkl012mno345", "SECRET"),
    ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "SECRET"),
    ("glpat-abcdefghij0123456789", "SECRET"),
    ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "SECRET"),
    ("hf_abcdefghijklmnopqrstuvwxyz0123", "SECRET"),
    ("SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG", "SECRET"),
    ("ya29.a0AfH6SMBabcdefghijklmnop", "SECRET"),
    ("GOCSPX-abcdefghijklmnopqrstuvwx12", "SECRET"),
    ("whsec_abcdefghijklmnopqrstuvwxyz012345", "SECRET"),
    ("https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX", "SECRET"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "SECRET"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "SECRET"),
    ("xoxb-123456789012-abcdefghijkl", "SECRET"),
    ("sk_live_abcdefghijklmnop1234", "SECRET"),
    ("rk_live_abcdefghijklmnop1234", "SECRET"),
    ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "SECRET"),
    (JWT, "SECRET"),
    (PRIVATE_KEY, "SECRET"),
    (PGP_KEY, "SECRET"),
]

# (text, redacted): bare digit runs are ids or phone numbers only when the word before says so.
CONTEXTUAL = [
    ("ssn: 123456789", "ssn: [NATIONAL_ID]"),
    ("social security number 123 45 6789", "social security number [NATIONAL_ID]"),
    ("BSN 111222333", "BSN [NATIONAL_ID]"),
    ("Steuer-ID 36 574 261 809", "Steuer-ID [NATIONAL_ID]"),
    ("PESEL: 44051401359", "PESEL: [NATIONAL_ID]"),
    ("fødselsnummer 151086 95088", "fødselsnummer [NATIONAL_ID]"),
    ("personnummer 811218-9876", "personnummer [NATIONAL_ID]"),
    ("CPR 211062-5629", "CPR [NATIONAL_ID]"),
    ("NHS number 943 476 5919", "NHS number [NATIONAL_ID]"),
    ("SIN 130 692 544", "SIN [NATIONAL_ID]"),
    ("Aadhaar no. 2345 6789 0124", "Aadhaar no. [NATIONAL_ID]"),
    ("CPF 39053344705", "CPF [NATIONAL_ID]"),
    ("hetu 131052-3140", "hetu [NATIONAL_ID]"),
    ("phone: 07911123456", "phone: [PHONE]"),
    ("call 4155550132 after five", "call [PHONE] after five"),
    ("WhatsApp me on 0612345678", "WhatsApp me on [PHONE]"),
]

# (text, kind that must not be found): near misses of each kind.
NEGATIVES = [
    ("write to user at example dot com", "EMAIL"),
    ("mention @oncall or foo@bar in the channel", "EMAIL"),
    ("decorate with @pytest.fixture and mail root@localhost", "EMAIL"),
    ("the deploy took 1500 ms", "PHONE"),
    ("released on 2024-01-15 at 10:30:45", "PHONE"),
    ("build 1700000000 passed", "PHONE"),
    ("+5 points for the retry", "PHONE"),
    ("dates 01 02 2024 and 15-01-2024", "PHONE"),
    ("took 0 15 30 45 60 seconds", "PHONE"),
    ("order number 0123456789 shipped", "PHONE"),
    ("ticket 4155550132 closed", "PHONE"),
    ("between 0800 and 1700", "PHONE"),
    ("the 00 30 45 12 33 sequence", "PHONE"),
    ("version 0.12.3 ships", "PHONE"),
    ("zip 02134", "PHONE"),
    ("card 4111 1111 1111 1112 was declined", "CARD"),
    ("order 1234567890123456 shipped", "CARD"),
    ("epoch 1700000000123 ms", "CARD"),
    ("iban DE89 3704 0044 0532 0130 01", "IBAN"),
    ("iban GB00WEST12345698765432", "IBAN"),
    ("iban GB82WEST1234569876543", "IBAN"),  # mod-97 alone is not enough: the UK length is 22
    ("ticket AB12 done", "IBAN"),
    ("ssn 000-12-3456", "NATIONAL_ID"),
    ("ssn 666-12-3456", "NATIONAL_ID"),
    ("ssn 900-12-3456", "NATIONAL_ID"),
    ("ssn 123-00-4567", "NATIONAL_ID"),
    ("nino GB 12 34 56 C", "NATIONAL_ID"),
    ("ssn 078-05-1120", "NATIONAL_ID"),  # the Woolworth wallet card: published, never anyone's
    ("dni 12345678A", "NATIONAL_ID"),  # wrong check letter
    ("cf RSSMRA85T10A562T", "NATIONAL_ID"),
    ("nir 1 84 12 76 451 089 47", "NATIONAL_ID"),
    ("build 240115-1234", "NATIONAL_ID"),  # a valid HETU with a digit check, but no word "hetu"
    ("cpf 390.533.447-06", "NATIONAL_ID"),
    ("total 111222333 bytes", "NATIONAL_ID"),  # a valid BSN, but nothing says it is one
    ("bsn 111222334", "NATIONAL_ID"),
    ("french big number 123 456 789 euros", "NATIONAL_ID"),
    ("id 20240115T103000Z", "NATIONAL_ID"),
    ("isbn 978-3-16-148410-0", "NATIONAL_ID"),
    ("uuid 123e4567-e89b-12d3-a456-426614174000", "NATIONAL_ID"),
    ("upgrade to version 1.2.3.4000", "IP_ADDRESS"),
    ("host 192.168.1.256 is unreachable", "IP_ADDRESS"),
    ("the job ran 12:30:45 with std::vector", "IP_ADDRESS"),
    ("lat 52.5200 lon 13.4050", "IP_ADDRESS"),
    ("bump v1.2.3.4 today", "IP_ADDRESS"),
    ("the token: expired yesterday", "SECRET"),
    ("keys look like sk-short or AKIA123", "SECRET"),
    ("send a Bearer token header", "SECRET"),
    ("password=${DB_PASSWORD} from the env", "SECRET"),
    ("postgres://app:${DB_PASSWORD}@db/app", "SECRET"),
    ("Basic authentication is disabled", "SECRET"),
    ("https://example.com/path?sig=short", "SECRET"),
    ("sha 3f786850e387550fdab836ed7e6dc881de23001b", "SECRET"),
]


@pytest.mark.parametrize(("value", "kind"), POSITIVES)
def test_each_kind_is_redacted(value: str, kind: str) -> None:
    """A value of each kind is replaced by its typed placeholder and reported."""
    redacted, kinds = redact_pii(f"note {value} done")
    assert redacted == f"note [{kind}] done"
    assert kinds == [kind]


@pytest.mark.parametrize(("text", "expected"), CONTEXTUAL)
def test_bare_digit_ids_need_the_word_naming_them(text: str, expected: str) -> None:
    """A digit run is an id or a phone number when the word before names it, and then it is redacted."""
    redacted, kinds = redact_pii(text)
    assert redacted == expected
    assert len(kinds) == 1


def test_every_kind_has_positives_and_near_misses() -> None:
    """No kind goes untested in either direction."""
    assert {kind for _, kind in POSITIVES} == set(PII_KINDS)
    assert {kind for _, kind in NEGATIVES} == set(PII_KINDS)


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
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [SECRET]"),
        ('{"clientSecret": "abc123xyz"}', '{"clientSecret": "[SECRET]"}'),
        ("AccountKey=abcDEF123/+==;", "AccountKey=[SECRET];"),
        ("postgres://app:s3cr3tPass@db.internal:5432/app", "postgres://app:[SECRET]@db.internal:5432/app"),
        ("blob?sv=2020&sig=AbCdEf1234567890%2Babc%3D&se=1", "blob?sv=2020&sig=[SECRET]&se=1"),
    ],
)
def test_secret_assignments_keep_the_key_name(text: str, expected: str) -> None:
    """For `key=value` secrets only the value is redacted, so the memory still says which secret."""
    assert redact_pii(text) == (expected, ["SECRET"])


def test_secrets_take_precedence_over_other_kinds() -> None:
    """A secret value that also looks like an e-mail is redacted as a secret."""
    assert redact_pii("password=alice@example.com") == ("password=[SECRET]", ["SECRET"])


def test_a_following_number_is_not_swallowed_by_a_phone() -> None:
    """A "+" number ends where its country's numbering plan says, not at the next count."""
    assert redact_pii("call +44 20 7946 0958 2 times") == ("call [PHONE] 2 times", ["PHONE"])


def test_a_key_never_becomes_an_email_or_phone() -> None:
    """The password of a connection string is a secret even where it reads as an e-mail local part."""
    redacted, kinds = redact_pii("dsn mysql://root:hunter2pw@10.0.0.5:3306/app")
    assert redacted == "dsn mysql://root:[SECRET]@[IP_ADDRESS]:3306/app"
    assert kinds == ["IP_ADDRESS", "SECRET"]


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
