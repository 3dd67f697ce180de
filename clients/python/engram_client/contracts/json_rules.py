"""What JSON Engram accepts, beyond each model's own fields: how deep it nests, and which text it
can store. One rule for every way text enters (requests, published sessions, HTTP bodies and
query strings, token claims), so no store ever meets what it cannot hold
(docs/adr/0014-text-no-store-can-keep.md). Plain functions, no client library: clients may check with
them too.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engram_client.contracts.errors import InvalidRequest

__all__ = ["MAX_JSON_DEPTH", "check_storable", "decode_json"]

#: JSON nested deeper than this is refused. No request of the contract needs more than a few
#: levels (metadata objects included), and the decoders' own recursion — Python's ``json``,
#: pydantic, a jsonb column — ends in ``RecursionError`` or a 500 far below what 256 KiB can nest.
MAX_JSON_DEPTH = 64

#: Characters no store Engram writes to can hold: U+0000 (Postgres refuses it in ``text`` and
#: ``jsonb``) and UTF-16 surrogates, which JSON can escape (``\ud800``) and Python decodes, but
#: which no UTF-8 text can carry. Refused wherever text enters
#: (docs/adr/0014-text-no-store-can-keep.md).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: The only ways those characters can be written in JSON text: as ``\u`` escapes (raw control
#: characters inside strings, and raw surrogates, are not valid JSON / UTF-8 to begin with).
_UNSTORABLE_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def decode_json(body: bytes | str) -> Any:
    """The JSON value of ``body``, refusing (``INVALID_REQUEST``) what is not JSON, is nested
    deeper than :data:`MAX_JSON_DEPTH`, holds an integer too long to convert, or holds text no
    store can keep (:func:`check_storable`)."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest("payload is not valid JSON") from exc
    except RecursionError as exc:
        raise InvalidRequest(f"payload nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:
        # Python refuses to convert an integer of more than ``sys.get_int_max_str_digits()`` digits
        # (4,300 by default: the conversion is quadratic) with a plain ValueError.
        raise InvalidRequest("payload holds a number with too many digits") from exc
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    # The walk is only needed when the bytes could hold something to refuse (the usual request
    # has neither an escape of that kind nor that many brackets): the hot path stays a decode.
    if _UNSTORABLE_ESCAPE.search(raw) or raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH:
        check_storable(data)
    return data


def check_storable(data: Any) -> None:
    """Refuse (``INVALID_REQUEST``, naming where) a JSON value nested deeper than
    :data:`MAX_JSON_DEPTH`, or with U+0000 or a lone surrogate in any string, keys included."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(data, 1, ())]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidRequest(
                f"payload nests deeper than {MAX_JSON_DEPTH} levels", {"loc": ".".join(path)}
            )
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            where = (*path, str(key))
            if isinstance(key, str):
                _check_text(key, where)
            stack.append((item, depth + 1, where))


def _check_text(text: str, path: tuple[str, ...]) -> None:
    if _UNSTORABLE.search(text) is not None:
        raise InvalidRequest(
            "text holds U+0000 or a lone surrogate, which no store can keep: send valid Unicode "
            "without NUL characters",
            {"loc": ".".join(path)},
        )
