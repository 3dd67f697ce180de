"""``Database.read()`` runs its statements outside a transaction (no BEGIN/ROLLBACK round trips
around recall's queries), ``transaction()`` inside one, on real Postgres."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from shared.storage.db.engine import Database

pytestmark = pytest.mark.integration


async def _in_transaction(session: AsyncSession) -> bool:
    await session.execute(text("SELECT 1"))
    raw = await (await session.connection()).get_raw_connection()
    return bool(raw.driver_connection.is_in_transaction())  # type: ignore[union-attr]


async def test_reads_run_outside_a_transaction_and_writes_inside_one(db: Database) -> None:
    async with db.read() as session:
        assert not await _in_transaction(session)
    async with db.transaction() as session:
        assert await _in_transaction(session)
    # The pool hands the same connections to both: a read after a transaction is still outside one.
    async with db.read() as session:
        assert not await _in_transaction(session)
