"""Memory configs in Postgres: read with defaults, create on first use, store new versions.

An agent config belongs to the organization that first configured or wrote to it; any later
use from another organization is refused, so a guessed agent config id never crosses tenants.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlmodel import col

from contracts.config import MemoryConfig, deep_merge, merge_config
from contracts.errors import Forbidden, InvalidRequest, NotFound
from shared.messaging.wire import validation_details
from shared.runtime.time import utcnow
from shared.storage.db.engine import Database
from shared.storage.db.models import MemoryConfigRow, MemoryConfigVersion, OrgSettings

__all__ = [
    "AgentConfigOwners",
    "claim_agent_config",
    "load_config",
    "org_memory_enabled",
    "put_config",
    "require_known_agent_config",
]


async def claim_agent_config(
    session: AsyncSession, org_id: UUID, agent_config_id: UUID, *, by: str | None = None
) -> tuple[MemoryConfig, bool]:
    """The agent config's current config, creating it with defaults on first use (SPEC 2: an
    agent config comes into being at its first write); True when this call created it.

    Raises ``FORBIDDEN`` when the agent config belongs to another organization.
    """
    now = utcnow()
    defaults = MemoryConfig().model_dump(mode="json")
    inserted = await session.execute(
        pg_insert(MemoryConfigRow)
        .values(
            agent_config_id=agent_config_id,
            org_id=org_id,
            version=1,
            config={},
            updated_at=now,
            updated_by=by,
        )
        .on_conflict_do_nothing()
        .returning(col(MemoryConfigRow.agent_config_id))
    )
    created = inserted.first() is not None
    if created:
        session.add(
            MemoryConfigVersion(
                agent_config_id=agent_config_id,
                version=1,
                org_id=org_id,
                config=defaults,
                created_at=now,
                created_by=by,
            )
        )
    config, _ = await load_config(session, org_id, agent_config_id)
    return config, created


class AgentConfigOwners:
    """Whose each agent config is, for ``shared.security.access.authorize``
    (``shared.security.access.AgentConfigs``): one primary-key read per request of an operation that checks
    it."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def check(self, org_id: UUID, agent_config_id: UUID, *, known: bool) -> None:
        async with self._db.read() as session:
            if known:
                await require_known_agent_config(session, org_id, agent_config_id)
            else:
                await load_config(session, org_id, agent_config_id)


async def require_known_agent_config(session: AsyncSession, org_id: UUID, agent_config_id: UUID) -> None:
    """``NOT_FOUND`` for an agent config the organization never wrote to nor configured: a read
    naming it is a typo or a wrong id, and answering "no memories" would hide that."""
    _, version = await load_config(session, org_id, agent_config_id)
    if version == 0:
        raise NotFound(
            "agent config not found: nothing was ever saved to it and no config was set",
            {"agent_config_id": str(agent_config_id)},
        )


async def load_config(session: AsyncSession, org_id: UUID, agent_config_id: UUID) -> tuple[MemoryConfig, int]:
    """The stored config (defaults if none yet) and its version (0 = never stored)."""
    row = (
        await session.execute(
            select(MemoryConfigRow).where(col(MemoryConfigRow.agent_config_id) == agent_config_id)
        )
    ).scalar_one_or_none()
    if row is None:
        return MemoryConfig(), 0
    if row.org_id != org_id:
        raise Forbidden("agent config belongs to another organization")
    # Stored configs hold only what was set; defaults fill the rest, so new defaults reach old rows.
    return merge_config(MemoryConfig(), row.config), row.version


async def put_config(
    session: AsyncSession, org_id: UUID, agent_config_id: UUID, patch: dict[str, Any], *, by: str
) -> tuple[MemoryConfig, int]:
    """Merge ``patch`` into the stored config, validate the whole, and store a new version."""
    row = (
        await session.execute(
            select(MemoryConfigRow)
            .where(col(MemoryConfigRow.agent_config_id) == agent_config_id)
            .with_for_update()
        )
    ).scalar_one_or_none()
    if row is not None and row.org_id != org_id:
        raise Forbidden("agent config belongs to another organization")
    stored: dict[str, Any] = dict(row.config) if row is not None else {}
    try:
        merged_patch = deep_merge(stored, patch)
        config = merge_config(MemoryConfig(), merged_patch, strict=True)
    except ValidationError as exc:
        raise InvalidRequest("invalid memory config", validation_details(exc)) from exc
    now = utcnow()
    version = (row.version if row is not None else 0) + 1
    if row is None:
        row = MemoryConfigRow(
            agent_config_id=agent_config_id,
            org_id=org_id,
            version=version,
            config=merged_patch,
            updated_at=now,
            updated_by=by,
        )
    else:
        row.version, row.config, row.updated_at, row.updated_by = version, merged_patch, now, by
    session.add(row)
    session.add(
        MemoryConfigVersion(
            agent_config_id=agent_config_id,
            version=version,
            org_id=org_id,
            config=config.model_dump(mode="json"),
            created_at=now,
            created_by=by,
        )
    )
    return config, version


async def org_memory_enabled(session: AsyncSession, org_id: UUID) -> bool:
    row = await session.get(OrgSettings, org_id)
    return True if row is None else row.memory_enabled
