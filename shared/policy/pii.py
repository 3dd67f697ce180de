"""PII and secret detection with typed placeholders (SPEC 4.3, ``pii_handling``).

Detectors err towards precision on numbers: a memory full of ``[PHONE]`` where there were build
durations and versions is useless, so numeric kinds carry a checksum (Luhn, mod-97) or a shape that
ordinary numbers do not have. Secrets are the opposite: a leaked key costs more than a lost word,
so they win every overlap.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["PII_KINDS", "PiiFinding", "find_pii", "redact_pii"]

PII_KINDS = ("CARD", "EMAIL", "IBAN", "IP_ADDRESS", "NATIONAL_ID", "PHONE", "SECRET")


@dataclass(frozen=True)
class PiiFinding:
    """One span of ``text[start:end]`` to be replaced by ``[kind]``."""

    kind: str
    start: int
    end: int


# Self-identifying tokens: their prefixes make false positives unlikely, so no context is needed.
_SECRET_TOKENS = re.compile(
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|.*\Z)"
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"
    r"|\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}\b"
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
    re.DOTALL,
)
_BEARER = re.compile(r"\b[Bb]earer\s+(?P<value>[A-Za-z0-9\-._~+/]{16,}=*)")
# `password=…` style: only the value is redacted, so the memory still says *which* secret it was.
_ASSIGNMENT = re.compile(
    r"(?i)(?<![a-z0-9])"  # "DB_PASSWORD" counts; a prefix group here would backtrack quadratically
    r"(?:password|passwd|passphrase|secret|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key"
    r"|token|access[_-]?token|auth[_-]?token|refresh[_-]?token)"
    r"[\"']?\s*(?P<sep>[:=])\s*"
    r"(?:(?P<q>[\"'])(?P<qvalue>[^\"'\n]{3,}?)(?P=q)|(?P<value>(?!bearer\b)[^\s\"',;]{3,}))"
)
_PLACEHOLDER_VALUE = re.compile(r"\[[A-Z_]+\]|<[^>]*>?|\$\{?\w+\}?|\*+|x+", re.IGNORECASE)

_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b")
# International numbers need the "+"; bare digit runs are more often ids, timestamps or counters.
_PHONE_INTL = re.compile(r"(?<![\w+])\+\d{1,3}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){2,7}(?!\d)")
# NANP needs separators for the same reason (a bare 10-digit run is usually an epoch timestamp).
_PHONE_NANP = re.compile(r"(?<![\w+])(?:\+?1[ .-]?)?(?:\([2-9]\d\d\) ?|[2-9]\d\d[ .-])\d{3}[ .-]\d{4}(?!\w)")
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
_SSN = re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])")
_NINO = re.compile(
    r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# Not preceded by a word char or dot and not followed by another ".digit": keeps v1.2.3.4 and
# 1.2.3.4000 (versions) out.
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:.])[0-9A-Fa-f.]*(?::[0-9A-Fa-f.]*){2,}")


_SIMPLE = (("EMAIL", _EMAIL), ("NATIONAL_ID", _SSN), ("NATIONAL_ID", _NINO), ("IP_ADDRESS", _IPV4))


def _luhn_ok(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _iban_ok(compact: str) -> bool:
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


def _secrets(text: str) -> Iterator[PiiFinding]:
    for match in _SECRET_TOKENS.finditer(text):
        yield PiiFinding("SECRET", match.start(), match.end())
    for match in _BEARER.finditer(text):
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


def _cards(text: str) -> Iterator[PiiFinding]:
    for pattern in (_CARD_COMPACT, _CARD_GROUPED):
        for match in pattern.finditer(text):
            # The optional 5th group may be a neighbouring number ("… 1111 2 times"); retry without it.
            ends = [match.end()] + ([match.start("tail")] if match.groupdict().get("tail") else [])
            for end in ends:
                digits = re.sub(r"\D", "", text[match.start() : end])
                if 13 <= len(digits) <= 19 and _luhn_ok(digits):
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
                    if _iban_ok(compact):
                        found = last
            if found >= 0:
                yield PiiFinding("IBAN", chunks[first][0], chunks[found][1])
            first = max(found, first) + 1


def _phones(text: str) -> Iterator[PiiFinding]:
    for pattern in (_PHONE_INTL, _PHONE_NANP):
        for match in pattern.finditer(text):
            if 8 <= sum(char.isdigit() for char in match.group()) <= 15:
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


def _others(text: str) -> Iterator[PiiFinding]:
    for kind, pattern in _SIMPLE:
        for match in pattern.finditer(text):
            yield PiiFinding(kind, match.start(), match.end())
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
