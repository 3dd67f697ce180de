"""Detection of attacker-shaped memory text (SPEC 4.3 quarantine, 5.4).

A memory is later pasted into a prompt, so text that talks *to the model* (overrides, fake turns, tool
calls, attempts to close the memory block) is flagged at write time. Flagging quarantines, it does not
deny, so the rules lean towards catching disguises; they are still phrase-shaped rather than keyword
lists, because ordinary lessons mention tools, systems and ignoring flaky tests all the time.

The rules run on what the text *reads as*, not only on its code points: invisible characters removed,
NFKC and a look-alike table applied (fullwidth, mathematical, Cyrillic, Greek, small capitals), HTML
entities, URL and backslash escapes undone, letters spelled out one by one joined, and text hidden in
base64 (also line-wrapped), hex, Unicode tag characters or variation selectors decoded and scanned.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
import unicodedata
from urllib.parse import unquote

__all__ = ["INJECTION_REASONS", "find_injection", "is_injection"]

INJECTION_REASONS = (
    "instruction_override",
    "role_tag",
    "tool_directive",
    "memory_block_escape",
    "encoded_payload",
    "hidden_characters",
)

_VERB = r"(?:ignore|disregard|forget|override|bypass|discard|abandon)"
_TARGET = (
    r"(?:instructions?|rules|prompts?|guidelines|directives|guardrails|restrictions|polic(?:y|ies)"
    r"|programming|constraints|context|messages|commands|orders)"
)
_QUALIFIER = (
    r"(?:previous|prior|above|earlier|preceding|foregoing|former|original|initial|system|your|safety)"
)
_ROLE = r"(?:system|assistant|developer)"

# Case-insensitive unless a rule says otherwise; "^" anchors at every line (a fake turn starts a line).
_PATTERNS: dict[str, tuple[str, ...]] = {
    "instruction_override": (
        # "ignore all previous instructions", "disregard your rules": a qualifier makes it an override,
        # so "ignore flaky test X" and "ignore the lint rules" stay ordinary lessons.
        rf"\b{_VERB}\s+(?:\w+\s+){{0,3}}?{_QUALIFIER}\s+(?:\w+\s+){{0,2}}?{_TARGET}\b",
        rf"\b{_VERB}\s+(?:all|any|every)(?:\s+of)?(?:\s+(?:the|your|my))?\s+{_TARGET}\b",
        rf"\b{_VERB}\s+(?:everything|all|anything)\s+(?:\w+\s+)?(?:above|before|so\s+far)\b",
        rf"\b{_VERB}\s+(?:all\s+(?:of\s+)?)?the\s+above\b",
        r"\bforget\s+(?:about\s+)?(?:everything|all\s+(?:of\s+)?(?:that|this|you|the\s+above))\b",
        r"\byou\s+are\s+now\b(?!\s+(?:logged|signed|connected|subscribed|registered|ready|done)\b)",
        r"\b(?:new|updated|revised|real)\s+(?:system\s+)?(?:instructions?|rules|directives|orders)\s*:",
        r"\bfrom\s+now\s+on,?\s+(?:you|the\s+assistant)\s+(?:will|must|shall|should|are)\b",
        r"\bpretend\s+(?:that\s+)?(?:you\s+are|to\s+be)\b|\b(?:developer|dan|god)\s+mode\b",
        r"\b(?:do\s+not|don't|never)\s+(?:tell|inform|alert|warn)\s+the\s+(?:user|human|operator)\b",
        r"\b(?:reveal|print|show|output|repeat|leak|disclose)\s+(?:me\s+)?(?:your|the)\s+"
        r"(?:(?:full|entire|hidden|original|initial|system)\s+)+(?:prompt|instructions)\b",
        rf"\b(?:stop|quit|cease)\s+(?:following|obeying|adhering\s+to)\s+(?:all\s+)?{_QUALIFIER}\s+"
        rf"(?:\w+\s+)?{_TARGET}\b",
        r"\byour\s+(?:new|real|true|actual|updated)\s+(?:task|goal|objective|mission|purpose|instructions?"
        r"|role)\s+(?:is|are|will\s+be)\b",
        r"\b(?:act|behave|respond)\s+as\s+(?:an?\s+)?(?:unrestricted|unfiltered|uncensored|jailbroken)\b",
        r"\b(?:unrestricted|unfiltered|uncensored|jailbroken)\s+(?:ai|assistant|llm|chatbot|mode)\b",
        r"\bdo\s+anything\s+now\b|\bjailbreak\s+mode\b",
    ),
    "role_tag": (
        rf"<\s*/?\s*(?:{_ROLE}|sys)(?:[\s_-]*(?:prompt|message|instructions?))?\s*>",
        rf"\[\s*/?\s*(?:{_ROLE}|sys|inst)\s*\]",
        r"<\|\s*[a-z_]+\s*\|>",
        rf"^[ \t>]*#{{1,6}}\s*(?:{_ROLE}|instruction|response)\s*(?:prompt\s*)?:",
        rf"^[ \t>]*{_ROLE}\s*:",
        r"\bsystem\s+(?:prompt|message|override)\s*:",
        # A chat turn forged as JSON with its words: {"role": "system", "content": "…"} (code that
        # builds such a message from a variable is an ordinary lesson).
        rf"\"role\"\s*:\s*\"(?:{_ROLE}|tool)\"\s*,\s*\"content\"\s*:\s*\"",
    ),
    "tool_directive": (
        r"\b(?:call|invoke|trigger|execute)\s+(?:the|this|that|a|your)\s+(?:tool|function)\b",
        r"\b(?:call|invoke)\s+(?:the\s+)?(?:tool|function)\s+[`\"']?[\w.-]+",
        r"\bexecute\s*[`\"']?\s*(?:rm\s+-|sudo\b|curl\b|wget\b|bash\b|sh\s+-c|powershell\b|chmod\b|dd\s)",
        r"\b(?:run|execute)\s+the\s+following\s+(?:shell\s+)?(?:command|code|script)s?\b",
        r"\brm\s+-(?:rf|fr)\s+(?:/|~|\*|\$HOME)(?=[\s\"'`]|$)",
        r"[{,]\s*\"(?:tool|tool_name|tool_calls?|tool_use|function|function_call)\"\s*:",
        r"\"function_call\"|</?\s*(?:tool_calls?|tool_use|function_calls?|invoke)\b",
        # An OpenAI-style call object, and a ReAct step ("Action: x" then "Action Input: {...}").
        r"\{\s*\"name\"\s*:\s*\"[\w.-]+\"\s*,\s*\"(?:arguments|parameters|input)\"\s*:",
        r"^[ \t]*action\s*:\s*[\w.-]+[ \t]*\n[ \t]*action[ \t]+input\s*:",
    ),
    "memory_block_escape": (
        # The rendered block is <engram-memory>…</engram-memory> (shared/text/memory_block.py).
        r"<\s*/\s*(?:[\w-]*[-_])?memor(?:y|ies)(?:[-_][\w-]+)?\s*>|<\s*/?\s*engram[\s_-]*memor(?:y|ies)",
        r"<<\s*/?\s*(?:END|BEGIN)[\s_-]*(?:OF[\s_-]*)?MEMOR(?:Y|IES)[\s_-]*>>",
        r"\[\s*/\s*memor(?:y|ies)\s*\]",
        rf"```[^\S\n]*\w*\s*(?:[<\[#|]+\s*)?(?:{_ROLE}|new\s+instructions)\b",
        # The block's own header and pack prefix, forged to start a second, fake block.
        r"recalled\s+memory\s+follows\s+between|#{1,6}[ \t]*recalled\s+memor(?:y|ies)\b",
        r"\bend\s+of\s+(?:the\s+)?(?:recalled|engram)\s+memor(?:y|ies)\b",
    ),
}
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    *(
        (reason, re.compile(pattern, re.IGNORECASE | re.MULTILINE))
        for reason, patterns in _PATTERNS.items()
        for pattern in patterns
    ),
    # Upper case only: "end of memory" in lower case is ordinary prose about buffers.
    ("memory_block_escape", re.compile(r"\bEND(?:\s+OF)?[\s_-]+(?:THE\s+)?MEMOR(?:Y|IES)\b")),
)

_ZERO_WIDTH = "\u200b\u2060\ufeff\u180e"
_BIDI = "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# Joiners, soft hyphens and variation selectors are legitimate in emoji and several scripts: they are
# removed before matching (they can split a keyword) but counted only alongside a real finding.
_BENIGN_INVISIBLE = "\u200c\u200d\u00ad" + "".join(chr(c) for c in range(0xFE00, 0xFE10))
# Variation selectors can also carry one byte each (FE00-FE0F: 0-15, E0100-E01EF: 16-255); a run
# of them after one character is a hidden payload ("emoji smuggling"), decoded and scanned too.
_VS_SUPPLEMENT = range(0xE0100, 0xE01F0)
_VS_RUN = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]{4,}")
_SUSPICIOUS_INVISIBLE = frozenset(_ZERO_WIDTH + _BIDI)
# Unicode tag characters mirror ASCII invisibly ("ASCII smuggling"); they are decoded and scanned too.
_TAG_BASE, _TAG_RANGE = 0xE0000, range(0xE0020, 0xE007F)
_STRIP: dict[int, None] = dict.fromkeys(
    [ord(char) for char in _ZERO_WIDTH + _BIDI + _BENIGN_INVISIBLE]
    + list(range(_TAG_BASE, 0xE0080))
    + list(_VS_SUPPLEMENT)
)
_MANY_HIDDEN = 3
# NFKC folds fullwidth and mathematical letters but not Cyrillic/Greek look-alikes, hence this table.
# Latin small capitals (ɪɢɴᴏʀᴇ) are letters NFKC leaves alone too.
_HOMOGLYPHS = str.maketrans(
    "аеорсухіјѕԁһӏԛԝАВЕКМНОРСТХІЈЅαοιενρκΑΒΕΖΗΙΚΜΝΟΡΤΥΧıϲոօսᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘǫʀꜱᴛᴜᴠᴡʏᴢ",
    "aeopcyxijsdhlqwABEKMHOPCTXIJSaoievpkABEZHIKMNOPTYXicnouabcdefghijklmnopqrstuvwyz",
)
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{24,}={0,2}")
# MIME and PEM wrap base64 at a fixed width: consecutive lines of nothing but base64 are one run.
_BASE64_BLOCK = re.compile(
    r"^[ \t]*[A-Za-z0-9+/]{8,}[ \t]*(?:\r?\n[ \t]*[A-Za-z0-9+/]{4,}={0,2}[ \t]*)+$", re.MULTILINE
)
_HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}){12,}(?![0-9A-Fa-f])")
_MAX_DEPTH = 2
# Escapes that a renderer, browser or JSON parser would turn back into the characters they hide:
# "&lt;/engram-memory&gt;", "%3C/engram-memory%3E", "\u003c/engram-memory\u003e".
_BACKSLASH_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|x([0-9A-Fa-f]{2}))")
# "i g n o r e", "s.y.s.t.e.m": letters spelled out one at a time.
_SPELLED_OUT = re.compile(r"\b[A-Za-z](?:[ ._*-][A-Za-z]\b){3,}")


def _prepare(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text.translate(_STRIP)).translate(_HOMOGLYPHS)
    # NFKC turns exotic spaces into " "; collapsing them keeps "ignore  previous" one phrase.
    return re.sub(r"[^\S\n]+", " ", folded)


def _views(prepared: str) -> list[str]:
    """The prepared text, and what it reads as once escapes are undone and spelled-out words joined."""
    escaped = _BACKSLASH_ESCAPE.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), prepared)
    unescaped = _prepare(html.unescape(unquote(escaped)))
    joined = _SPELLED_OUT.sub(lambda m: re.sub(r"[ ._*-]", "", m.group()), unescaped)
    views = [prepared]
    for view in (unescaped, joined):
        if view not in views:
            views.append(view)
    return views


def _rule_reasons(text: str) -> set[str]:
    return {reason for reason, pattern in _RULES if pattern.search(text)}


def _reads_as_text(plain: str) -> bool:
    # Identifiers and hashes decode to binary noise; only text that reads as text is worth scanning.
    printable = sum(char.isprintable() or char.isspace() for char in plain)
    return bool(plain) and printable / len(plain) >= 0.95


def _decoded_runs(text: str) -> list[str]:
    decoded: list[str] = []
    blocks = [re.sub(r"\s+", "", block.group()) for block in _BASE64_BLOCK.finditer(text)]
    for match in (m for source in (text, *blocks) for m in _BASE64_RUN.finditer(source)):
        run = match.group().rstrip("=").replace("-", "+").replace("_", "/")
        run = run[: len(run) - (len(run) % 4 == 1)]  # a dangling sextet cannot be decoded
        try:
            plain = base64.b64decode(run + "=" * (-len(run) % 4), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
        if _reads_as_text(plain):
            decoded.append(plain)
    for match in _HEX_RUN.finditer(text):
        try:
            plain = bytes.fromhex(match.group()).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if _reads_as_text(plain):
            decoded.append(plain)
    return decoded


def _smuggled_bytes(text: str) -> str:
    """Text hidden one byte per variation selector in runs of them (empty when none decodes)."""
    hidden: list[str] = []
    for run in _VS_RUN.finditer(text):
        data = bytes(
            ord(char) - 0xFE00 if ord(char) < 0xE0000 else ord(char) - 0xE0100 + 16 for char in run.group()
        )
        try:
            hidden.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return " ".join(hidden)


def _scan(text: str, depth: int) -> set[str]:
    reasons: set[str] = set()
    for view in _views(_prepare(text)):
        reasons |= _rule_reasons(view)
        if depth < _MAX_DEPTH and any(_scan(plain, depth + 1) for plain in _decoded_runs(view)):
            reasons.add("encoded_payload")
    return reasons


def find_injection(text: str) -> list[str]:
    """Reasons (from ``INJECTION_REASONS``, in that order) why ``text`` looks like an injection."""
    reasons = _scan(text, 0)
    smuggled = "".join(chr(ord(char) - _TAG_BASE) for char in text if ord(char) in _TAG_RANGE)
    smuggled_bytes = _smuggled_bytes(text)
    hidden = (
        sum(char in _SUSPICIOUS_INVISIBLE for char in text)
        + len(smuggled)
        + sum(ord(char) in _VS_SUPPLEMENT for char in text)
    )
    for payload in (smuggled, smuggled_bytes):
        if payload:
            reasons |= _scan(payload, 0)
    invisible = hidden or any(char in _BENIGN_INVISIBLE for char in text)
    if hidden > _MANY_HIDDEN or (invisible and reasons):
        reasons.add("hidden_characters")
    return [reason for reason in INJECTION_REASONS if reason in reasons]


def is_injection(text: str) -> bool:
    """Whether ``find_injection`` has any reason to quarantine ``text``."""
    return bool(find_injection(text))
