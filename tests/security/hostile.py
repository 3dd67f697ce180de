"""Hostile payloads for the edge fuzz suite (``test_edge_fuzz.py``), generated deterministically
from the seed of every security fuzzer (``support.SEED``): the same seed gives the same cases in
the same order, so a red run is replayed by running it again.

A :class:`Case` is one request body — a JSON value to encode (``body``), or bytes sent as they
are (``raw``: what no JSON encoder would write) — with the payload class it belongs to. The classes
(:data:`CLASSES`) are:

- ``json-type``: every JSON type (null, booleans, numbers, strings, arrays, objects) in every field
  of a valid body, nested fields included;
- ``huge-number``: 2**31, 2**63, 2**64, 1e308, -0, 10**400, and an integer of 5,000 digits;
- ``text``: strings of hostile Unicode in every string field — U+0000, lone surrogates, bidi
  overrides and isolates, C0/C1 controls, zero-width and non-characters, astral and combining
  characters — and random code points over the whole range (surrogates included);
- ``invalid-utf8``: raw bytes that are not UTF-8 (a lone continuation byte, an overlong form, an
  encoded surrogate, a cut sequence) inside a string field, and as the whole body;
- ``not-json``: empty, truncated, trailing commas, ``NaN``/``Infinity``, scalars and arrays where
  an object belongs;
- ``deep-nesting``: 65 and 5,000 levels of arrays and objects, in a field and as the body;
- ``duplicate-key``: a field twice, the hostile value first and the valid one last, and the
  other way round;
- ``size-limit``: each string field at its ``max_length`` and one past it, each bounded number at
  its bound and one past it, and the whole body at its operation's byte limit and one byte over
  (which must be ``PAYLOAD_TOO_LARGE``; the one at the limit must not be).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = [
    "CLASSES",
    "HOSTILE_TEXTS",
    "INVALID_UTF8",
    "JSON_TYPES",
    "Case",
    "body_cases",
    "deep",
    "limit_cases",
    "random_text",
    "sample",
]

CLASSES = (
    "json-type",
    "huge-number",
    "text",
    "invalid-utf8",
    "not-json",
    "deep-nesting",
    "duplicate-key",
    "size-limit",
)


@dataclass(frozen=True)
class Case:
    """One hostile request body: ``body`` (encoded as JSON, non-ASCII escaped) or ``raw`` bytes."""

    cls: str
    #: What was changed, for reports: a field's dotted path, or ``<body>``.
    where: str
    label: str
    body: Any = None
    raw: bytes | None = None
    #: ``PAYLOAD_TOO_LARGE`` when the body is over its limit; ``within-limit`` when it is exactly at
    #: it (any answer but ``PAYLOAD_TOO_LARGE``); None: any typed answer.
    expect: str | None = None

    def encoded(self) -> bytes:
        if self.raw is not None:
            return self.raw
        return json.dumps(self.body).encode()


def deep(levels: int, kind: str = "object") -> Any:
    """A JSON value nested ``levels`` deep (built without recursion)."""
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value} if kind == "object" else [value]
    return value


def _deep_text(levels: int) -> bytes:
    return (b'{"a":' * levels) + b"{}" + (b"}" * levels)


#: Every JSON type, and the numbers that overflow what a field holds.
JSON_TYPES: dict[str, Any] = {
    "null": None,
    "true": True,
    "false": False,
    "zero": 0,
    "minus-one": -1,
    "float": 0.5,
    "empty-string": "",
    "string": "x",
    "empty-array": [],
    "array": [1, "x", None],
    "empty-object": {},
    "object": {"a": 1},
    "deep-65": deep(65),
}
HUGE_NUMBERS: dict[str, Any] = {
    "2**31": 2**31,
    "2**63": 2**63,
    "2**64": 2**64,
    "-2**63-1": -(2**63) - 1,
    "1e308": 1e308,
    "-1e308": -1e308,
    "5e-324": 5e-324,
    "-0.0": -0.0,
    "10**400": 10**400,
}
#: Numbers only raw JSON can write: ``-0`` as an integer and an integer past Python's 4,300-digit
#: conversion limit.
RAW_NUMBERS: dict[str, bytes] = {"-0": b"-0", "5000-digits": b"9" * 5000, "1e999": b"1e999"}

HOSTILE_TEXTS: dict[str, str] = {
    "nul": "a\x00b",
    "only-nul": "\x00",
    "lone-high-surrogate": "\ud800",
    "lone-low-surrogate": "x\udfffy",
    "reversed-surrogates": "\udc00\ud800",
    "bidi-override": "\u202egnp.exe\u202c safe",
    "bidi-isolate": "\u2066\u2067\u2068x\u2069",
    "c0-controls": "".join(chr(c) for c in range(1, 32)),
    "c1-controls": "\x7f\x80\x85\x9f",
    "zero-width": "\u200b\u200c\u200d\u2060\ufeff",
    "non-characters": "\ufdd0\ufffe\uffff\U0001fffe\U0010ffff",
    "astral": "\U0001d518\U0001f600\U0001f9ea",
    "combining": "e" + "\u0301" * 300,
    "line-separators": "a\u2028b\u2029c\r\n",
    "whitespace-only": " \t\n\u3000",
    "escapes": '\\"\\u0000</script>{{7*7}}%s%n',
}

#: Byte sequences no UTF-8 decoder takes.
INVALID_UTF8: dict[str, bytes] = {
    "continuation": b"\x80",
    "ff-fe": b"\xff\xfe",
    "overlong-slash": b"\xc0\xaf",
    "encoded-surrogate": b"\xed\xa0\x80",
    "cut-sequence": b"\xe2\x82",
    "latin1": b"caf\xe9",
}

#: Bodies that are not a JSON object.
NOT_JSON: dict[str, bytes] = {
    "empty": b"",
    "whitespace": b" \n",
    "truncated": b'{"a": ',
    "trailing-comma": b'{"a": 1,}',
    "single-quotes": b"{'a': 1}",
    "nan": b'{"a": NaN}',
    "infinity": b'{"a": -Infinity}',
    "null": b"null",
    "number": b"1",
    "string": b'"x"',
    "array": b"[]",
    "bom": b"\xef\xbb\xbf{}",
    "nul-byte": b"{\x00}",
}


def random_text(r: random.Random, length: int) -> str:
    """``length`` code points drawn from the whole range, surrogates and NUL included, biased
    toward the planes and blocks where decoders differ."""
    out = []
    for _ in range(length):
        pick = r.random()
        if pick < 0.2:
            out.append(chr(r.randrange(0, 0x20)))
        elif pick < 0.35:
            out.append(chr(r.randrange(0xD800, 0xE000)))
        elif pick < 0.5:
            out.append(chr(r.choice([0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066])))
        else:
            out.append(chr(r.randrange(0, 0x110000)))
    return "".join(out)


def _set(body: Any, path: Sequence[str | int], value: Any) -> Any:
    """A copy of ``body`` with the value at ``path`` replaced."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(body, dict):
        copy = dict(body)
        copy[head] = _set(body.get(head), rest, value)  # type: ignore[arg-type]
        return copy
    assert isinstance(body, list)
    assert isinstance(head, int)
    items = list(body)
    items[head] = _set(items[head], rest, value)
    return items


def _paths(body: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every field of ``body`` (object members and the first item of each array), depth first."""
    if isinstance(body, dict):
        for key, value in body.items():
            yield (*prefix, key), value
            yield from _paths(value, (*prefix, key))
    elif isinstance(body, list) and body:
        yield from _paths(body[0], (*prefix, 0))


def _dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path) or "<body>"


def _with_raw(body: Mapping[str, Any], path: Sequence[str | int], raw: bytes) -> bytes:
    """``body`` encoded with the JSON text ``raw`` where ``path``'s value is."""
    marker = "\u2603fuzz\u2603"
    text = json.dumps(_set(body, path, marker), ensure_ascii=False).encode()
    return text.replace(json.dumps(marker, ensure_ascii=False).encode(), raw, 1)


def _duplicate(body: Mapping[str, Any], key: str, first: Any, last: Any) -> bytes:
    """``body`` with ``key`` written twice: ``first`` then ``last``."""
    rest = json.dumps({k: v for k, v in body.items() if k != key})[1:-1]
    head = f"{json.dumps(key)}: {json.dumps(first)}, {json.dumps(key)}: {json.dumps(last)}"
    return ("{" + head + (", " + rest if rest else "") + "}").encode()


def body_cases(base: Mapping[str, Any], r: random.Random, *, extra_fields: Sequence[str] = ()) -> list[Case]:
    """Every hostile class of the module's docstring against a valid ``base`` body (size limits
    aside: :func:`limit_cases`). ``extra_fields`` are top-level fields the base leaves out (every
    JSON type goes into those too)."""
    cases: list[Case] = []
    paths = list(_paths(base)) + [((name,), None) for name in extra_fields if name not in base]
    for path, original in paths:
        where = _dotted(path)
        for label, value in JSON_TYPES.items():
            cases.append(Case("json-type", where, label, body=_set(base, path, value)))
        for label, value in HUGE_NUMBERS.items():
            if isinstance(original, int | float) or original is None:
                cases.append(Case("huge-number", where, label, body=_set(base, path, value)))
        if (isinstance(original, int | float) and not isinstance(original, bool)) or original is None:
            for label, raw in RAW_NUMBERS.items():
                cases.append(Case("huge-number", where, label, raw=_with_raw(base, path, raw)))
        if isinstance(original, str) or original is None:
            for label, text in HOSTILE_TEXTS.items():
                cases.append(Case("text", where, label, body=_set(base, path, text)))
            for i in range(2):
                text = random_text(r, r.randrange(1, 40))
                cases.append(Case("text", where, f"random-{i}", body=_set(base, path, text)))
            for label, raw in INVALID_UTF8.items():
                cases.append(
                    Case("invalid-utf8", where, label, raw=_with_raw(base, path, b'"x' + raw + b'y"'))
                )
            # A key no store can keep, in an object where the field is.
            cases.append(
                Case(
                    "text", where, "nul-key", body=_set(base, path[:-1], {"\x00": 1, **_at(base, path[:-1])})
                )
            )
        if isinstance(original, dict | list) or original is None:
            cases.append(
                Case("deep-nesting", where, "5000-objects", raw=_with_raw(base, path, _deep_text(5000)))
            )
            cases.append(
                Case(
                    "deep-nesting", where, "5000-arrays", raw=_with_raw(base, path, b"[" * 5000 + b"]" * 5000)
                )
            )
        if len(path) == 1 and isinstance(path[0], str) and original is not None:
            hostile = HOSTILE_TEXTS["nul"]
            cases.append(
                Case(
                    "duplicate-key", where, "hostile-first", raw=_duplicate(base, path[0], hostile, original)
                )
            )
            cases.append(
                Case("duplicate-key", where, "hostile-last", raw=_duplicate(base, path[0], original, hostile))
            )
    for label, raw in INVALID_UTF8.items():
        cases.append(Case("invalid-utf8", "<body>", label, raw=raw + json.dumps(dict(base)).encode()))
    for label, raw in NOT_JSON.items():
        cases.append(Case("not-json", "<body>", label, raw=raw))
    cases.append(Case("deep-nesting", "<body>", "65-objects", body=deep(65)))
    cases.append(Case("deep-nesting", "<body>", "5000-objects", raw=_deep_text(5000)))
    cases.append(Case("deep-nesting", "<body>", "5000-arrays", raw=b"[" * 5000 + b"]" * 5000))
    cases.append(Case("text", "<body>", "unknown-field", body={**base, "\u202eunknown": "x"}))
    return cases


def _at(body: Any, path: Sequence[str | int]) -> Any:
    for part in path:
        body = body[part]
    return dict(body) if isinstance(body, dict) else {}


def limit_cases(base: Mapping[str, Any], model: type[BaseModel], max_bytes: int) -> list[Case]:
    """The model's declared bounds ±1 on each top-level field, and the body at ``max_bytes`` and
    one byte past it (a filler field padded to the exact size: over the limit the size is refused
    before the unknown field is)."""
    cases: list[Case] = []
    schema = model.model_json_schema()
    for name, prop in schema.get("properties", {}).items():
        for variant in [prop, *prop.get("anyOf", [])]:
            if "maxLength" in variant:
                n = int(variant["maxLength"])
                cases.append(Case("size-limit", name, f"maxLength={n}", body={**base, name: "a" * n}))
                cases.append(
                    Case("size-limit", name, f"maxLength+1={n + 1}", body={**base, name: "a" * (n + 1)})
                )
            if variant.get("minLength", 0) > 0:
                n = int(variant["minLength"])
                cases.append(
                    Case("size-limit", name, f"minLength-1={n - 1}", body={**base, name: "a" * (n - 1)})
                )
            for bound, step in (
                ("maximum", 1),
                ("minimum", -1),
                ("exclusiveMaximum", 0),
                ("exclusiveMinimum", 0),
            ):
                if bound in variant:
                    value = variant[bound]
                    cases.append(Case("size-limit", name, f"{bound}={value}", body={**base, name: value}))
                    past = value + step if step else value
                    if isinstance(value, float) and step:
                        past = value + step * 1e-9
                    cases.append(Case("size-limit", name, f"{bound}±1={past}", body={**base, name: past}))
    cases.append(_sized(base, max_bytes, "within-limit"))
    cases.append(_sized(base, max_bytes + 1, "PAYLOAD_TOO_LARGE"))
    return cases


def _sized(base: Mapping[str, Any], size: int, expect: str) -> Case:
    """``base`` padded with a filler field to exactly ``size`` bytes."""
    empty = json.dumps({**base, "zz_filler": ""}).encode()
    pad = size - len(empty)
    raw = json.dumps({**base, "zz_filler": "a" * max(pad, 0)}).encode()
    assert len(raw) == size, (len(raw), size)
    return Case("size-limit", "<body>", f"{size} bytes", raw=raw, expect=expect)


def sample(cases: Sequence[Case], r: random.Random, limit: int) -> list[Case]:
    """At most ``limit`` of ``cases``, seeded: every class and every size-limit case kept, the rest
    drawn at random (the order of ``cases`` kept)."""
    if len(cases) <= limit:
        return list(cases)
    must = {i for i, c in enumerate(cases) if c.cls == "size-limit" or c.expect is not None}
    first_of_class: dict[str, int] = {}
    for i, c in enumerate(cases):
        first_of_class.setdefault(c.cls, i)
    must |= set(first_of_class.values())
    rest = [i for i in range(len(cases)) if i not in must]
    chosen = must | set(r.sample(rest, max(0, min(len(rest), limit - len(must)))))
    return [c for i, c in enumerate(cases) if i in chosen]
