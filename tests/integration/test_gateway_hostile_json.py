"""The HTTP gateway meets the same JSON rules as NATS (``contracts.json_rules``): a body, a JSON
query value or a published session nested 5,000 levels deep, or holding U+0000 or a lone
surrogate, answers the SPEC 9 envelope with 400 — never a 500 — and nothing is published or saved."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import httpx
import pytest

from tests.platform import session_payload

pytestmark = pytest.mark.integration

DEEP = '{"a":' * 5000 + "{}" + "}" * 5000


def _refused(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, (response.status_code, response.text[:300])
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST", error
    return error


async def test_a_body_nested_5000_levels_is_a_400(http: httpx.AsyncClient, service_token: str) -> None:
    """POST routes with a 5,000-level body (the issue's 500) answer 400 INVALID_REQUEST."""
    auth = {"Authorization": f"Bearer {service_token}", "Content-Type": "application/json"}
    for path in ("/v1/memories", "/v1/recall", "/v1/sessions"):
        _refused(await http.post(path, content=DEEP, headers=auth))
    _refused(await http.patch(f"/v1/memories/{UUID(int=1)}", content=DEEP, headers=auth))


async def test_a_json_query_value_nested_too_deep_is_a_400(
    http: httpx.AsyncClient, service_token: str, agent: UUID
) -> None:
    """A metadata filter in the query string nested 2,000 levels (past the decoder's recursion;
    a URL of 5,000 would pass the client's own length limit) answers 400, not 500."""
    params = {"agent_config_id": str(agent), "metadata": '{"a":' * 2000 + "{}" + "}" * 2000}
    _refused(
        await http.get("/v1/memories", params=params, headers={"Authorization": f"Bearer {service_token}"})
    )


@pytest.mark.parametrize("text", ["a \x00 b", "\ud800"])
async def test_unstorable_text_in_a_body_or_a_query_is_a_400(
    http: httpx.AsyncClient, service_token: str, org: UUID, agent: UUID, text: str
) -> None:
    """NUL or a lone surrogate in a save, a published session or a query parameter answers 400
    naming the field, whichever way it came in."""
    auth = {"Authorization": f"Bearer {service_token}", "Content-Type": "application/json"}
    save = {"agent_config_id": str(agent), "content": text, "wait": True}
    error = _refused(await http.post("/v1/memories", content=json.dumps(save), headers=auth))
    assert error["details"]["loc"] == "content"
    session = session_payload(org, agent, task=text)
    error = _refused(await http.post("/v1/sessions", content=json.dumps(session), headers=auth))
    assert error["details"]["loc"] == "task"
    if text == "a \x00 b":  # a URL carries code points as UTF-8, which a lone surrogate is not
        params = {"agent_config_id": str(agent), "session_id": text}
        _refused(await http.get("/v1/memories", params=params, headers=auth))


@pytest.mark.parametrize(("path", "param"), [("/v1/dead-letters", "limit"), ("/v1/memories", "page_size")])
async def test_a_query_integer_of_too_many_digits_is_a_400(
    http: httpx.AsyncClient, service_token: str, agent: UUID, path: str, param: str
) -> None:
    """An integer query value past Python's 4,300-digit conversion limit answers 400, not the
    500 of a ValueError in the gateway's typing of query values (found by the edge fuzz suite)."""
    params = {param: "9" * 5000} | ({"agent_config_id": str(agent)} if path == "/v1/memories" else {})
    _refused(await http.get(path, params=params, headers={"Authorization": f"Bearer {service_token}"}))
