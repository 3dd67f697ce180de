"""``EngramClient``: a small async client for platform teams (publish sessions, save memories,
read and change memory config, query and verify the audit log).

It is a convenience: everything it does is plain JSON over NATS with an ``Authorization``
header, so any language can do the same (see the README).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, TypeVar
from uuid import UUID

from nats.aio.client import Client
from pydantic import BaseModel

from contracts import operations as ops
from contracts.config import MemoryConfig
from contracts.errors import error_for_code
from contracts.events import SessionEnded
from contracts.governance import GetReply, ManageReply, Page, PruneReply, PurgeReceipt
from contracts.nats_connect import Refusals, refusal_raised
from contracts.operations import Operation
from contracts.ops import DeadLetterPage, LagReply
from contracts.recall import ExpandReply, FeedbackReply, RecallReply
from contracts.requests import (
    Accepted,
    AuditQueryReply,
    AuditVerifyReply,
    ConfigReply,
    SaveEntry,
    SaveOutcome,
    SessionAccepted,
)

__all__ = ["EngramClient"]

Rep = TypeVar("Rep", bound=BaseModel)


class EngramClient:
    """``async with EngramClient.connect(url, token) as engram: await engram.publish_session(...)``"""

    def __init__(
        self, nc: Client, token: str, *, timeout: float = 5.0, owns_connection: bool = False
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._token = token
        self._timeout = timeout
        self._owns = owns_connection
        #: How this client's own connection (``connect``) learns that NATS refused its identity.
        self._refusals: Refusals | None = None

    @classmethod
    # The timeout is the per-request default, not a deadline for this call.
    async def connect(
        cls,
        url: str,
        token: str,
        *,
        timeout: float = 5.0,  # noqa: ASYNC109
        inbox_prefix: str = "_INBOX",
        **nats_options: Any,
    ) -> EngramClient:
        """``inbox_prefix``: where replies come back (a NATS identity may receive only under its
        own); ``nats_options`` go to ``nats.connect`` as they are, e.g. the NATS identity from
        ``contracts.connection.ConnectionInfo.nats_options()``.

        An identity NATS refuses raises :class:`~contracts.errors.Unauthenticated` at the first
        refusal (nats-py alone would retry for minutes); so does every request once the server
        has refused an open connection's identity (revoked or rotated away)."""
        refusals = Refusals(url, {"name": "engram-client", **nats_options})
        nc = await refusals.connect(inbox_prefix=inbox_prefix)
        client = cls(nc, token, timeout=timeout, owns_connection=True)
        client._refusals = refusals
        return client

    async def __aenter__(self) -> EngramClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns and not self._nc.is_closed:
            await self._nc.drain()

    def _headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", **extra}

    async def publish_session(self, session: SessionEnded | dict[str, Any]) -> int:
        """Publish ``engram.session.ended`` (JetStream: acknowledged once stored, checked after);
        returns the stream sequence. Publishing the same ``event_id`` again is a no-op in effect:
        ingest takes each organization's event once, after verifying the token. No Nats-Msg-Id
        is sent — JetStream would drop this session if anyone had published that id first."""
        model = session if isinstance(session, SessionEnded) else SessionEnded.model_validate(session)
        with refusal_raised(self._refusals):
            ack = await self._js.publish(
                ops.SESSION_ENDED.subject, model.model_dump_json().encode(), headers=self._headers()
            )
        return int(ack.seq)

    async def submit_session(self, session: SessionEnded | dict[str, Any]) -> SessionAccepted:
        """``engram.session.submit``: the session checked before it is stored — a token or tenancy
        that does not pass is raised here (``UNAUTHENTICATED``, ``FORBIDDEN``) rather than
        dead-lettered — and ``duplicate`` when this organization's ``event_id`` was taken before."""
        model = session if isinstance(session, SessionEnded) else SessionEnded.model_validate(session)
        return await self._call(ops.SESSION_SUBMIT, model.model_dump(mode="json"))

    # nats-py takes a timeout per request; so does this thin wrapper.
    async def request(self, subject: str, payload: dict[str, Any], *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """One request-reply; a wire error is raised as its typed ``EngramError``."""
        with refusal_raised(self._refusals):
            reply = await self._nc.request(
                subject,
                json.dumps(payload, default=str).encode(),
                timeout=timeout or self._timeout,
                headers=self._headers(),
            )
        data = json.loads(reply.data)
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            err = data["error"]
            raise error_for_code(str(err.get("code")), str(err.get("message")), err.get("details"))
        return data

    async def _call(
        self,
        op: Operation[Any, Rep],
        fields: dict[str, Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Rep:
        """One operation of the table: ``fields`` validated as its request model (a bad field is
        raised here, before anything is sent), its reply model out (the table's types tie each
        method below to its operation; mypy checks the replies)."""
        payload = op.request.model_validate(fields).model_dump(mode="json", exclude_none=True)
        data = await self.request(op.subject, payload, timeout=timeout or op.timeout_s)
        return op.parse_reply(data)

    async def save(
        self,
        agent_config_id: UUID,
        entries: list[SaveEntry] | list[dict[str, Any]],
        *,
        session_id: str | None = None,
        principal: dict[str, Any] | None = None,
        wait: bool = False,
        request_id: UUID | None = None,
    ) -> Accepted | SaveOutcome:
        fields = {
            "agent_config_id": agent_config_id,
            "entries": entries,
            "wait": wait,
            "session_id": session_id,
            "principal": principal,
            "request_id": request_id,
        }
        # A waiting save answers after the save path ran: allow it more than a plain request.
        return await self._call(ops.MEMORY_SAVE, fields, timeout=(self._timeout * 3) if wait else None)

    async def recall(self, agent_config_id: UUID, **fields: Any) -> RecallReply:
        """``engram.recall``; ``fields`` are RecallRequest's (cue, strategy, top_k, format, ...)."""
        return await self._call(ops.RECALL, {"agent_config_id": agent_config_id, **fields})

    async def expand(self, agent_config_id: UUID, ids: list[UUID], **fields: Any) -> ExpandReply:
        return await self._call(ops.RECALL_EXPAND, {"agent_config_id": agent_config_id, "ids": ids, **fields})

    async def feedback(self, agent_config_id: UUID, *, success: bool, **fields: Any) -> FeedbackReply:
        request = {"agent_config_id": agent_config_id, "success": success, **fields}
        return await self._call(ops.MEMORY_FEEDBACK, request)

    # -- management (SPEC 7.1) --------------------------------------------------------------
    async def list_entries(self, agent_config_id: UUID, **fields: Any) -> Page:
        """One page of ``engram.memory.list``; pass ``page_token`` for the next."""
        return await self._call(ops.MEMORY_LIST, {"agent_config_id": agent_config_id, **fields})

    async def get_entry(self, agent_config_id: UUID, entry_id: UUID, **fields: Any) -> GetReply:
        request = {"agent_config_id": agent_config_id, "entry_id": entry_id, **fields}
        return await self._call(ops.MEMORY_GET, request)

    async def manage(self, agent_config_id: UUID, entry_id: UUID, op: str, **fields: Any) -> ManageReply:
        request = {"agent_config_id": agent_config_id, "entry_id": entry_id, "op": op, **fields}
        return await self._call(ops.MEMORY_MANAGE, request)

    async def delete(self, agent_config_id: UUID, entry_id: UUID, **fields: Any) -> PurgeReceipt:
        request = {"agent_config_id": agent_config_id, "entry_id": entry_id, **fields}
        return await self._call(ops.MEMORY_DELETE, request)

    async def purge(self, actor_ref: str, **fields: Any) -> PurgeReceipt:
        """Erase everything ``actor_ref`` has (``agent_config_id``, ``session_id`` narrow it)."""
        return await self._call(ops.MEMORY_PURGE, {"actor_ref": actor_ref, **fields})

    async def prune(self, agent_config_id: UUID, max_entries: int) -> PruneReply:
        request = {"agent_config_id": agent_config_id, "max_entries": max_entries}
        return await self._call(ops.MEMORY_PRUNE, request)

    async def export(self, actor_ref: str, **fields: Any) -> AsyncIterator[Page]:
        """Every page of ``engram.memory.export`` in order (each page re-authorized by Engram)."""
        token: str | None = None
        while True:
            page = await self._call(
                ops.MEMORY_EXPORT, {"actor_ref": actor_ref, **fields, "page_token": token}
            )
            yield page
            token = page.next_page_token
            if token is None:
                return

    async def get_config(self, agent_config_id: UUID) -> ConfigReply:
        return await self._call(ops.CONFIG_GET, {"agent_config_id": agent_config_id})

    async def put_config(self, agent_config_id: UUID, config: dict[str, Any]) -> ConfigReply:
        return await self._call(ops.CONFIG_PUT, {"agent_config_id": agent_config_id, "config": config})

    async def audit_query(
        self, *, kind: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> AuditQueryReply:
        request = {"kind": kind, "after_seq": after_seq, "limit": limit}
        return await self._call(ops.AUDIT_QUERY, request)

    async def audit_verify(self) -> AuditVerifyReply:
        return await self._call(ops.AUDIT_VERIFY, {})

    async def dead_letters(
        self, *, source: str | None = None, before_seq: int | None = None, limit: int = 50
    ) -> DeadLetterPage:
        """The organization's dead letters, newest first (operators only)."""
        request = {"source": source, "before_seq": before_seq, "limit": limit}
        return await self._call(ops.OPS_DEAD_LETTERS, request)

    async def lag(self) -> LagReply:
        """Stream message counts and each durable consumer's backlog (operators only)."""
        return await self._call(ops.OPS_LAG, {})


# MemoryConfig is re-exported for callers building configs with types.
_ = MemoryConfig
