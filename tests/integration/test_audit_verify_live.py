"""The audit chain verifies while it grows: appends committed during a check are newer records,
not tampering (the make-test flake where a session's rejection landed mid-verify)."""

from __future__ import annotations

import asyncio
from uuid import UUID

import pytest

from shared.storage import audit
from shared.storage.db.engine import Database

pytestmark = pytest.mark.integration


async def test_verify_is_ok_while_records_are_appended(db: Database, org: UUID) -> None:
    """Dozens of checks interleaved with appends in other transactions: every one is ok and the
    last one has seen every record."""
    appended = 0
    stop = asyncio.Event()

    async def appender() -> None:
        nonlocal appended
        while not stop.is_set():
            async with db.transaction() as s:
                await audit.append(s, org, [audit.AuditEntry(kind="memory.saved", details={"n": appended})])
            appended += 1
            await asyncio.sleep(0)

    writer = asyncio.create_task(appender())
    try:
        reports = []
        for _ in range(40):
            async with db.read() as s:
                reports.append(await audit.verify(s, org, chunk=3))
    finally:
        stop.set()
        await writer
    assert appended > 0
    assert [r for r in reports if not r.ok] == []
    async with db.read() as s:
        final = await audit.verify(s, org)
    assert (final.ok, final.checked) == (True, appended)
