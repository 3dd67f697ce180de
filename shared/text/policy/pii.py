"""PII and secret detection with typed placeholders (SPEC 4.3, ``pii_handling``).

Detectors err towards precision on numbers: a memory full of ``[PHONE]`` where there were build
durations and versions is useless, so numeric kinds carry a checksum (Luhn, mod-97, the national
schemes) or a shape that ordinary numbers do not have. Secrets are the opposite: a leaked key costs
more than a lost word, so they win every overlap.

Finding a value is ours (a regular expression narrows the text to candidates of the right shape);
deciding whether a candidate is a real value is left to maintained libraries where they exist:

- ``python-stdnum`` validates IBANs (per-country length and layout, mod-97) and national ids
  (check digits, birth dates, reserved ranges: US SSN/ITIN, ES DNI/NIE, IT codice fiscale,
  FR NIR, FI HETU, BE national number, BR CPF, CN resident id, and — only next to a word that
  names them, because they are bare digit runs — NL BSN, DE tax id, PL PESEL, NO/SE/DK personal
  numbers, UK NHS number, CA SIN, IN Aadhaar); card numbers use its Luhn.
- ``phonenumbers`` (Google's libphonenumber metadata) decides whether a ``+…``/``00…`` number is
  possible for its country code, and whether a national ``0…`` number is valid in one of
  :data:`PHONE_REGIONS`.

The UK National Insurance number has no check digit: its published prefix rules are the test.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import phonenumbers
from stdnum import iban as std_iban
from stdnum import luhn
from stdnum.be import nn as be_nn
from stdnum.br import cpf as br_cpf
from stdnum.ca import sin as ca_sin
from stdnum.cn import ric as cn_ric
from stdnum.de import idnr as de_idnr
from stdnum.dk import cpr as dk_cpr
from stdnum.es import dni as es_dni
from stdnum.es import nie as es_nie
from stdnum.fi import hetu as fi_hetu
from stdnum.fr import nir as fr_nir
from stdnum.gb import nhs as gb_nhs
from stdnum.in_ import aadhaar as in_aadhaar
from stdnum.it import codicefiscale as it_codicefiscale
from stdnum.nl import bsn as nl_bsn
from stdnum.no import fodselsnummer as no_fodselsnummer
from stdnum.pl import pesel as pl_pesel
from stdnum.se import personnummer as se_personnummer
from stdnum.us import itin as us_itin
from stdnum.us import ssn as us_ssn

__all__ = ["PHONE_REGIONS", "PII_KINDS", "PiiFinding", "clip_outside_pii", "find_pii", "redact_pii"]

PII_KINDS = ("CARD", "EMAIL", "IBAN", "IP_ADDRESS", "NATIONAL_ID", "PHONE", "SECRET")


@dataclass(frozen=True)
class PiiFinding:
    """One span of ``text[start:end]`` to be replaced by ``[kind]``."""

    kind: str
    start: int
    end: int


# -- secrets ----------------------------------------------------------------------------------

# Self-identifying tokens: their prefixes make false positives unlikely, so no context is needed.
_SECRET_TOKENS = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|.*\Z)"
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"
    r"|\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}\b"
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}"
    r"|\bgl(?:pat|dt|ptt|rt|cbt|oas|soat)-[A-Za-z0-9_-]{20,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bxapp-\d-[A-Za-z0-9-]{10,}"
    r"|\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\bwhsec_[A-Za-z0-9+/=]{24,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\bya29\.[0-9A-Za-z_-]{20,}"
    r"|\bGOCSPX-[A-Za-z0-9_-]{20,}"
    r"|\bnpm_[A-Za-z0-9]{36}\b"
    r"|\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{40,}"
    r"|\bhf_[A-Za-z0-9]{30,}\b"
    r"|\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{30,}"
    r"|\bSK[0-9a-f]{32}\b"
    r"|\bdop_v1_[0-9a-f]{64}\b"
    r"|\bshp(?:at|ca|pa|ss)_[0-9a-fA-F]{32}\b"
    r"|https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{20,}"
    r"|https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
    re.DOTALL,
)
_BEARER = re.compile(r"\b[Bb]earer\s+(?P<value>[A-Za-z0-9\-._~+/]{16,}=*)")
# "Basic dXNlcjpwYXNz": only when the value really decodes to "user:password" (see _basic_auth).
_BASIC = re.compile(r"\b[Bb]asic\s+(?P<value>[A-Za-z0-9+/]{8,}={0,2})(?![\w+/=])")
# scheme://user:password@host — the password of a connection string or URL.
_URL_CREDENTIALS = re.compile(
    r"\b[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s:/?#@\"'<>]+:(?P<value>[^\s/?#@\"'<>]+)@"
)
# Signed URLs (Azure SAS, S3 presigned) carry the signature in the query string.
_URL_SIGNATURE = re.compile(r"[?&](?:sig|X-Amz-Signature|X-Goog-Signature)=(?P<value>[A-Za-z0-9%+/=_-]{16,})")
# `password=…` style: only the value is redacted, so the memory still says *which* secret it was.
_ASSIGNMENT = re.compile(
    r"(?i)(?<![a-z0-9])"  # "DB_PASSWORD" counts; a prefix group here would backtrack quadratically
    r"(?:password|passwd|passphrase|secret|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key"
    r"|client[_-]?secret|app[_-]?secret|account[_-]?key|signing[_-]?key|encryption[_-]?key"
    r"|master[_-]?key|shared[_-]?access[_-]?key|webhook[_-]?secret"
    r"|token|access[_-]?token|auth[_-]?token|refresh[_-]?token|session[_-]?token|id[_-]?token"
    r"|bot[_-]?token)"
    r"[\"']?\s*(?P<sep>[:=])\s*"
    r"(?:(?P<q>[\"'])(?P<qvalue>[^\"'\n]{3,}?)(?P=q)|(?P<value>(?!bearer\b)[^\s\"',;]{3,}))"
)
_PLACEHOLDER_VALUE = re.compile(r"\[[A-Z_]+\]|<[^>]*>?|\$\{?\w+\}?|\*+|x+|\.\.\.|…", re.IGNORECASE)

# -- contact details, addresses -----------------------------------------------------------------

_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b")
# International numbers need the "+" (or the "00" dialled instead of it); bare digit runs are more
# often ids, timestamps or counters. The groups end at a number's last digit: where a following
# number was swallowed, shorter prefixes are tried (_possible_international).
_PHONE_INTL = re.compile(
    r"(?<![\w+])(?:\+|(?<!\d[ .-])00(?=[1-9]))\d{1,3}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){2,7}(?!\d)"
)
# NANP needs separators for the same reason (a bare 10-digit run is usually an epoch timestamp).
_PHONE_NANP = re.compile(r"(?<![\w+])(?:\+?1[ .-]?)?(?:\([2-9]\d\d\) ?|[2-9]\d\d[ .-])\d{3}[ .-]\d{4}(?!\w)")
# A national number with its trunk "0" ("020 7946 0958", "(030) 1234567", "06 12 34 56 78"),
# printed in groups; libphonenumber must find it valid in one of PHONE_REGIONS.
_PHONE_NATIONAL = re.compile(
    r"(?<![\w+.,:/-])(?<!\d[ .-])(?:\(0\d{1,4}\)|0\d{1,4})(?:(?:[ -]|/ ?)\d{2,8}){1,4}(?![\w:/-]|[.,]\d)"
)
# An unformatted run of digits ("07911123456", "4155550132") is a phone number only when a word
# before it says so ("phone: …", "call …") and libphonenumber finds it valid.
_PHONE_COMPACT = re.compile(r"(?<![\w+.,:/-])(?<!\d[ .-])\d{9,12}(?![\w:/-]|[.,]\d)")
_PHONE_CONTEXT = re.compile(
    r"(?i)\b(?:phone|tel|telephone|mobile|cell|cellphone|call|ring|sms|text|whatsapp|signal|fax"
    r"|telefon|handy|portable|t[ée]l[ée]phone|m[óo]vil|cellulare)\b[^\w\n]{0,12}(?:\w+[^\w\n]{1,3}){0,2}$"
)
#: Regions whose national (trunk "0") numbers are recognized without a "+": where people write
#: numbers that way. NANP numbers have their own rule; regions without a trunk prefix need "+".
PHONE_REGIONS = (
    "GB", "IE", "FR", "DE", "AT", "CH", "NL", "BE", "IT", "SE", "FI",
    "AU", "NZ", "IN", "JP", "KR", "ZA", "TR", "IL", "CN",
)  # fmt: skip
# "01 02 2024", "15-01-2024": dates are never phone numbers, whatever a numbering plan admits.
_DATE_LIKE = re.compile(r"\(?\d{1,2}\)?[ ./-]\d{1,2}[ ./-](?:19|20)\d\d")
_MIN_NATIONAL_DIGITS = 10

# Card numbers start with 2-6 (the issuers people carry) and are either one digit run or printed in
# the issuers' groupings (4-4-4-4[-3], 4-6-5, 4-6-4) with one consistent separator; arbitrary runs of
# numbers pass Luhn one time in ten, so the shape has to narrow it first (and a card never continues
# a preceding group of digits).
_CARD_COMPACT = re.compile(r"(?<![\w.-])(?<!\d[ -])[2-6]\d{12,18}(?![\w-])")
_CARD_GROUPED = re.compile(
    r"(?<![\w.-])(?<!\d[ -])[2-6]\d{3}(?P<sep>[ -])"
    r"(?:\d{6}(?P=sep)\d{4,5}|\d{4}(?P=sep)\d{4}(?P=sep)\d{1,4}(?P<tail>(?P=sep)\d{1,3})?)(?!\d)"
)
# Unambiguous (space-separated chunks) so a failing run cannot backtrack exponentially.
_IBAN_RUN = re.compile(r"\b[A-Z]{2}\d{2}[A-Z0-9]*(?: [A-Z0-9]+)*\b")
_IBAN_START = re.compile(r"[A-Z]{2}\d{2}")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# Not preceded by a word char or dot and not followed by another ".digit": keeps v1.2.3.4 and
# 1.2.3.4000 (versions) out.
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:.])[0-9A-Fa-f.]*(?::[0-9A-Fa-f.]*){2,}")

# -- national ids ---------------------------------------------------------------------------------

_NINO = re.compile(
    r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
)


def _any_of(*validators: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda value: any(valid(value) for valid in validators)


def _always(_: str) -> bool:
    return True


# (shape, validator): shapes distinctive enough, with their check digit, to need no context.
_NATIONAL_IDS: tuple[tuple[re.Pattern[str], Callable[[str], bool]], ...] = (
    # US SSN (area 000/666/9xx, group 00, serial 0000 and published misuse refused) or ITIN.
    (re.compile(r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])"), _any_of(us_ssn.is_valid, us_itin.is_valid)),
    (_NINO, _always),
    (re.compile(r"(?<![\w-])\d{8}-?[A-Z](?![\w-])"), es_dni.is_valid),
    (re.compile(r"(?<![\w-])[XYZ]-?\d{7}-?[A-Z](?![\w-])"), es_nie.is_valid),
    (
        re.compile(r"\b[A-Z]{6}[\dLMNPQRSTUV]{2}[A-EHLMPRST][\dLMNPQRSTUV]{2}[A-Z][\dLMNPQRSTUV]{3}[A-Z]\b"),
        it_codicefiscale.is_valid,
    ),
    (
        re.compile(r"(?<![\w-])[12] ?\d{2} ?\d{2} ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2}(?![\w-])"),
        fr_nir.is_valid,
    ),
    # A HETU whose check character is a digit reads like a dated build tag: those need context.
    (re.compile(r"(?<![\w-])\d{6}[-+A-FU-Y]\d{3}[A-Y](?![\w-])"), fi_hetu.is_valid),
    (re.compile(r"(?<![\w.-])\d{2}\.\d{2}\.\d{2}-\d{3}\.\d{2}(?![\w-]|\.\d)"), be_nn.is_valid),
    (re.compile(r"(?<![\w.-])\d{3}\.\d{3}\.\d{3}-\d{2}(?![\w-]|\.\d)"), br_cpf.is_valid),
    (re.compile(r"(?<![\w-])\d{17}[\dXx](?![\w-])"), cn_ric.is_valid),
)
# Ids that are bare digit runs: a checksum passes one run in ten or eleven, so the word naming the
# id must come shortly before the value ("BSN 111222333", "PESEL: 44051401359").
_CONTEXTUAL_IDS: tuple[tuple[re.Pattern[str], Callable[[str], bool]], ...] = tuple(
    (re.compile(rf"(?i)\b(?:{words})\b[^\w\n]{{0,12}}(?:\w+[^\w\n]{{1,3}}){{0,2}}$"), valid)
    for words, valid in (
        (r"ssn|social\s+security(?:\s+number)?|itin", _any_of(us_ssn.is_valid, us_itin.is_valid)),
        (r"bsn|burgerservicenummer|sofinummer", nl_bsn.is_valid),
        (r"steuer-?id|steuer-?idnr|idnr|identifikationsnummer|tin", de_idnr.is_valid),
        (r"pesel", pl_pesel.is_valid),
        (r"f[øo]dselsnummer|fnr", no_fodselsnummer.is_valid),
        (r"personnummer|personnr|pnr", se_personnummer.is_valid),
        (r"cpr(?:-?nummer|-?nr)?", dk_cpr.is_valid),
        (r"nhs", gb_nhs.is_valid),
        (r"sin|social\s+insurance(?:\s+number)?", ca_sin.is_valid),
        (r"aadhaar|aadhar|uidai|uid", in_aadhaar.is_valid),
        (r"cpf", br_cpf.is_valid),
        (r"nir|insee|s[ée]curit[ée]\s+sociale", fr_nir.is_valid),
        (r"hetu|henkil[öo]tunnus|sotu", fi_hetu.is_valid),
    )
)
_DIGIT_GROUPS = re.compile(r"(?<![\w.+-])\d+(?:[ .-]\d+){0,5}(?![\w]|[.-]\d)")
_CONTEXT_CHARS = 40


# -- the detectors ----------------------------------------------------------------------------------


def _secrets(text: str) -> Iterator[PiiFinding]:
    for match in _SECRET_TOKENS.finditer(text):
        yield PiiFinding("SECRET", match.start(), match.end())
    for match in _BEARER.finditer(text):
        yield PiiFinding("SECRET", match.start("value"), match.end("value"))
    for match in _BASIC.finditer(text):
        if _basic_auth(match.group("value")):
            yield PiiFinding("SECRET", match.start("value"), match.end("value"))
    for pattern in (_URL_CREDENTIALS, _URL_SIGNATURE):
        for match in pattern.finditer(text):
            if not _PLACEHOLDER_VALUE.fullmatch(match.group("value")):
                yield PiiFinding("SECRET", match.start("value"), match.end("value"))
    for match in _ASSIGNMENT.finditer(text):
        group = "qvalue" if match.group("qvalue") is not None else "value"
        value = match.group(group).rstrip(".)")
        if len(value) < 3 or _PLACEHOLDER_VALUE.fullmatch(value):
            continue
        # After ":" prose is common ("token: expired"), so an unquoted value must look random.
        if match.group("sep") == ":" and group == "value" and not _looks_random(value):
            continue
        yield PiiFinding("SECRET", match.start(group), match.start(group) + len(value))


def _looks_random(value: str) -> bool:
    return len(value) >= 16 or any(not char.isalpha() for char in value)


def _basic_auth(value: str) -> bool:
    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, colon, password = decoded.partition(":")
    return bool(colon and user and password and decoded.isprintable())


def _cards(text: str) -> Iterator[PiiFinding]:
    for pattern in (_CARD_COMPACT, _CARD_GROUPED):
        for match in pattern.finditer(text):
            # The optional 5th group may be a neighbouring number ("… 1111 2 times"); retry without it.
            ends = [match.end()] + ([match.start("tail")] if match.groupdict().get("tail") else [])
            for end in ends:
                digits = re.sub(r"\D", "", text[match.start() : end])
                if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
                    yield PiiFinding("CARD", match.start(), end)
                    break


def _ibans(text: str) -> Iterator[PiiFinding]:
    for run in _IBAN_RUN.finditer(text):
        # The run may hold a failed candidate, a following word or a second IBAN, so every chunk that
        # can start an IBAN is tried with the longest tail whose checksum passes.
        chunks = [(m.start() + run.start(), m.end() + run.start()) for m in re.finditer(r"\S+", run.group())]
        first = 0
        while first < len(chunks):
            found = -1
            if _IBAN_START.match(text, chunks[first][0]):
                compact = ""
                for last in range(first, len(chunks)):
                    compact += text[chunks[last][0] : chunks[last][1]]
                    if len(compact) > 34:
                        break
                    if len(compact) >= 15 and std_iban.is_valid(compact):
                        found = last
            if found >= 0:
                yield PiiFinding("IBAN", chunks[first][0], chunks[found][1])
            first = max(found, first) + 1


def _group_ends(text: str, start: int, end: int) -> list[int]:
    """Where a candidate could end, longest first: its end, then before each separator."""
    ends = [end]
    for position in range(end - 1, start, -1):
        if not text[position].isdigit() and text[position - 1].isdigit():
            ends.append(position)
    return ends


def _digits(value: str) -> str:
    return "".join(char for char in value if char.isdigit())


def _possible_international(number: str) -> bool:
    plus = "+" + number[2:] if number.startswith("00") else number
    try:
        return phonenumbers.is_possible_number(phonenumbers.parse(plus, None))
    except phonenumbers.NumberParseException:
        return False


def _valid_national(number: str, regions: tuple[str, ...] = PHONE_REGIONS) -> bool:
    for region in regions:
        try:
            if phonenumbers.is_valid_number(phonenumbers.parse(number, region)):
                return True
        except phonenumbers.NumberParseException:
            continue
    return False


def _phones(text: str) -> Iterator[PiiFinding]:
    for match in _PHONE_INTL.finditer(text):
        for end in _group_ends(text, match.start(), match.end()):
            number = text[match.start() : end]
            if 8 <= len(_digits(number)) <= 15 and _possible_international(number):
                yield PiiFinding("PHONE", match.start(), end)
                break
    for match in _PHONE_NANP.finditer(text):
        if 10 <= len(_digits(match.group())) <= 11:
            yield PiiFinding("PHONE", match.start(), match.end())
    for match in _PHONE_NATIONAL.finditer(text):
        for end in _group_ends(text, match.start(), match.end()):
            number = text[match.start() : end]
            if len(_digits(number)) < _MIN_NATIONAL_DIGITS or _DATE_LIKE.fullmatch(number):
                continue
            if len(_digits(number)) <= 13 and _valid_national(number):
                yield PiiFinding("PHONE", match.start(), end)
                break
    for match in _PHONE_COMPACT.finditer(text):
        if not _PHONE_CONTEXT.search(text, max(0, match.start() - _CONTEXT_CHARS), match.start()):
            continue
        number = match.group()
        if _valid_national(number, (*PHONE_REGIONS, "US", "CA")):
            yield PiiFinding("PHONE", match.start(), match.end())


def _ipv6(text: str) -> Iterator[PiiFinding]:
    for match in _IPV6_CANDIDATE.finditer(text):
        token = match.group()
        for candidate in (token, token.rstrip("."), token.rstrip(".:")):
            if candidate.strip(":") and _is_ipv6(candidate):
                yield PiiFinding("IP_ADDRESS", match.start(), match.start() + len(candidate))
                break


def _is_ipv6(token: str) -> bool:
    try:
        ipaddress.IPv6Address(token)
    except ValueError:
        return False
    return True


def _national_ids(text: str) -> Iterator[PiiFinding]:
    for pattern, valid in _NATIONAL_IDS:
        for match in pattern.finditer(text):
            if valid(match.group()):
                yield PiiFinding("NATIONAL_ID", match.start(), match.end())
    for match in _DIGIT_GROUPS.finditer(text):
        if len(_digits(match.group())) < 8:
            continue
        before = max(0, match.start() - _CONTEXT_CHARS)
        named = [valid for context, valid in _CONTEXTUAL_IDS if context.search(text, before, match.start())]
        if not named:
            continue
        for end in _group_ends(text, match.start(), match.end()):
            value = text[match.start() : end]
            # Validators differ in the separators they accept; the digits alone are tried too.
            if any(valid(value) or valid(_digits(value)) for valid in named):
                yield PiiFinding("NATIONAL_ID", match.start(), end)
                break


def _others(text: str) -> Iterator[PiiFinding]:
    for match in _EMAIL.finditer(text):
        yield PiiFinding("EMAIL", match.start(), match.end())
    for match in _IPV4.finditer(text):
        yield PiiFinding("IP_ADDRESS", match.start(), match.end())
    # National ids before phones: an NHS number named as such is printed like a NANP phone number.
    yield from _national_ids(text)
    yield from _cards(text)
    yield from _ibans(text)
    yield from _phones(text)
    yield from _ipv6(text)


def find_pii(text: str) -> list[PiiFinding]:
    """Non-overlapping findings in text order; secrets first, then leftmost-longest among the rest."""
    chosen: list[PiiFinding] = []
    for tier in (list(_secrets(text)), list(_others(text))):
        for finding in sorted(tier, key=lambda f: (f.start, f.start - f.end)):
            if all(finding.end <= kept.start or finding.start >= kept.end for kept in chosen):
                chosen.append(finding)
    return sorted(chosen, key=lambda f: f.start)


def redact_pii(text: str) -> tuple[str, list[str]]:
    """Replace every finding with ``[KIND]``; return the new text and the sorted distinct kinds."""
    findings = find_pii(text)
    parts: list[str] = []
    position = 0
    for finding in findings:
        parts.append(text[position : finding.start])
        parts.append(f"[{finding.kind}]")
        position = finding.end
    parts.append(text[position:])
    return "".join(parts), sorted({finding.kind for finding in findings})


#: How far past a cut :func:`clip_outside_pii` looks: further than any value with a bounded shape
#: reaches (an IBAN, a card, a phone number, an e-mail address of at most 254 characters); a key or
#: token longer than this is still found from its start, so the cut still moves before it.
_CLIP_REACH = 512


def clip_outside_pii(text: str, limit: int, ellipsis: str = "…") -> str:
    """``text`` shortened to at most ``limit`` characters (ellipsis included) without cutting
    through a PII value: a value cut in half is no longer recognised (``4111 1111 1111 1111``
    becomes ``4111 111…``) and would survive redaction, so the cut moves before it."""
    if len(text) <= limit:
        return text
    cut = max(limit - len(ellipsis), 0)
    # Only a value that starts before the cut can be cut through: the rest of a long tool output
    # is not scanned (it is what makes clipping cheap on a 20,000-character output).
    for finding in find_pii(text[: cut + _CLIP_REACH]):
        if finding.start < cut < finding.end:
            cut = finding.start
            break
    return text[:cut] + ellipsis
