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
from collections.abc import Awaitable
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
#: The kinds of the workload's recalls (over NATS, through a gateway).
RECALLS = ("recall", "http-recall")
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
    """One request or publish attempt: when it was issued, what it was, how it ended."""

    at: float
    kind: str
    ok: bool
    error: str = ""
    #: The gateway (base URL) that answered an HTTP request, or was tried last when none did.
    via: str = ""
    #: From issue to answer (or to giving up).
    seconds: float = 0.0

    @property
    def http(self) -> bool:
        return self.kind.startswith("http-")


@dataclass
class Publish:
    """One attempt to have a session acknowledged, over ``transport`` ("nats" or "http")."""

    at: float
    transport: str
    session_id: str
    ok: bool
    error: str = ""


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
    #: Every publish attempt, acknowledged or not (to time a fault's publish outage, and to tell
    #: which transport has not published since).
    publishes: list[Publish] = field(default_factory=list)
    gateways: list[str] = field(default_factory=list)
    http_recall_rate: float = 0.0
    #: Every n-th session goes through a gateway (0: none).
    http_session_every: int = 0
    #: HTTP requests sent to the other gateway replica after the first failed to answer.
    http_failovers: int = 0
    #: The share of the rates above that the workload runs at (set from the deployment's measured
    #: answer times: ``tests.cluster.scenario.fit_intensity``).
    intensity: float = 1.0
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
            except (TimeoutError, nats.errors.Error) as exc:
                self._unacknowledged(Publish(at, "nats", payload["session_id"], False, _error(exc)), deadline)
                await asyncio.sleep(0.25)
                continue
            self._acknowledged(Publish(at, "nats", payload["session_id"], True), payload, phase)
            return

    async def publish_http(self, payload: dict[str, Any], phase: int, n: int) -> None:
        """Until a gateway answers 202: retried with the same ``event_id`` (a 202 may have been
        lost with a killed replica; ingest answers the second ``duplicate``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PUBLISH_DEADLINE_S
        while True:
            outcome, answer = await self.http("http-session", "/v1/sessions", payload, n)
            attempt = Publish(outcome.at, "http", payload["session_id"], outcome.ok, outcome.error)
            if answer is not None:
                self._acknowledged(attempt, payload, phase)
                return
            self._unacknowledged(attempt, deadline)
            await asyncio.sleep(0.25)

    def _acknowledged(self, attempt: Publish, payload: dict[str, Any], phase: int) -> None:
        self.publishes.append(attempt)
        self.acked.setdefault(phase, []).append(payload)

    def _unacknowledged(self, attempt: Publish, deadline: float) -> None:
        self.publishes.append(attempt)
        self.publish_retries += 1
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"session {attempt.session_id} was not acknowledged over {attempt.transport} in "
                f"{PUBLISH_DEADLINE_S:.0f}s; the last attempt: {attempt.error}"
            )

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
            await asyncio.sleep(1 / (self.session_rate * self.intensity))

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
            self.outcomes.append(Outcome(at, kind, False, _error(exc), seconds=time.monotonic() - at))
            return None
        if "error" in data:
            error = str(data["error"].get("code"))
            self.outcomes.append(Outcome(at, kind, False, error, seconds=time.monotonic() - at))
            return None
        self.outcomes.append(Outcome(at, kind, True, seconds=time.monotonic() - at))
        return data

    async def http(
        self, kind: str, path: str, body: dict[str, Any], n: int
    ) -> tuple[Outcome, dict[str, Any] | None]:
        """One HTTP request, to gateway ``n mod replicas`` first and to the next on a connection
        error or a 503 (client-side failover); its outcome is recorded and returned, with the body
        when 2xx. Any other status is the service's answer, recorded as a failure (the envelope's
        code)."""
        assert self._http is not None, "the workload is not started"
        at = time.monotonic()
        error = ""
        base = ""
        for attempt in range(len(self.gateways)):
            if attempt:
                self.http_failovers += 1
            base = self.gateways[(n + attempt) % len(self.gateways)]
            try:
                response = await self._http.post(
                    base + path, json=body, headers={"Authorization": f"Bearer {self.token}"}
                )
            except httpx.TransportError as exc:
                error = _error(exc)
                continue
            if response.is_success:
                outcome = Outcome(at, kind, True, via=base, seconds=time.monotonic() - at)
                self.outcomes.append(outcome)
                data: dict[str, Any] = response.json()
                return outcome, data
            error = f"{response.status_code}:{_code(response)}"
            if response.status_code != 503:
                break
        outcome = Outcome(at, kind, False, error, via=base, seconds=time.monotonic() - at)
        self.outcomes.append(outcome)
        return outcome, None

    @property
    def recalls_per_s(self) -> float:
        """Recalls issued per second at full intensity (over NATS and HTTP)."""
        return self.recall_rate + (self.http_recall_rate if self.gateways else 0.0)

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
            await asyncio.sleep(1 / (self.recall_rate * self.intensity))

    async def _http_recalls(self) -> None:
        n = 0
        while True:
            n += 1
            self.spawn(self.http("http-recall", "/v1/recall", self.recall_body(OWNERS[n % 3], n), n))
            await asyncio.sleep(1 / (self.http_recall_rate * self.intensity))

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
            await asyncio.sleep(1 / (self.governance_rate * self.intensity))

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


class Purge:
    """A governance caller purging ``owner``, retrying across a fault until a receipt comes."""

    def __init__(self, nc: Client, token: str, agent: UUID, owner: dict[str, str]) -> None:
        self._nc = nc
        self._token = token
        self._body = {"agent_config_id": str(agent), "actor_ref": f"{owner['kind']}:{owner['id']}"}
        self.attempts = 0
        self.last_error = ""

    async def until_receipt(self) -> None:
        while True:
            self.attempts += 1
            try:
                reply = await self._nc.request(
                    "engram.memory.purge",
                    json.dumps(self._body).encode(),
                    timeout=REQUEST_TIMEOUT_S,
                    headers={"Authorization": f"Bearer {self._token}"},
                )
                answer = json.loads(reply.data)
                if "error" not in answer:
                    return
                self.last_error = str(answer["error"].get("code"))
            except (TimeoutError, nats.errors.Error) as exc:
                self.last_error = _error(exc)
            await asyncio.sleep(0.5)

    def status(self) -> str:
        """What the purge has seen so far (for a wait that times out)."""
        last = self.last_error or "in flight"
        return f"purge of {self._body['actor_ref']}: no receipt in {self.attempts} attempts; the last: {last}"


def _code(response: httpx.Response) -> str:
    """The SPEC 9 code of an error answer (the status alone when the body is no envelope)."""
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"


def _error(exc: BaseException) -> str:
    """An error as the fault table and a timed-out wait show it: its type, and its text if any."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
