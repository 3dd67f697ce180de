"""``engram backup`` and ``engram restore`` (services/backup.py does the work)."""

from __future__ import annotations

from pathlib import Path

import typer

from services.cli.output import console

__all__ = ["apply_ledger", "backup", "restore"]


def backup(
    out: Path = typer.Argument(..., help="A new directory to write the backup into."),
    data_dir: Path = typer.Option(Path(".engram"), "--data-dir", help="The stopped `engram up` data dir."),
) -> None:
    """Back up a stopped `engram up` data dir: the database (pg_dump), the vector store, the NATS
    streams, the credential registry, and a manifest with versions and checksums. The purge
    ledger stays outside the backup (docs/adr/0085-backup-restore-purge-ledger.md)."""
    import asyncio

    from services.backup import take_backup
    from shared.observability.logging import setup_logging

    setup_logging("WARNING", json=False)
    manifest = asyncio.run(take_backup(data_dir, out))
    size = sum(f["bytes"] for f in manifest.files.values())
    console.print(
        f"[green]backup written[/] to {out}: {len(manifest.files)} files, {size} bytes, "
        f"schema {manifest.schema_revision}, Postgres {manifest.postgres_version}",
        soft_wrap=True,
    )


def restore(
    backup_dir: Path = typer.Argument(..., help="A directory `engram backup` wrote."),
    data_dir: Path = typer.Option(Path(".engram"), "--data-dir", help="A fresh data dir to restore into."),
    ledger: list[Path] = typer.Option(
        [],
        "--ledger",
        help="The purge ledger that outlived the data (repeatable; the data dir's own is read too).",
    ),
    without_ledger: bool = typer.Option(
        False,
        "--without-ledger",
        help="No ledger survived: accept that memory erased after the backup comes back.",
    ),
) -> None:
    """Restore a backup into a fresh data dir, migrate it to this release's schema, and erase again
    everything the purge ledger says was erased after the backup — before anything answers.
    Then start it with `engram up --data-dir …`."""
    import asyncio

    from services.backup import restore_backup
    from shared.observability.logging import setup_logging
    from shared.runtime.settings import EngramSettings

    setup_logging("WARNING", json=False)
    done = asyncio.run(
        restore_backup(
            backup_dir, data_dir, ledgers=ledger, without_ledger=without_ledger, base=EngramSettings()
        )
    )
    console.print(
        f"[green]restored[/] {backup_dir} (taken {done.manifest.created_at.isoformat(timespec='seconds')}, "
        f"Engram {done.manifest.engram_version}) into {data_dir}; purge ledger: {done.ledger_records} "
        f"records, {done.reapplied} erasures made after the backup applied again "
        f"({done.entries_erased} entries erased)",
        soft_wrap=True,
    )


def apply_ledger(
    ledger: list[Path] = typer.Option(
        ..., "--ledger", help="The purge ledger that outlived the data (repeatable)."
    ),
) -> None:
    """After restoring ENGRAM_DATABASE_URL (and the vector store) by other means — pg_restore, a
    Qdrant snapshot — and before starting any service: erase again every purge and delete the
    restored database does not know of (the production variant of `engram restore`'s last step)."""
    import asyncio

    from services.backup import apply_ledger as apply
    from services.backup import read_ledgers
    from shared.observability.logging import setup_logging
    from shared.runtime.settings import EngramSettings

    settings = EngramSettings()
    if not settings.database_url:
        raise typer.BadParameter("set ENGRAM_DATABASE_URL")
    setup_logging("WARNING", json=False)
    missing = [str(p) for p in ledger if not p.is_file()]
    if missing:
        raise typer.BadParameter(f"no purge ledger at {', '.join(missing)}", param_hint="--ledger")
    done = asyncio.run(apply(settings, read_ledgers(ledger)))
    console.print(
        f"[green]purge ledger applied[/]: {done.erasures} erasures made again "
        f"({len(done.entry_ids or [])} entries erased)",
        soft_wrap=True,
    )
