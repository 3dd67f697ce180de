"""``engram.webhooks.register|list|delete|replay``: an organization's webhooks, under its admin
permission (``memory.admin`` on an operator token not restricted to an agent config or session —
a webhook receives the whole organization's feed). Every change is audited (``webhook.*``; the
records hold the webhook's id and host, never its secret or its full URL, which may carry a
receiver's own token)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from urllib.parse import urlsplit
from uuid import UUID, uuid4

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from contracts.errors import InvalidRequest, NotFound
from contracts.feeds import (
    WebhookCreated,
    WebhookDelete,
    WebhookDeleted,
    WebhookInfo,
    WebhookList,
    WebhookPage,
    WebhookRegister,
    WebhookReplay,
    WebhookReplayed,
)
from services.governance_audit.webhooks.targets import check_target
from shared.runtime.time import utcnow
from shared.security.access import Caller
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import WEBHOOK_DELIVERIES as D
from shared.storage.db.models import WEBHOOKS as W

__all__ = ["MAX_WEBHOOKS", "Webhooks", "new_secret"]

#: Webhooks one organization may have (each is a copy of its feed to deliver).
MAX_WEBHOOKS = 20


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class Webhooks:
    """The operations' handlers; ``wake`` tells the delivery worker that deliveries are due."""

    def __init__(self, db: Database, *, allow_private: bool, wake: Callable[[], None]) -> None:
        self._db = db
        self._allow_private = allow_private
        #: Tell the delivery worker that deliveries are due (the fan-out calls it too).
        self.wake = wake

    async def register(self, caller: Caller, request: WebhookRegister) -> WebhookCreated:
        _require(caller)
        await check_target(request.url, allow_private=self._allow_private)
        webhook_id, secret, now = uuid4(), new_secret(), utcnow()
        async with self._db.transaction() as session:
            count = await session.scalar(
                select(func.count()).select_from(W).where(W.c.org_id == caller.org_id)
            )
            if (count or 0) >= MAX_WEBHOOKS:
                raise InvalidRequest(f"an organization has at most {MAX_WEBHOOKS} webhooks; delete one first")
            await session.execute(
                insert(W).values(
                    id=webhook_id,
                    org_id=caller.org_id,
                    url=request.url,
                    description=request.description,
                    events=request.events,
                    secret=secret,
                    created_at=now,
                )
            )
            await _audit(
                session, caller, "webhook.registered", webhook_id, host=urlsplit(request.url).hostname
            )
        return WebhookCreated(
            webhook_id=webhook_id,
            url=request.url,
            description=request.description,
            events=request.events,
            created_at=now,
            secret=secret,
        )

    async def list(self, caller: Caller, request: WebhookList) -> WebhookPage:
        _require(caller)
        counts = (
            select(D.c.webhook_id, D.c.state, func.count().label("n"))
            .where(D.c.org_id == caller.org_id)
            .group_by(D.c.webhook_id, D.c.state)
        )
        async with self._db.read() as session:
            hooks = (
                await session.execute(
                    select(W.c.id, W.c.url, W.c.description, W.c.events, W.c.created_at)
                    .where(W.c.org_id == caller.org_id)
                    .order_by(W.c.created_at)
                )
            ).all()
            by_state: dict[UUID, dict[str, int]] = {}
            for webhook_id, state, n in (await session.execute(counts)).all():
                by_state.setdefault(webhook_id, {})[state] = n
        return WebhookPage(
            webhooks=[
                WebhookInfo(
                    webhook_id=h.id,
                    url=h.url,
                    description=h.description,
                    events=h.events,
                    created_at=h.created_at,
                    **by_state.get(h.id, {}),
                )
                for h in hooks
            ]
        )

    async def delete(self, caller: Caller, request: WebhookDelete) -> WebhookDeleted:
        _require(caller)
        async with self._db.transaction() as session:
            await _own(session, caller, request.webhook_id)
            dropped = await session.scalar(
                select(func.count())
                .select_from(D)
                .where(D.c.webhook_id == request.webhook_id, D.c.state == "pending")
            )
            # Its deliveries go with it (ON DELETE CASCADE), its secret too.
            await session.execute(delete(W).where(W.c.id == request.webhook_id))
            await _audit(session, caller, "webhook.deleted", request.webhook_id)
        return WebhookDeleted(webhook_id=request.webhook_id, dropped=dropped or 0)

    async def replay(self, caller: Caller, request: WebhookReplay) -> WebhookReplayed:
        """Dead-lettered deliveries (or the named events', delivered ones too) start again from
        their first attempt, now."""
        _require(caller)
        which = D.c.state == "dead" if request.event_ids is None else D.c.event_id.in_(request.event_ids)
        async with self._db.transaction() as session:
            await _own(session, caller, request.webhook_id)
            result = await session.execute(
                update(D)
                .where(and_(D.c.webhook_id == request.webhook_id, which, D.c.state != "pending"))
                .values(state="pending", attempts=0, next_attempt_at=utcnow(), last_error=None)
            )
            replayed = int(getattr(result, "rowcount", 0) or 0)
            await _audit(session, caller, "webhook.replayed", request.webhook_id, count=replayed)
        if replayed:
            self.wake()
        return WebhookReplayed(webhook_id=request.webhook_id, replayed=replayed)


def _require(caller: Caller) -> None:
    caller.require_admin()
    caller.require_unrestricted("an organization's webhooks")


async def _own(session: AsyncSession, caller: Caller, webhook_id: UUID) -> None:
    """The webhook exists and is the caller's organization's (else NOT_FOUND, as for a missing one)."""
    found = await session.scalar(
        select(W.c.id).where(W.c.id == webhook_id, W.c.org_id == caller.org_id).with_for_update()
    )
    if found is None:
        raise NotFound("no such webhook")


async def _audit(
    session: AsyncSession, caller: Caller, kind: str, webhook_id: UUID, **details: object
) -> None:
    await audit.append(
        session,
        caller.org_id,
        [
            audit.AuditEntry(
                kind=kind,
                actor_ref=caller.ref,
                details={"webhook_id": str(webhook_id), **details, **caller.via},
            )
        ],
    )
