"""The edge fuzz suite (SPEC 9: bad input never crashes a service, never loses a message, never
leaves a partial write). Hostile payloads from ``tests/security/hostile.py`` — every class there,
seeded — go through every way into Engram:

- every request subject of the operation table, over NATS and through the HTTP gateway (its
  route for the subject; query strings for GET and DELETE, with bytes no URL decoder takes);
- every stream subject a platform may publish (``engram.session.ended``) over JetStream;
- every MCP tool, with the official SDK's client (in-process), and as raw JSON-RPC through the
  gateway's streamable-HTTP ``/mcp`` (what only a transport sees: bytes that are not JSON).

After each batch: every request was answered within its deadline with a reply or a typed SPEC 9
error of status below 500 (a body over its limit with ``PAYLOAD_TOO_LARGE``, one at it without);
every published message JetStream acknowledged was taken (ingest's and distill's inbox rows) or
dead-lettered with an audit record naming its delivery; no durable consumer has pending or
unacknowledged messages once the pipeline is quiet (waited on, never slept); and no service logged
a traceback. The counts per interface and payload class are printed (``SECURITY edge-fuzz-…``) and
kept in ``tests/security/.results/security.json``.

``ENGRAM_SECURITY_FUZZ_CASES`` bounds the cases per operation and interface (default 90; every payload class
and every size-limit case is always kept), ``ENGRAM_SECURITY_SEED`` changes the draw.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, quote_from_bytes
from uuid import UUID, uuid4

import httpx
import nats.errors
import pytest
from mcp.types import CallToolResult
from nats.aio.client import Client
from sqlalchemy import select

from contracts.errors import ErrorCode, error_for_code
from contracts.events import MAX_SESSION_BYTES, SessionEnded
from contracts.operations import MEMORY_EXPORT, OPERATIONS, OPS_LAG, Operation
from services.mcp import Caller
from services.mcp.catalog import TOOLS
from shared.security.auth import ALL_PERMISSIONS, OPERATOR, TENANT_ADMIN, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG, INBOX
from tests.mcp_clients import code_of, in_process, text_of
from tests.platform import request, session_payload, until_nothing_missing
from tests.security import hostile
from tests.security.hostile import Case
from tests.security.support import mint, report, rng, save
from tests.security.transport import query_value

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
#: Cases per operation over NATS, and per MCP tool (every class and every size-limit case always
#: kept); the gateway takes two thirds as many (each costs it more than NATS does), sessions twice.
PER_OP = int(os.environ.get("ENGRAM_SECURITY_FUZZ_CASES", "90"))
HTTP_PER_OP = PER_OP * 2 // 3
#: Requests in flight at once: enough to keep the services busy, few enough for a loaded 2-core box.
CONCURRENCY = 8
#: A caller's default wait for a reply (``EngramClient``'s); operations may name a longer one.
DEFAULT_DEADLINE_S = 10.0


# -- logs -----------------------------------------------------------------------------------------


class _Tracebacks(logging.Handler):
    """Every log record that carries a traceback (an exception logged with ``exc_info``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback (most recent call last)" in record.getMessage():
            self.records.append(record)

    def take(self) -> list[str]:
        seen = [
            f"{r.name}: {r.getMessage()[:200]} ({r.exc_info[1]!r})" if r.exc_info else r.getMessage()[:300]
            for r in self.records
        ]
        self.records.clear()
        return seen


@pytest.fixture
def tracebacks() -> Iterator[_Tracebacks]:
    handler = _Tracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


# -- verdicts -------------------------------------------------------------------------------------


@dataclass
class Batch:
    """What one interface's batch sent, how it was answered, and what was wrong."""

    name: str
    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    skipped: int = 0
    by_class: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    #: The slowest answers: (seconds, what), for the report.
    slowest: list[tuple[float, str]] = field(default_factory=list)

    def timed(self, seconds: float, what: str) -> None:
        self.slowest = sorted([*self.slowest, (round(seconds, 2), what)], reverse=True)[:5]

    def judge(self, what: str, case: Case, reply: Any) -> None:
        """A reply (a decoded JSON value, or an exception when there was none) held to the rule:
        a reply or a typed SPEC 9 error below 500, the size rule for the cases at the limit."""
        self.sent += 1
        self.by_class[case.cls] += 1
        label = f"{what} {case.cls} {case.where} {case.label}"
        if isinstance(reply, BaseException):
            self.codes["NO_REPLY"] += 1
            self.problem(f"{label}: no reply ({type(reply).__name__}: {str(reply)[:120]})")
            return
        if not isinstance(reply, dict):
            self.codes["NOT_AN_OBJECT"] += 1
            self.problem(f"{label}: reply is not an object: {str(reply)[:120]}")
            return
        error = reply.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        self.codes[str(code or "OK")] += 1
        if error is not None:
            if code not in ErrorCode.__members__ or not isinstance(error, dict):
                self.problem(f"{label}: untyped error {str(error)[:160]}")
                return
            status = error_for_code(code, "").status
            if error.get("status") != status:
                self.problem(f"{label}: {code} with status {error.get('status')}")
            if status >= 500:
                self.problem(f"{label}: {code} {str(error.get('message'))[:160]}")
        if case.expect == "PAYLOAD_TOO_LARGE" and code != "PAYLOAD_TOO_LARGE":
            self.problem(f"{label}: a body over the limit answered {code or 'OK'}")
        if case.expect == "within-limit" and code == "PAYLOAD_TOO_LARGE":
            self.problem(f"{label}: a body at the limit answered PAYLOAD_TOO_LARGE")

    def problem(self, what: str) -> None:
        if len(self.problems) < 300:
            self.problems.append(what)

    def conclude(self, tracebacks: list[str], **extra: Any) -> None:
        report(
            self.name,
            sent=self.sent,
            skipped=self.skipped,
            seconds=round(time.monotonic() - self.started, 1),
            problems=len(self.problems),
            tracebacks=len(tracebacks),
            **extra,
            # Shown in the summary line too (the lead's closing note: classes and counts per interface).
            per_class=",".join(f"{k}:{v}" for k, v in sorted(self.by_class.items())),
            per_code=",".join(f"{k}:{v}" for k, v in sorted(self.codes.items())),
            classes=dict(self.by_class),
            codes=dict(self.codes),
            slowest=self.slowest,
            problem_list=self.problems[:40],
            traceback_list=tracebacks[:20],
        )
        assert self.problems == [], "\n".join(self.problems[:40])
        assert tracebacks == [], "\n".join(tracebacks[:20])


async def _bounded(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(one(job) for job in jobs))


def _deadline(op: Operation[Any, Any]) -> float:
    return op.timeout_s or DEFAULT_DEADLINE_S


# -- the request bodies ---------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """The organization the fuzzer acts in: an agent config with a few saved entries."""

    org: UUID
    agent: UUID
    token: str
    entry_ids: list[str]


def _bases(w: World) -> dict[str, dict[str, Any]]:
    """A valid body per operation, with as many of its fields set as make sense (each is a field
    the fuzzer then replaces): what an honest caller would send."""
    agent, entry = str(w.agent), w.entry_ids[0]
    scoped = {"agent_config_id": agent, "principal": ALICE}
    session = session_payload(
        w.org,
        w.agent,
        principal=ALICE,
        tool_trace=[{"tool": "lookup", "input": {"q": "a"}, "output": "ok", "error": None, "duration_ms": 5}],
        transcript=[{"role": "user", "content": "hello"}],
        rating=0.5,
    )
    return {
        "memory.save": {
            **scoped,
            "session_id": "s-fuzz",
            "entries": [
                {"text": "fuzz note", "importance": 0.5, "memory_type": "semantic", "metadata": {"k": "v"}}
            ],
            "wait": False,
        },
        "session.submit": session,
        "recall": {
            **scoped,
            "session_id": "s-fuzz",
            "strategy": "hybrid",
            "cue": "fuzz note",
            "top_k": 5,
            "format": "text",
            "token_budget": 500,
            "filters": {"memory_types": ["semantic"], "min_importance": 0.1},
        },
        "recall.expand": {**scoped, "ids": [entry]},
        "memory.feedback": {**scoped, "entry_id": entry, "success": True},
        "memory.list": {
            **scoped,
            "memory_types": ["semantic"],
            "min_importance": 0.1,
            "session_id": "s-fuzz",
            "metadata": {"k": "v"},
            "page_size": 10,
        },
        "memory.get": {**scoped, "entry_id": entry, "history": True},
        "memory.manage": {**scoped, "entry_id": entry, "op": "change_retention", "ttl_seconds": 3600},
        # Aimed at an entry that does not exist: the fuzzer's valid cases erase nothing it needs.
        "memory.delete": {**scoped, "entry_id": str(uuid4())},
        "memory.purge": {"actor_ref": "end_user:nobody", "agent_config_id": agent, "session_id": "s-none"},
        "memory.prune": {"agent_config_id": str(uuid4()), "max_entries": 1000},
        "memory.export": {"actor_ref": "end_user:alice", "agent_config_id": agent, "page_size": 10},
        "config.get": {"agent_config_id": agent},
        "config.put": {"agent_config_id": str(uuid4()), "config": {"memory_enabled": True}},
        "audit.query": {"kind": "memory.saved", "after_seq": 0, "limit": 10, "agent_config_id": agent},
        "audit.verify": {},
        "ops.dead_letters": {"source": "ingest", "limit": 10},
        "ops.lag": {},
        # The admin API: valid cases name an organization never registered (NOT_FOUND) or a new
        # one, so the fuzzer changes no tenant it relies on.
        "admin.org.create": {"name": "fuzz org"},
        "admin.org.list": {"include_disabled": True},
        "admin.org.disable": {"org_id": str(uuid4())},
        "admin.agent_config.create": {"org_id": str(uuid4()), "config": {"top_k": 5}},
        "admin.agent_config.list": {"org_id": str(uuid4())},
        "admin.client.mint": {
            "org_id": str(uuid4()),
            "name": "fuzz-client",
            "permissions": ["memory.read"],
            "token_ttl_seconds": 3600,
        },
        "admin.client.rotate": {"name": "no-such-client", "permissions": ["memory.read"]},
        "admin.client.revoke": {"name": "no-such-client"},
        "admin.client.list": {"org_id": str(uuid4()), "include_revoked": True},
        "admin.token.mint": {
            "org_id": str(uuid4()),
            "principal": {"kind": "actor", "id": "carol"},
            "permissions": ["memory.read"],
            "ttl_seconds": 600,
        },
        "admin.token.revoke": {"org_id": str(uuid4()), "token_id": "fuzz-token"},
        # A private address: refused (no DNS lookup, nothing registered that would call out).
        "webhooks.register": {
            "url": "http://127.0.0.1:9/fuzz",
            "description": "fuzz",
            "events": ["memory.written"],
        },
        "webhooks.list": {},
        "webhooks.delete": {"webhook_id": str(uuid4())},
        "webhooks.replay": {"webhook_id": str(uuid4()), "event_ids": [str(uuid4())]},
    }


def _pool(op: Operation[Any, Any], base: dict[str, Any], r: random.Random) -> list[Case]:
    """Every case of ``op`` (before sampling)."""
    cases = hostile.body_cases(base, r, extra_fields=list(op.request.model_fields))
    return cases + hostile.limit_cases(base, op.request, op.max_request_bytes)


@pytest.fixture
async def world(engram: Infra, nc: Client, tokens: TokenService, org: UUID, agent: UUID) -> World:
    """The fuzzer's token may do everything, the deployment's operations included, so every
    operation runs its handler rather than stopping at a permission."""
    token = mint(tokens, org, "service:runner", ALL_PERMISSIONS | {OPERATOR, TENANT_ADMIN})
    ids = await save(nc, token, agent, ["Invoices route through the north team.", "Alice likes tea."], ALICE)
    return World(org, agent, token, ids)


# -- over NATS ------------------------------------------------------------------------------------


async def test_every_request_subject_over_nats(world: World, nc: Client, tracebacks: _Tracebacks) -> None:
    """Every operation of the table, its hostile bodies as NATS request bytes: each answered within
    its deadline, typed and below 500; afterwards every consumer quiet and no traceback logged."""
    batch = Batch("edge-fuzz-nats")
    bases = _bases(world)
    headers = {"Authorization": f"Bearer {world.token}"}
    jobs: list[Callable[[], Awaitable[None]]] = []
    for op in OPERATIONS:
        r = rng(f"edge-fuzz:nats:{op.name}")
        for case in hostile.sample(_pool(op, bases[op.name], r), r, PER_OP):

            async def send(op: Operation[Any, Any] = op, case: Case = case) -> None:
                began = time.monotonic()
                try:
                    msg = await nc.request(op.subject, case.encoded(), timeout=_deadline(op), headers=headers)
                    reply: Any = json.loads(msg.data)
                except (nats.errors.Error, ValueError) as exc:
                    reply = exc
                batch.timed(time.monotonic() - began, f"{op.subject} {case.cls} {case.where} {case.label}")
                batch.judge(op.subject, case, reply)

            jobs.append(send)
    await _bounded(jobs)
    await _quiet(nc, world.token)
    batch.conclude(tracebacks.take(), operations=len(OPERATIONS))


# -- through the HTTP gateway ---------------------------------------------------------------------


def _query_bytes(value: bytes) -> str:
    return quote_from_bytes(value, safe="")


def _segment(value: Any) -> str:
    """``value`` as a path segment: a lone surrogate as its UTF-8 form (surrogatepass), which no
    decoder takes."""
    return _query_bytes(str(value).encode("utf-8", "surrogatepass"))


def _http_request(op: Operation[Any, Any], case: Case, base: Mapping[str, Any]) -> dict[str, Any] | None:
    """``case`` as httpx request arguments for ``op``'s route, or None where the route cannot
    carry it (a body that is not an object, on a route without a body)."""
    body = case.body
    path = op.http_path
    source = body if isinstance(body, dict) else base
    for name in op.path_params:
        path = path.replace("{" + name + "}", _segment(source.get(name, "")))
    if op.http_method not in ("GET", "DELETE"):
        if case.raw is not None:
            return {"method": op.http_method, "url": path, "content": case.raw}
        content = (
            json.dumps({k: v for k, v in body.items() if k not in op.path_params})
            if isinstance(body, dict)
            else json.dumps(body)
        )
        return {"method": op.http_method, "url": path, "content": content.encode()}
    if not isinstance(body, dict):
        return None
    parts = []
    for key, value in body.items():
        if key in op.path_params or value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            text = query_value(key, item)
            # A lone surrogate is no URL's: its UTF-8 form with surrogatepass, which no decoder takes.
            encoded = text.encode("utf-8", "surrogatepass")
            parts.append(f"{quote(key, safe='')}={_query_bytes(encoded)}")
    return {"method": op.http_method, "url": path + ("?" + "&".join(parts) if parts else "")}


def _query_cases(op: Operation[Any, Any], base: Mapping[str, Any]) -> list[tuple[Case, dict[str, Any]]]:
    """GET and DELETE routes take no body: their raw cases are query strings — each parameter with
    bytes that are not UTF-8, a NUL, and a number of 5,000 digits."""
    out: list[tuple[Case, dict[str, Any]]] = []
    path = op.http_path
    for param in op.path_params:
        path = path.replace("{" + param + "}", _segment(base.get(param, "")))
    names = [n for n in op.request.model_fields if n not in op.path_params]
    for name in names:
        for label, raw in {**hostile.INVALID_UTF8, "nul": b"a\x00b", "5000-digits": b"9" * 5000}.items():
            rest = [
                f"{k}={_query_bytes(query_value(k, v).encode())}"
                for k, v in base.items()
                if k != name and k not in op.path_params and not isinstance(v, list) and v is not None
            ]
            query = "&".join([*rest, f"{name}={_query_bytes(raw)}"])
            cls = (
                "huge-number"
                if label == "5000-digits"
                else "invalid-utf8"
                if label in hostile.INVALID_UTF8
                else "text"
            )
            case = Case(cls, name, f"query-{label}")
            out.append((case, {"method": op.http_method, "url": f"{path}?{query}"}))
    return out


def _decode(op: Operation[Any, Any], response: httpx.Response, batch: Batch, label: str) -> Any:
    """The reply as a NATS caller would read it; HTTP's own rules checked on the way (an error's
    status is its envelope's, a success is 200 or 202)."""
    if op is MEMORY_EXPORT and response.status_code == 200:
        lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        return dict(lines[-1]) if lines and "error" in lines[-1] else {"entries": lines}
    if response.is_redirect:
        # An empty entry id (``/v1/memories/``) once drew Starlette's silent 307 to another route.
        batch.problem(f"{label}: HTTP {response.status_code} redirect without an envelope")
        return {"redirect": response.headers.get("location")}
    try:
        data = response.json()
    except ValueError:
        return ValueError(f"HTTP {response.status_code}, not JSON: {response.text[:120]!r}")
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("status") != response.status_code:
        batch.problem(f"{label}: HTTP {response.status_code}, envelope {error.get('status')}")
    if error is None and response.status_code not in (200, 202):
        batch.problem(f"{label}: HTTP {response.status_code} without an error envelope")
    return data


async def test_every_route_through_the_gateway(
    world: World, http: httpx.AsyncClient, nc: Client, tracebacks: _Tracebacks
) -> None:
    """The same operations through the gateway's routes (bodies for POST, PUT and PATCH; query
    strings and path segments, with bytes no decoder takes, for GET and DELETE): each answered
    within its deadline, its HTTP status its envelope's, typed and below 500."""
    batch = Batch("edge-fuzz-http")
    bases = _bases(world)
    headers = {"Authorization": f"Bearer {world.token}", "Content-Type": "application/json"}
    jobs: list[Callable[[], Awaitable[None]]] = []

    async def send(op: Operation[Any, Any], case: Case, args: dict[str, Any]) -> None:
        label = f"{op.http_method} {op.http_path}"
        began = time.monotonic()
        try:
            response = await http.request(**args, headers=headers, timeout=_deadline(op) + 5)
            reply = _decode(op, response, batch, f"{label} {case.cls} {case.where} {case.label}")
        except httpx.InvalidURL:
            batch.skipped += 1  # longer than any client sends (httpx's own limit, 64 KiB)
            return
        except httpx.HTTPError as exc:
            reply = exc
        batch.timed(time.monotonic() - began, f"{label} {case.cls} {case.where} {case.label}")
        batch.judge(label, case, reply)

    not_applicable = 0
    for op in OPERATIONS:
        base = bases[op.name]
        r = rng(f"edge-fuzz:http:{op.name}")
        requests: dict[int, tuple[Case, dict[str, Any]]] = {}
        for case in _pool(op, base, r):
            args = _http_request(op, case, base)
            if args is None:
                not_applicable += 1
            else:
                requests[id(case)] = (case, args)
        if op.http_method in ("GET", "DELETE"):
            requests |= {id(case): (case, args) for case, args in _query_cases(op, base)}
        for case in hostile.sample([c for c, _ in requests.values()], r, HTTP_PER_OP):
            args = requests[id(case)][1]
            jobs.append(lambda op=op, case=case, args=args: send(op, case, args))
    await _bounded(jobs)
    await _quiet(nc, world.token)
    batch.conclude(tracebacks.take(), routes=len(OPERATIONS), not_applicable=not_applicable)


# -- published sessions ---------------------------------------------------------------------------


def _session_cases(w: World) -> list[Case]:
    """Hostile ``session.ended`` payloads, each with an event id of its own (so each one's fate can
    be told apart), the size limit ±1 included."""
    base = _bases(w)["session.submit"]
    r = rng("edge-fuzz:session.ended")
    cases = hostile.body_cases(base, r, extra_fields=list(SessionEnded.model_fields))
    cases += hostile.limit_cases(base, SessionEnded, MAX_SESSION_BYTES)
    cases = hostile.sample(cases, r, PER_OP * 2)
    own = []
    old = base["event_id"]
    for case in cases:
        new = str(UUID(int=r.getrandbits(128), version=4))
        if case.raw is not None:
            own.append(
                Case(
                    case.cls,
                    case.where,
                    case.label,
                    raw=case.raw.replace(old.encode(), new.encode()),
                    expect=case.expect,
                )
            )
        elif isinstance(case.body, dict):
            body = {**case.body, "event_id": new} if case.body.get("event_id") == old else case.body
            own.append(Case(case.cls, case.where, case.label, body=body, expect=case.expect))
        else:
            own.append(case)
    return own


def _event_key(case: Case, org: UUID) -> str | None:
    """The inbox key ingest would claim for ``case`` (``<org>/<event_id>``), if it names one."""
    try:
        data = json.loads(case.encoded())
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    try:  # ingest's own reading: a key of two UUIDs, or none (the session is unreadable)
        return f"{UUID(str(data.get('org_id')))}/{UUID(str(data.get('event_id')))}"
    except ValueError:
        return None


async def test_every_stream_subject_a_platform_publishes(
    world: World, nc: Client, db: Database, tracebacks: _Tracebacks
) -> None:
    """Hostile ``engram.session.ended`` messages over JetStream: each one acknowledged by the
    stream is either taken (ingest's inbox row, then distill's) or dead-lettered with an audit
    record of its delivery; afterwards no consumer holds anything."""
    batch = Batch("edge-fuzz-session-ended")
    since = datetime.now(UTC)
    js = nc.jetstream()
    headers = {"Authorization": f"Bearer {world.token}"}
    published: dict[int, Case] = {}
    refused_by_stream = 0
    for case in _session_cases(world):
        batch.sent += 1
        batch.by_class[case.cls] += 1
        try:
            ack = await js.publish(
                "engram.session.ended", case.encoded(), headers=headers, timeout=DEFAULT_DEADLINE_S
            )
        except nats.errors.Error as exc:
            # Over the stream's own message limit: refused at publish, nothing stored to lose.
            refused_by_stream += 1
            if case.expect != "PAYLOAD_TOO_LARGE":
                batch.problem(f"session.ended {case.cls} {case.where} {case.label}: publish failed: {exc!r}")
            continue
        published[ack.seq] = case
    await _quiet(nc, world.token)

    async with db.read() as s:
        rows = (
            await s.execute(
                select(AUDIT_LOG.c.kind, AUDIT_LOG.c.details).where(
                    AUDIT_LOG.c.kind.in_(("session.rejected", "distill.rejected")),
                    AUDIT_LOG.c.occurred_at >= since,
                )
            )
        ).all()
        keys = {k for k in (_event_key(c, world.org) for c in published.values()) if k}
        inbox = (
            await s.execute(select(INBOX.c.consumer, INBOX.c.event_id).where(INBOX.c.event_id.in_(keys)))
        ).all()
    ingest_letters = {
        int(str(d.get("delivery", "")).split(":")[1])
        for kind, d in rows
        if kind == "session.rejected" and str(d.get("delivery", "")).startswith("ENGRAM_SESSIONS:")
    }
    distill_letters = {str(d.get("event_id")) for kind, d in rows if kind == "distill.rejected"}
    taken = {(c, e) for c, e in inbox}
    outcomes: Counter[str] = Counter()
    for seq, case in published.items():
        key = _event_key(case, world.org)
        label = f"session.ended seq {seq} {case.cls} {case.where} {case.label}"
        if seq in ingest_letters:
            outcomes["dead-lettered by ingest"] += 1
        elif key and ("ingest", key) in taken:
            event_id = key.split("/", 1)[1]
            if ("distill", key) in taken:
                outcomes["stored"] += 1
            elif event_id in distill_letters:
                outcomes["dead-lettered by distill"] += 1
            else:
                batch.problem(f"{label}: taken by ingest, neither distilled nor dead-lettered")
        else:
            batch.problem(f"{label}: acknowledged by the stream, neither taken nor dead-lettered")
        if case.expect == "PAYLOAD_TOO_LARGE" and seq not in ingest_letters:
            batch.problem(f"{label}: a session over {MAX_SESSION_BYTES} bytes was taken")
    batch.conclude(
        tracebacks.take(),
        published=len(published),
        refused_by_stream=refused_by_stream,
        **{k.replace(" ", "_").replace("-", "_"): v for k, v in outcomes.items()},
    )


# -- MCP tools ------------------------------------------------------------------------------------


def _tool_bases(w: World) -> dict[str, dict[str, Any]]:
    entry = w.entry_ids[0]
    return {
        "remember": {"text": "fuzz note", "importance": 0.5, "memory_type": "semantic"},
        "recall": {"cue": "fuzz", "strategy": "hybrid", "token_budget": 300, "format": "text", "top_k": 5},
        "expand": {"ids": [entry]},
        "memory_feedback": {"entry_id": entry, "success": True},
        "list_memories": {"page_size": 5, "memory_types": ["semantic"]},
        "forget": {"entry_id": str(uuid4())},
    }


async def test_every_mcp_tool(
    world: World, nc: Client, tokens: TokenService, tracebacks: _Tracebacks
) -> None:
    """Every tool with hostile arguments (each a JSON object: the raw classes are the transports'
    to refuse): an answer within the deadline, a result or a typed tool error, never an
    untyped one or ``INTERNAL``."""
    batch = Batch("edge-fuzz-mcp")
    caller = Caller(
        token=mint(tokens, world.org, "end_user:alice", {"memory.read", "memory.write"}),
        agent_config_id=world.agent,
        session_id="s-fuzz",
    )
    bases = _tool_bases(world)
    assert set(bases) == {t.name for t in TOOLS}
    async with in_process(nc, caller) as client:
        for tool in TOOLS:
            base = bases[tool.name]
            r = rng(f"edge-fuzz:mcp:{tool.name}")
            cases = hostile.sample(
                [
                    c
                    for c in hostile.body_cases(base, r, extra_fields=list(tool.arguments.model_fields))
                    if isinstance(c.body, dict)
                ],
                r,
                PER_OP,
            )
            for case in cases:
                reply: Any
                try:
                    result = await asyncio.wait_for(
                        client.call_tool(tool.name, case.body), DEFAULT_DEADLINE_S * 2
                    )
                    reply = _tool_reply(result)
                except Exception as exc:  # the SDK raises what the server answered as a protocol error
                    reply = exc
                batch.judge(f"mcp {tool.name}", case, reply)
    await _quiet(nc, world.token)
    batch.conclude(tracebacks.take(), tools=len(TOOLS))


def _rpc(tool: str, arguments: bytes) -> bytes:
    """A JSON-RPC ``tools/call`` of ``tool`` whose arguments are the JSON text ``arguments``."""
    head = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call"})[:-1]
    return f'{head}, "params": {{"name": {json.dumps(tool)}, "arguments": '.encode() + arguments + b"}}"


def _rpc_reply(response: httpx.Response) -> Any:
    """A streamable-HTTP answer as a reply: a JSON-RPC error is a refusal (``INVALID_REQUEST``, its
    code kept in the message), a tool result as :func:`_tool_reply` reads it, anything else is what
    the transport refused (below 500 with the SPEC 9 envelope, or a body-less 4xx of the SDK)."""
    try:
        data = response.json()
    except ValueError:
        if response.status_code < 500:
            return {"error": {"code": "INVALID_REQUEST", "status": 400, "message": response.text[:80]}}
        return ValueError(f"HTTP {response.status_code}, not JSON: {response.text[:120]!r}")
    if response.status_code >= 500:
        return {"error": {"code": "INTERNAL", "status": 500, "message": str(data)[:160]}}
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and "jsonrpc" in data:
        return {"error": {"code": "INVALID_REQUEST", "status": 400, "message": str(data["error"])[:160]}}
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        return _tool_reply(CallToolResult.model_validate(data["result"]))
    return data


async def test_every_mcp_tool_over_streamable_http(
    world: World, http: httpx.AsyncClient, nc: Client, tokens: TokenService, tracebacks: _Tracebacks
) -> None:
    """What only the transport sees, through the gateway's ``/mcp``: tool arguments and whole
    bodies that are not JSON, not UTF-8, nested 5,000 levels, with integers of 5,000 digits or
    duplicate keys. Every one answered below 500: a JSON-RPC error, a typed tool error, or a
    result."""
    batch = Batch("edge-fuzz-mcp-http")
    token = mint(tokens, world.org, "end_user:alice", {"memory.read", "memory.write"})
    headers = {
        "Authorization": f"Bearer {token}",
        "X-Engram-Agent-Config": str(world.agent),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    bases = _tool_bases(world)
    sent: list[tuple[str, Case, bytes]] = []
    for tool in TOOLS:
        r = rng(f"edge-fuzz:mcp-http:{tool.name}")
        pool = [
            c for c in hostile.body_cases(bases[tool.name], r, extra_fields=list(tool.arguments.model_fields))
        ]
        for case in hostile.sample([c for c in pool if c.raw is not None], r, PER_OP // 3):
            sent.append((tool.name, case, _rpc(tool.name, case.raw or b"")))
    for label, raw in {
        **hostile.NOT_JSON,
        **{f"utf8-{k}": v for k, v in hostile.INVALID_UTF8.items()},
    }.items():
        sent.append(("<body>", Case("not-json", "<body>", label, raw=raw), raw))
    sent.append(
        (
            "<body>",
            Case("deep-nesting", "<body>", "5000", raw=b"[" * 5000 + b"]" * 5000),
            b"[" * 5000 + b"]" * 5000,
        )
    )

    async def send(tool: str, case: Case, body: bytes) -> None:
        began = time.monotonic()
        try:
            response = await http.post("/mcp", content=body, headers=headers, timeout=DEFAULT_DEADLINE_S * 2)
            reply = _rpc_reply(response)
        except httpx.HTTPError as exc:
            reply = exc
        batch.timed(time.monotonic() - began, f"mcp {tool} {case.cls} {case.where} {case.label}")
        batch.judge(f"POST /mcp {tool}", case, reply)

    await _bounded([lambda t=t, c=c, b=b: send(t, c, b) for t, c, b in sent])
    await _quiet(nc, world.token)
    batch.conclude(tracebacks.take(), tools=len(TOOLS))


def _tool_reply(result: CallToolResult) -> dict[str, Any]:
    """A tool's result as a reply: the structured error of a tool error (``UNTYPED`` when it has
    none), else the structured content."""
    code = code_of(result)
    if code == "OK":
        return dict(result.structured_content or {})
    if code == "UNTYPED":
        return {"error": text_of(result)[:200]}
    error: dict[str, Any] = (result.structured_content or {})["error"]
    return {"error": error}


# -- quiescence -----------------------------------------------------------------------------------


async def _quiet(nc: Client, token: str) -> None:
    """Wait until no durable consumer has a message pending or unacknowledged (what the deployment's
    operator sees in ``engram.ops.lag``); fail naming the ones that never emptied."""

    async def missing() -> list[str]:
        reply = await request(nc, OPS_LAG.subject, {}, token)
        assert "error" not in reply, reply
        return [
            f"{c['stream']}/{c['durable']}: {c['num_pending']} pending, {c['num_ack_pending']} unacked"
            for c in reply["consumers"]
            if c["num_pending"] or c["num_ack_pending"]
        ]

    await until_nothing_missing(missing, what="every consumer quiet", timeout=120, interval=0.25)


def test_the_cases_are_reproducible_and_cover_every_class() -> None:
    """The same seed draws the same cases (a red run is replayed by running it again), every
    operation's draw holds every class its body allows, and the size cases weigh exactly the limit
    and one byte more."""
    w = World(UUID(int=1), UUID(int=2), "token", [str(UUID(int=3))])
    bases = _bases(w)
    for op in OPERATIONS:
        first, second = (
            hostile.sample(_pool(op, bases[op.name], rng(f"x:{op.name}")), rng(f"x:{op.name}"), PER_OP)
            for _ in range(2)
        )
        assert [c.encoded() for c in first] == [c.encoded() for c in second]
        classes = {c.cls for c in first}
        assert {"invalid-utf8", "not-json", "deep-nesting", "size-limit"} <= classes, op.name
        if op.request.model_fields:
            assert {"json-type", "text", "duplicate-key"} <= classes, op.name
        sized = {c.expect: len(c.encoded()) for c in first if c.expect}
        assert sized == {"within-limit": op.max_request_bytes, "PAYLOAD_TOO_LARGE": op.max_request_bytes + 1}
