"""The cluster workload: what a platform does to Engram all day, while faults are injected.

- sessions at a steady rate, each published until JetStream acknowledges it (the same session on
  every retry, as the README says: a retry whose first attempt was stored after all is a second
  copy in the stream, which ingest drops by its inbox — nothing here counts on JetStream's
  duplicate window);
- recalls and governance requests at steady rates, each outcome recorded with its time, so the
  failures during a fault (how many, for how long) and after recovery (must be none) are counted;
- part of it over the HTTP gateway, as a platform behind no load balancer would: recalls
  (``POST /v1/recall``) and every few sessions (``POST /v1/sessions``, retried until 202 with the
  same ``event_id``), each request to one gateway replica in turn and to the other on a connection
  error or a 503;
- sessions carry their phase's tag in every lesson they produce, so each fault's effects are
  counted apart: lessons lost, stored twice or reinforced wrongly, against what the deterministic
  built-in distiller derives from the acknowledged sessions (the fault-free reference).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import httpx
import nats.errors
from nats.aio.client import Client

from tests.platform import session_payload

OWNERS = [
    {"kind": "end_user", "id": "alice"},
    {"kind": "end_user", "id": "bob"},
    {"kind": "actor", "id": "carol"},
    {"kind": "none"},
]
#: A request unanswered after this long counts as failed (generous: CI machines are shared and busy;
#: a fault shows as errors and no-responders, which come at once).
REQUEST_TIMEOUT_S = 5.0
#: An HTTP request's bound: above the gateway's own NATS timeout (10 s), so its 503 arrives first.
HTTP_TIMEOUT_S = 15.0
#: A session is retried until acknowledged for at most this long (then the run fails).
PUBLISH_DEADLINE_S = 300.0


def tag(phase: int) -> str:
    """The phase's tag, in every lesson its sessions produce (``phase03``)."""
    return f"phase{phase:02d}"


def victim(phase: int) -> dict[str, str]:
    """The end user whose memory is purged during ``phase``."""
    return {"kind": "end_user", "id": f"victim-{phase:02d}"}


def session_for(org: UUID, agent: UUID, i: int, phase: int, owner: dict[str, str]) -> dict[str, Any]:
    """A failed session whose failure repeats across sessions (so lessons are reinforced), with
    a unique "remember" statement, tagged with its phase."""
    label = tag(phase)
    return session_payload(
        org,
        agent,
        principal=owner,
        session_id=f"{label}-s{i}",
        task=f"Task {i} in {label}",
        tool_trace=[
            {"tool": "search_kb", "input": {"q": f"topic {i}"}, "output": "3 hits"},
            {
                "tool": "deploy",
                "input": {"env": "staging"},
                "error": f"quota exceeded in region r{i % 5} {label}",
            },
        ],
        transcript=[
            {"role": "user", "content": f"Remember: ticket {i} of {label} must be closed by Friday."}
        ],
    )


@dataclass
class Outcome:
    at: float
    kind: str
    ok: bool
    error: str = ""

    @property
    def http(self) -> bool:
        return self.kind.startswith("http-")


@dataclass
class Workload:
    """Publishers, recallers and governance callers on one platform connection, and HTTP clients
    of the ``gateways`` (base URLs)."""

    nc: Client
    token: str
    org: UUID
    agent: UUID
    session_rate: float
    recall_rate: float
    governance_rate: float
    phase: int = 0
    acked: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    publish_retries: int = 0
    #: When each unacknowledged publish attempt was made (to time the publish outage of a fault).
    publish_failures: list[float] = field(default_factory=list)
    #: When each acknowledged publish attempt was made, and over which transport ("nats", "http").
    publish_acks: list[tuple[float, str]] = field(default_factory=list)
    gateways: list[str] = field(default_factory=list)
    http_recall_rate: float = 0.0
    #: Every n-th session goes through a gateway (0: none).
    http_session_every: int = 0
    #: HTTP requests sent to the other gateway replica after the first failed to answer.
    http_failovers: int = 0
    _http: httpx.AsyncClient | None = None
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _loops: list[asyncio.Task[None]] = field(default_factory=list)
    _sent: int = 0

    # -- sessions -----------------------------------------------------------------------------

    async def publish(self, payload: dict[str, Any], phase: int) -> None:
        """Until acknowledged: the same session retried across node failures."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PUBLISH_DEADLINE_S
        while True:
            at = time.monotonic()
            try:
                await self.nc.jetstream().publish(
                    "engram.session.ended",
                    json.dumps(payload).encode(),
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=REQUEST_TIMEOUT_S,
                )
                self.acked.setdefault(phase, []).append(payload)
                self.publish_acks.append((at, "nats"))
                return
            except (TimeoutError, nats.errors.Error) as exc:
                self.publish_retries += 1
                self.publish_failures.append(at)
                if loop.time() > deadline:
                    raise AssertionError(f"a session was not acknowledged in {PUBLISH_DEADLINE_S}s") from exc
                await asyncio.sleep(0.25)

    async def publish_http(self, payload: dict[str, Any], phase: int, n: int) -> None:
        """Until a gateway answers 202: retried with the same ``event_id`` (a 202 may have been
        lost with a killed replica; ingest answers the second ``duplicate``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PUBLISH_DEADLINE_S
        while True:
            at = time.monotonic()
            if await self.http("http-session", "/v1/sessions", payload, n) is not None:
                self.acked.setdefault(phase, []).append(payload)
                self.publish_acks.append((at, "http"))
                return
            self.publish_retries += 1
            self.publish_failures.append(at)
            if loop.time() > deadline:
                raise AssertionError(f"a session was not accepted over HTTP in {PUBLISH_DEADLINE_S}s")
            await asyncio.sleep(0.25)

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _sessions(self) -> None:
        while True:
            i = self._sent
            self._sent += 1
            payload = session_for(self.org, self.agent, i, self.phase, OWNERS[i % len(OWNERS)])
            if self.http_session_every and i % self.http_session_every == 0:
                self.spawn(self.publish_http(payload, self.phase, i))
            else:
                self.spawn(self.publish(payload, self.phase))
            await asyncio.sleep(1 / self.session_rate)

    # -- requests -----------------------------------------------------------------------------

    async def request(self, kind: str, subject: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """One request; its outcome (ok, or the error) is recorded. Returns the reply when ok."""
        at = time.monotonic()
        try:
            reply = await self.nc.request(
                subject,
                json.dumps(body).encode(),
                timeout=REQUEST_TIMEOUT_S,
                headers={"Authorization": f"Bearer {self.token}"},
            )
            data: dict[str, Any] = json.loads(reply.data)
        except (TimeoutError, nats.errors.Error) as exc:
            self.outcomes.append(Outcome(at, kind, False, type(exc).__name__))
            return None
        if "error" in data:
            self.outcomes.append(Outcome(at, kind, False, str(data["error"].get("code"))))
            return None
        self.outcomes.append(Outcome(at, kind, True))
        return data

    async def http(self, kind: str, path: str, body: dict[str, Any], n: int) -> dict[str, Any] | None:
        """One HTTP request, to gateway ``n mod replicas`` first and to the next on a connection
        error or a 503 (client-side failover); its outcome is recorded. Returns the body when 2xx.
        Any other status is the service's answer, recorded as a failure (the envelope's code)."""
        assert self._http is not None, "the workload is not started"
        at = time.monotonic()
        error = ""
        for attempt in range(len(self.gateways)):
            if attempt:
                self.http_failovers += 1
            base = self.gateways[(n + attempt) % len(self.gateways)]
            try:
                response = await self._http.post(
                    base + path, json=body, headers={"Authorization": f"Bearer {self.token}"}
                )
            except httpx.TransportError as exc:
                error = type(exc).__name__
                continue
            if response.is_success:
                self.outcomes.append(Outcome(at, kind, True))
                data: dict[str, Any] = response.json()
                return data
            error = f"{response.status_code}:{_code(response)}"
            if response.status_code != 503:
                break
        self.outcomes.append(Outcome(at, kind, False, error))
        return None

    def recall_body(self, owner: dict[str, str], n: int) -> dict[str, Any]:
        strategy = ("last_k", "hybrid", "semantic")[n % 3]
        body: dict[str, Any] = {"agent_config_id": str(self.agent), "principal": owner, "strategy": strategy}
        if strategy != "last_k":
            body["cue"] = "deploy quota exceeded"
        return body

    async def _recalls(self) -> None:
        n = 0
        while True:
            n += 1
            self.spawn(self.request("recall", "engram.recall", self.recall_body(OWNERS[n % 3], n)))
            await asyncio.sleep(1 / self.recall_rate)

    async def _http_recalls(self) -> None:
        n = 0
        while True:
            n += 1
            self.spawn(self.http("http-recall", "/v1/recall", self.recall_body(OWNERS[n % 3], n), n))
            await asyncio.sleep(1 / self.http_recall_rate)

    async def _governance(self) -> None:
        n = 0
        while True:
            n += 1
            if n % 2:
                self.spawn(
                    self.request(
                        "governance",
                        "engram.memory.list",
                        {"agent_config_id": str(self.agent), "actor_ref": "end_user:alice", "page_size": 5},
                    )
                )
            else:
                self.spawn(
                    self.request("governance", "engram.config.get", {"agent_config_id": str(self.agent)})
                )
            await asyncio.sleep(1 / self.governance_rate)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._sessions()),
            asyncio.create_task(self._recalls()),
            asyncio.create_task(self._governance()),
        ]
        if self.gateways:
            self._http = httpx.AsyncClient(timeout=HTTP_TIMEOUT_S)
            if self.http_recall_rate:
                self._loops.append(asyncio.create_task(self._http_recalls()))

    async def stop(self) -> None:
        """Stop producing; wait for every session in flight to be acknowledged."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        while self._tasks:
            await asyncio.gather(*list(self._tasks))
        if self._http is not None:
            await self._http.aclose()

    def failures(self, start: float, end: float, *, http: bool = False) -> list[Outcome]:
        """The failed requests (only the HTTP ones with ``http``) between ``start`` and ``end``."""
        return [o for o in self.outcomes if start <= o.at < end and not o.ok and (o.http or not http)]

    def count(self, start: float, end: float, *, http: bool = False) -> int:
        return sum(1 for o in self.outcomes if start <= o.at < end and (o.http or not http))


def _code(response: httpx.Response) -> str:
    """The SPEC 9 code of an error answer (the status alone when the body is no envelope)."""
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 180.0) -> None:
    """Wait on a condition (a bound, never a speed claim)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for: {what}")
        await asyncio.sleep(0.1)
