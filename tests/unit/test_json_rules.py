"""What JSON Engram accepts (``contracts.json_rules``): any nesting and any text either decode or
are refused with ``INVALID_REQUEST`` naming where — never a ``RecursionError``, and never text a
store cannot keep (U+0000, lone surrogates) let through."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.errors import InvalidRequest
from contracts.json_rules import MAX_JSON_DEPTH, check_storable, decode_json
from contracts.requests import SaveRequest
from shared.messaging.wire import parse_model

AGENT = "0b0b0b0b-0000-4000-8000-000000000001"


def _nested(depth: int) -> bytes:
    return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)


def _storable(value: Any) -> bool:
    """Whether every string of ``value`` (keys too) is UTF-8 without U+0000."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return False
        return "\x00" not in value
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    return True


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 5_000, 100_000])
def test_json_nested_too_deep_is_an_invalid_request(depth: int) -> None:
    """5,000 levels of {"a": … (the issue's HTTP 500) and deeper are refused as bad input."""
    with pytest.raises(InvalidRequest, match="nests deeper"):
        decode_json(_nested(depth))


def test_json_nested_to_the_limit_decodes() -> None:
    """Exactly MAX_JSON_DEPTH levels are accepted: the limit is a bound, not a ban on nesting."""
    assert isinstance(decode_json(_nested(MAX_JSON_DEPTH)), dict)


@pytest.mark.parametrize("digits", [4_301, 5_000, 100_000])
def test_an_integer_of_too_many_digits_is_an_invalid_request(digits: int) -> None:
    """An integer past Python's conversion limit (4,300 digits) in any field is bad input, not the
    plain ValueError that answered INTERNAL (found by the edge fuzz suite)."""
    with pytest.raises(InvalidRequest, match="too many digits"):
        decode_json(b'{"limit": ' + b"9" * digits + b"}")
    body = b'{"agent_config_id": "' + AGENT.encode() + b'", "wait": ' + b"1" * digits + b"}"
    with pytest.raises(InvalidRequest, match="too many digits"):
        parse_model(SaveRequest, body)


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"content": "a \x00 b"}, "content"),
        ({"entries": [{"text": "ok"}, {"text": "x\x00"}]}, "entries.1.text"),
        ({"metadata": {"k\x00": "v"}}, "metadata.k\x00"),
        ({"metadata": {"k": ["v", {"deep": "\ud800"}]}}, "metadata.k.1.deep"),
        ({"cue": "\udfff"}, "cue"),
    ],
)
def test_unstorable_text_is_refused_naming_where(payload: dict[str, Any], where: str) -> None:
    """NUL or a lone surrogate anywhere — value or key, however nested — is INVALID_REQUEST with
    the location in its details."""
    body = json.dumps(payload).encode()
    with pytest.raises(InvalidRequest) as refused:
        decode_json(body)
    assert refused.value.details["loc"] == where


def test_a_surrogate_pair_and_control_characters_are_kept() -> None:
    """An escaped pair (an emoji), tabs, bidi and other control characters are valid text and
    stay as sent: only what no store can hold is refused."""
    body = b'{"t": "\\ud83d\\ude00 \\t \\u202e \\u0001 \\u007f"}'
    assert decode_json(body) == {"t": "\U0001f600 \t \u202e \x01 \x7f"}


def test_parse_model_refuses_nul_in_a_save() -> None:
    """The request-reply edge's parser (shared.messaging.wire.parse_model) applies the rule before the
    model."""
    body = json.dumps({"agent_config_id": AGENT, "content": "a \x00 b"}).encode()
    with pytest.raises(InvalidRequest):
        parse_model(SaveRequest, body)
    with pytest.raises(InvalidRequest, match="nests deeper"):
        parse_model(SaveRequest, _nested(5_000))


#: Any code point, lone surrogates included (JSON carries them as \ud800 escapes).
_any_text = st.text(alphabet=st.characters(exclude_categories=()))
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _any_text,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(_any_text.filter(lambda k: len(k) <= 8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(value=_json)
def test_any_json_value_decodes_storable_or_is_refused(value: Any) -> None:
    """Any JSON a client can write (any code point, lone surrogates as escapes) decodes to text
    every store can keep, or is refused with INVALID_REQUEST — nothing else."""
    body = json.dumps(value).encode()
    try:
        decoded = decode_json(body)
    except InvalidRequest:
        assert not _storable(value)
        return
    assert _storable(decoded)
    assert decoded == value


@given(body=st.binary(max_size=300))
def test_any_bytes_decode_or_are_an_invalid_request(body: bytes) -> None:
    """Arbitrary bytes (invalid UTF-8 included) never raise anything but INVALID_REQUEST."""
    try:
        decoded = decode_json(body)
    except InvalidRequest:
        return
    check_storable(decoded)


@given(depth=st.integers(min_value=1, max_value=3_000), kind=st.sampled_from(["[", '{"k":']))
def test_any_depth_decodes_or_is_refused(depth: int, kind: str) -> None:
    """Lists or objects of any depth: accepted up to the limit, INVALID_REQUEST beyond it."""
    close = "]" if kind == "[" else "}"
    body = (kind * depth + "1" + close * depth).encode()
    if depth <= MAX_JSON_DEPTH:
        decode_json(body)
    else:
        with pytest.raises(InvalidRequest):
            decode_json(body)
