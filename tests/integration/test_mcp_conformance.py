"""The MCP tools against the MCP specification, with the official MCP Python SDK as the client, over
both transports an agent uses: ``engram mcp`` as a stdio subprocess, and the gateway's streamable
HTTP ``/mcp``. Every tool's input and output schema is a valid JSON Schema (2020-12, MCP's dialect);
every tool answers valid arguments with a structured result that matches its output schema and
whose JSON is also its text; and every invalid call — an unknown argument, a wrong JSON type in
each field, a missing required one, a value past each bound, NUL in a string, a tool that does not
exist — is an ``isError`` result with text and a SPEC 9 ``INVALID_REQUEST``, never a protocol error.

The invalid calls are generated from each tool's own input schema, so a new argument or bound is
covered without editing this file. Wrong types are the JSON types the schema does not allow, except
a boolean for a number: the request models accept ``true`` as 1 on every interface (pydantic's lax
mode, as on NATS and HTTP), and the tools take their arguments by the same rules."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.types import CallToolResult, TextContent

from services.mcp import Caller
from services.mcp.catalog import TOOLS
from shared.embedded.nats_server import NatsServerProcess
from shared.security.auth import TokenService
from shared.service.infra import Infra
from tests.integration.test_mcp import RW
from tests.mcp_clients import code_of, connection_file, ok, over_http, over_stdio, text_of
from tests.security.support import mint

pytestmark = pytest.mark.integration

TRANSPORTS = ("stdio", "http")
#: The most one test may take, start-up of ``engram mcp`` included (a bound, not a speed claim).
BUDGET_S = 180.0
SESSION = "conformance-session"
#: One value of each JSON type; a field is sent those of a type its schema does not allow.
SAMPLES: dict[str, Any] = {
    "string": "x",
    "integer": 7,
    "number": 1.5,
    "boolean": True,
    "object": {"a": 1},
    "array": [1],
    "null": None,
}


@pytest.fixture(params=TRANSPORTS)
def connect(
    request: pytest.FixtureRequest, engram: Infra, nats_proc: NatsServerProcess, tmp_path: Path
) -> Callable[[Caller], Client]:
    """How an agent reaches the tools over one transport (enter the client in the test itself)."""
    if request.param == "stdio":
        connection = connection_file(nats_proc, tmp_path / "client.json")
        return lambda caller: over_stdio(connection, caller)
    gateway: str = request.getfixturevalue("gateway")  # only this transport needs it
    return lambda caller: over_http(f"{gateway}/mcp", caller)


@pytest.fixture
def caller(tokens: TokenService, org: UUID, agent: UUID) -> Caller:
    """An end user's agent with read and write, working in a session (so every call shape applies)."""
    return Caller(token=mint(tokens, org, "end_user:alice", RW), agent_config_id=agent, session_id=SESSION)


async def test_every_tool_schema_is_valid_json_schema(
    connect: Callable[[Caller], Client], caller: Caller
) -> None:
    """Each listed tool has an input and an output schema that the JSON Schema 2020-12 meta-schema
    accepts, both objects; the input schema refuses other properties and describes each one."""
    async with asyncio.timeout(BUDGET_S), connect(caller) as client:
        tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == [d.name for d in TOOLS]
    for tool in tools:
        assert tool.output_schema is not None, f"{tool.name} returns structured results without a schema"
        for schema in (tool.input_schema, tool.output_schema):
            Draft202012Validator.check_schema(schema)
            assert schema["type"] == "object", tool.name
            assert (
                schema.get("$schema", Draft202012Validator.META_SCHEMA["$id"])
                == (Draft202012Validator.META_SCHEMA["$id"])
            )
        properties = tool.input_schema["properties"]
        assert tool.input_schema["additionalProperties"] is False, tool.name
        assert set(tool.input_schema.get("required", [])) <= set(properties), tool.name
        assert all(p.get("description") for p in properties.values()), tool.name


async def test_valid_calls_answer_structured_results_with_their_json_as_text(
    connect: Callable[[Caller], Client], caller: Caller
) -> None:
    """Every tool, with its optional arguments and at its bounds: a result that is not an error,
    whose structured content matches the tool's output schema and whose one text block is that
    same JSON. A string argument that looks like JSON stays a string."""
    async with asyncio.timeout(BUDGET_S), connect(caller) as client:
        schemas = {t.name: t.output_schema for t in (await client.list_tools()).tools}
        checked: list[str] = []

        async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
            result = await client.call_tool(tool, args)
            structured = ok(result)
            Draft202012Validator(schemas[tool]).validate(structured)
            assert [type(c) for c in result.content] == [TextContent], (tool, result.content)
            assert json.loads(text_of(result)) == structured, tool
            checked.append(tool)
            return structured

        saved = await call(
            "remember", {"text": "Alice prefers aisle seats.", "importance": 1, "memory_type": "preference"}
        )
        entry = saved["ids"][0]
        await call("remember", {"text": "y" * _bound("remember", "text", "maxLength")})
        await call("recall", {})
        await call(
            "recall",
            {
                "cue": "seat preference",
                "strategy": "last_k",
                "token_budget": _bound("recall", "token_budget", "maximum"),
                "format": "full",
                "top_k": _bound("recall", "top_k", "maximum"),
            },
        )
        await call("recall", {"cue": '["seat", "preference"]', "strategy": "last_k"})
        assert entry in (await call("expand", {"ids": [entry]}))["ids"]
        page = await call("list_memories", {"page_size": 1, "memory_types": ["preference"]})
        assert [e["id"] for e in page["entries"]] == [entry]
        await call("list_memories", {"page_size": _bound("list_memories", "page_size", "maximum")})
        await call("memory_feedback", {"entry_id": entry, "success": True})
        await call("memory_feedback", {"success": False})  # the session as a whole
        assert (await call("forget", {"entry_id": entry}))["entries"] == 1
    assert set(checked) == {d.name for d in TOOLS}


async def test_invalid_calls_are_typed_tool_errors(
    connect: Callable[[Caller], Client], caller: Caller
) -> None:
    """For every tool, calls generated from its input schema — an unknown argument, each field given
    every JSON type it does not allow, each required field missing, each bound passed by one — and a
    tool that does not exist: each an ``isError`` result with text and the SPEC 9 code
    ``INVALID_REQUEST`` naming the field; none stored anything, and the session answers on."""
    await _refused(
        connect(caller), _invalid_calls, extra=[("no_such_tool", "a tool that does not exist", {}, None)]
    )


async def test_nul_in_any_string_argument_is_refused(
    connect: Callable[[Caller], Client], caller: Caller
) -> None:
    """NUL in every string argument (and array item) of every tool: ``INVALID_REQUEST`` as a tool
    error — refused at Engram's edge by the text rule (``contracts/json_rules.py``), never a save
    that fails in Postgres or a 5xx."""
    await _refused(connect(caller), _nul_calls)


async def _refused(
    agent: Client,
    generate: Callable[[dict[str, Any], dict[str, Any]], Iterator[tuple[str, dict[str, Any], str | None]]],
    extra: Sequence[tuple[str, str, dict[str, Any], str | None]] = (),
) -> None:
    """Every call ``generate`` makes of each listed tool (and the ``extra`` calls) is refused, and
    none of them saved a memory (a last_k recall still finds none)."""
    started = time.monotonic()
    failures: list[str] = []
    async with asyncio.timeout(BUDGET_S), agent as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        cases = [(name, *case) for name, schema in tools.items() for case in generate(schema, BASE[name])]
        cases += list(extra)
        for tool, label, args, field in cases:
            problem = _refusal_problem(await client.call_tool(tool, args), field)
            if problem:
                failures.append(f"{tool}: {label}: {problem}")
        assert ok(await client.call_tool("recall", {"strategy": "last_k"}))["results"] == []
    print(f"MCP conformance, {generate.__name__}: {len(cases)} calls in {time.monotonic() - started:.1f}s")
    assert failures == [], "\n".join(failures)
    assert cases


# -- the generated calls --------------------------------------------------------------------------

#: A valid call of each tool; an invalid call changes one thing of it, so its error is that thing's.
BASE: dict[str, dict[str, Any]] = {
    "remember": {"text": "Invoices go out on the 3rd."},
    "recall": {"strategy": "last_k"},
    "expand": {"ids": [str(uuid4())]},
    "forget": {"entry_id": str(uuid4())},
    "list_memories": {},
    "memory_feedback": {"success": True, "entry_id": str(uuid4())},
}


def _bound(tool: str, field: str, keyword: str) -> Any:
    """A bound of a tool's argument, as its schema states it (the request model's)."""
    declared = next(d for d in TOOLS if d.name == tool)
    return _value_schema(declared.arguments.model_json_schema()["properties"][field])[keyword]


def _value_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of an optional property (``anyOf: [X, null]``), else the property."""
    branches = [b for b in schema.get("anyOf", [schema]) if b.get("type") != "null"]
    assert len(branches) == 1, schema
    return branches[0]


def _json_types(schema: dict[str, Any]) -> set[str]:
    allowed = {b.get("type") for b in schema.get("anyOf", [schema])}
    if "number" in allowed:
        allowed.add("integer")  # a JSON integer is a number
    return {t for t in allowed if t}


def _invalid_calls(
    schema: dict[str, Any], base: dict[str, Any]
) -> Iterator[tuple[str, dict[str, Any], str | None]]:
    """``(label, arguments, field at fault)`` for one tool, from its input schema."""
    yield "an unknown argument", {**base, "unknown_argument": 1}, "unknown_argument"
    for name in schema.get("required", []):
        yield f"{name} missing", {k: v for k, v in base.items() if k != name}, name
    for name, prop in schema["properties"].items():
        allowed = _json_types(prop)
        for json_type, sample in SAMPLES.items():
            if json_type in allowed or (json_type == "boolean" and allowed & {"integer", "number"}):
                continue
            yield f"{name} as {json_type}", {**base, name: sample}, name
        for label, value in _past_bounds(_value_schema(prop)):
            yield f"{name} {label}", {**base, name: value}, name


def _past_bounds(schema: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Values one past each bound of a (non-null) property schema, and NUL in its text."""
    step = 1 if schema.get("type") == "integer" else 0.01
    if "minimum" in schema:
        yield "below its minimum", schema["minimum"] - step
    if "maximum" in schema:
        yield "above its maximum", schema["maximum"] + step
    if schema.get("minLength", 0) > 0:
        yield "shorter than its minLength", "x" * (schema["minLength"] - 1)
    if "maxLength" in schema:
        yield "longer than its maxLength", "x" * (schema["maxLength"] + 1)
    if "enum" in schema:
        yield "outside its enum", "not-one-of-them"
    if schema.get("format") == "uuid":
        yield "not a UUID", "not-a-uuid"
    if schema.get("type") == "array":
        item = str(uuid4()) if schema["items"].get("format") == "uuid" else "semantic"
        if schema.get("minItems", 0) > 0:
            yield "with fewer than minItems", [item] * (schema["minItems"] - 1)
        if "maxItems" in schema:
            yield "with more than maxItems", [item] * (schema["maxItems"] + 1)
        for label, value in _past_bounds(schema["items"]):
            yield f"with an item {label}", [value]


def _nul_calls(schema: dict[str, Any], base: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], None]]:
    """NUL in each string argument, and in each string item of an array argument."""
    for name, prop in schema["properties"].items():
        value = _value_schema(prop)
        if value.get("type") == "string" and "enum" not in value and value.get("format") != "uuid":
            yield f"{name} with NUL", {**base, name: "a\x00b"}, None
        if (
            value.get("type") == "array"
            and value["items"].get("type") == "string"
            and "format" not in value["items"]
        ):
            yield f"{name} with NUL in an item", {**base, name: ["a\x00b"]}, None


def _refusal_problem(result: CallToolResult, field: str | None) -> str | None:
    """What is wrong with ``result`` as the refusal of an invalid call (None: nothing)."""
    if not result.is_error:
        return f"accepted: {text_of(result)[:120]}"
    if not text_of(result).strip():
        return "an error without text"
    if code_of(result) != "INVALID_REQUEST":
        return f"{code_of(result)}: {text_of(result)[:160]}"
    named = (result.structured_content or {})["error"].get("details", {}).get("fields")
    if field is not None and named is not None and not any(f.split(".")[0] == field for f in named):
        return f"names {named}, not {field}"
    return None
