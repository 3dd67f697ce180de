"""Taking and restoring a backup of an ``engram up`` data dir (``shared.embedded.backup`` holds the format;
decision record 0085 the why).

Restore brings the backup into a fresh data dir, migrates its database forward to this code's
schema, and then — before anything can answer — applies the purge ledger: every erasure the
restored database does not know of (made after the backup) is made again, rows and vectors."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from sqlalchemy import text

from contracts.errors import InvalidRequest
from shared.adapters.vectors.edge_lock import exclusive_edge_store
from shared.embedded.backup import (
    DUMP,
    Manifest,
    copy_parts,
    refuse_if_running,
    run_pg_tool,
    verify_backup,
    write_manifest,
)
from shared.embedded.postgres import EmbeddedPostgres
from shared.runtime.settings import EngramSettings
from shared.storage.db.engine import Database, known_revision, migrate
from shared.storage.purge_ledger import LedgerRecord, PurgeLedger, Reapplied, reapply

__all__ = ["Restored", "apply_ledger", "read_ledgers", "restore_backup", "take_backup"]


async def _describe(url: str) -> tuple[str | None, str]:
    """The database's Alembic revision and the server's version."""
    db = Database(url, pool_size=1)
    try:
        async with db.read() as session:
            revision = (await session.execute(text("SELECT version_num FROM alembic_version"))).scalar()
            server = (await session.execute(text("SHOW server_version"))).scalar_one()
    finally:
        await db.close()
    return revision, str(server)


def _edge_locks(data_dir: Path, held: contextlib.ExitStack) -> None:
    """Hold every Qdrant Edge store of the data dir: no service may open one meanwhile."""
    vectors = data_dir / "vectors"
    if vectors.is_dir():
        for store in sorted(p for p in vectors.iterdir() if p.is_dir()):
            held.enter_context(exclusive_edge_store(store))


async def take_backup(data_dir: Path, out: Path) -> Manifest:
    """Back up the stopped stack of ``data_dir`` into the new directory ``out``."""
    data_dir = data_dir.resolve()  # noqa: ASYNC240 (a command's one task: nothing else waits on the loop)
    if not (data_dir / "postgres").is_dir():
        raise InvalidRequest(f"{data_dir} holds no embedded database: is it an `engram up` data dir?")
    if out.exists():  # noqa: ASYNC240 (as above)
        raise InvalidRequest(f"{out} exists: a backup goes into a new directory")
    refuse_if_running(data_dir)
    # Written beside, renamed when whole: `out` is either a complete backup or absent.
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    with contextlib.ExitStack() as held:
        _edge_locks(data_dir, held)
        postgres = EmbeddedPostgres(data_dir)
        url = await postgres.start()
        try:
            revision, server = await _describe(url)
            run_pg_tool("pg_dump", "--format=custom", "--no-owner", f"--file={partial / DUMP}", url)
        finally:
            await postgres.stop()
        copy_parts(data_dir, partial)
    manifest = write_manifest(partial, schema_revision=revision, postgres_version=server)
    partial.rename(out)
    return manifest


@dataclass
class Restored:
    manifest: Manifest
    #: ledger records applied again (erasures made after the backup), and what they erased.
    reapplied: int
    entries_erased: int
    ledger_records: int


def read_ledgers(paths: Iterable[Path]) -> list[LedgerRecord]:
    """The records of every ledger, once each, oldest first."""
    seen: dict[str, LedgerRecord] = {}
    for path in paths:
        for record in PurgeLedger(path).read():
            seen.setdefault(str(record.id), record)
    return sorted(seen.values(), key=lambda r: r.erased_at)


async def restore_backup(
    backup: Path,
    data_dir: Path,
    *,
    ledgers: list[Path],
    without_ledger: bool = False,
    base: EngramSettings | None = None,
) -> Restored:
    """Restore ``backup`` into the fresh ``data_dir`` and apply the purge ledger(s): the data
    dir's own (``ENGRAM_PURGE_LEDGER``, else in the data dir) and each of ``ledgers``."""
    data_dir = data_dir.resolve()  # noqa: ASYNC240 (a command's one task: nothing else waits on the loop)
    if (data_dir / "postgres").exists():
        raise InvalidRequest(f"{data_dir} already holds a database: restore into a fresh data dir")
    settings = (base or EngramSettings()).model_copy(update={"data_dir": data_dir})
    own = settings.purge_ledger_path()
    sources = [own, *ledgers]
    missing = [str(p) for p in ledgers if not p.is_file()]
    if missing:
        raise InvalidRequest(f"no purge ledger at {', '.join(missing)}")
    if not any(p.is_file() for p in sources) and not without_ledger:
        raise InvalidRequest(
            f"no purge ledger (looked at {own}): give --ledger PATH, the ledger that outlived the data, "
            "or --without-ledger to accept that memory erased after the backup comes back"
        )
    manifest = verify_backup(backup)
    if not known_revision(manifest.schema_revision):
        raise InvalidRequest(
            f"the backup's schema ({manifest.schema_revision}, Engram {manifest.engram_version}) is newer "
            "than this Engram's: migrations only go forward, so restore it with that release or a newer one"
        )
    records = read_ledgers(sources)
    copy_parts(backup, data_dir)
    postgres = EmbeddedPostgres(data_dir)
    url = await postgres.start()
    try:
        run_pg_tool(
            "pg_restore",
            "--no-owner",
            "--single-transaction",
            "--exit-on-error",
            "-d",
            url,
            str(backup / DUMP),
        )
        await migrate(url)  # a backup of an older release is upgraded here, forward only
        done = await apply_ledger(settings.model_copy(update={"database_url": url}), records)
    finally:
        await postgres.stop()
    return Restored(
        manifest=manifest,
        reapplied=done.erasures,
        entries_erased=len(done.entry_ids or []),
        ledger_records=len(records),
    )


async def apply_ledger(settings: EngramSettings, records: list[LedgerRecord]) -> Reapplied:
    """Erase again, in the database at ``settings.database_url`` and its vector store, every
    ledger record it has no tombstone of, then carry the whole ledger on into the deployment's
    own (``ENGRAM_PURGE_LEDGER``): a later restore needs it too. Run before anything answers."""
    db = Database(settings.database_url, pool_size=2)
    try:
        done = await reapply(db, records)
    finally:
        await db.close()
    own = PurgeLedger(settings.purge_ledger_path())
    kept = {r.id for r in own.read()}
    own.append(r for r in records if r.id not in kept)
    if done.entry_ids:
        await _drop_vectors(settings, done.entry_ids)
    return done


async def _drop_vectors(settings: EngramSettings, entry_ids: list[UUID]) -> None:
    """Delete the re-erased entries' vectors from the restored vector store (the queued
    ``memory.purged`` would too, but only once embed runs: recall must not find them first)."""
    from services.runtime import build_embedder, build_vector_index

    index = build_vector_index(settings, build_embedder(settings))
    if index is None:
        return
    try:
        await index.delete(entry_ids)
    finally:
        await index.close()
