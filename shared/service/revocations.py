"""Revocation reaches every service at once (docs/adr/0104-admin-api.md).

The admin API records a revoked token or a disabled organization in Postgres, applies it to its
own process's :class:`shared.security.auth.Revocations`, and announces it on ``engram.admin.revoked``
(core NATS, no queue group: every process hears it). Each process subscribes before it reads the
tables at start, so nothing revoked between the two is missed.
"""

from __future__ import annotations

import json
import logging
from uuid import UUID

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from sqlalchemy import select
from sqlmodel import col

from contracts import subjects as s
from shared.runtime.time import utcnow
from shared.security.auth import Revocations
from shared.storage.db.engine import Database
from shared.storage.db.models import Organization, RevokedToken

__all__ = ["announce", "follow", "load"]

log = logging.getLogger(__name__)


async def load(db: Database, revocations: Revocations) -> None:
    """Every disabled organization and every revoked token not yet expired."""
    async with db.read() as session:
        orgs = await session.execute(
            select(col(Organization.org_id)).where(col(Organization.disabled_at).is_not(None))
        )
        for (org_id,) in orgs:
            revocations.disable_org(org_id)
        tokens = await session.execute(
            select(col(RevokedToken.token_id)).where(
                col(RevokedToken.expires_at).is_(None) | (col(RevokedToken.expires_at) > utcnow())
            )
        )
        for (token_id,) in tokens:
            revocations.revoke_token(token_id)


async def follow(nc: Client, revocations: Revocations) -> Subscription:
    """Apply each announcement to ``revocations`` as it arrives."""

    async def on_revoked(msg: Msg) -> None:
        try:
            data = json.loads(msg.data)
            if org := data.get("org_disabled"):
                revocations.disable_org(UUID(str(org)))
            if token := data.get("token_id"):
                revocations.revoke_token(str(token))
        except (ValueError, TypeError, AttributeError):
            log.warning("ignored a malformed %s message", s.ADMIN_REVOKED)

    return await nc.subscribe(s.ADMIN_REVOKED, cb=on_revoked)


async def announce(
    nc: Client, revocations: Revocations, *, org_disabled: UUID | None = None, token_id: str | None = None
) -> None:
    """Refuse it in this process now, tell the others, and return once the server has the message."""
    if org_disabled is not None:
        revocations.disable_org(org_disabled)
    if token_id is not None:
        revocations.revoke_token(token_id)
    body = {"org_disabled": str(org_disabled) if org_disabled else None, "token_id": token_id}
    await nc.publish(s.ADMIN_REVOKED, json.dumps(body).encode())
    await nc.flush()
