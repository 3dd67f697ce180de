"""A backup says what it is and proves it is whole (decision record 0085): restore refuses one whose
manifest is missing, of another format, or whose files were damaged, removed or added."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.errors import InvalidRequest
from shared.embedded.backup import BACKUP_FORMAT, copy_parts, verify_backup, write_manifest


def _backup(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "vectors" / "engram_x").mkdir(parents=True)
    (data / "vectors" / "engram_x" / "manifest.json").write_text("{}")  # a store's own manifest
    (data / "vectors" / "engram_x.lock").write_text("123")  # a lock: never copied
    (data / "nats" / "jetstream" / "stream").mkdir(parents=True)
    (data / "nats" / "jetstream" / "stream" / "1.blk").write_bytes(b"\x00" * 64)
    (data / "nats" / "nats-server.log").write_text("not backed up")
    (data / "dev-identity.json").write_text("{}")
    (data / "purge-ledger.jsonl").write_text("{}\n")  # outside every backup
    backup = tmp_path / "backup"
    backup.mkdir()
    copy_parts(data, backup)
    (backup / "postgres.dump").write_bytes(b"PGDMP")
    write_manifest(backup, schema_revision="0008", postgres_version="18.1")
    return backup


def test_a_whole_backup_verifies_and_lists_what_it_holds(tmp_path: Path) -> None:
    manifest = verify_backup(_backup(tmp_path))
    assert manifest.format == BACKUP_FORMAT
    assert manifest.schema_revision == "0008"
    assert sorted(manifest.files) == [
        "dev-identity.json",
        "nats/jetstream/stream/1.blk",
        "postgres.dump",
        "vectors/engram_x/manifest.json",
    ]
    assert all(len(f["sha256"]) == 64 for f in manifest.files.values())


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: (b / "postgres.dump").write_bytes(b"PGDMX"), "checksum"),
        (lambda b: (b / "nats/jetstream/stream/1.blk").unlink(), "missing"),
        (lambda b: (b / "vectors/engram_x/extra").write_text("x"), "does not list"),
        (lambda b: (b / "manifest.json").unlink(), "no complete backup"),
        (
            lambda b: (b / "manifest.json").write_text(
                json.dumps({**json.loads((b / "manifest.json").read_text()), "format": 99})
            ),
            "format 99",
        ),
    ],
    ids=["altered", "removed", "added", "no-manifest", "newer-format"],
)
def test_a_damaged_backup_is_refused(tmp_path: Path, damage: object, message: str) -> None:
    backup = _backup(tmp_path)
    damage(backup)  # type: ignore[operator]
    with pytest.raises(InvalidRequest, match=message):
        verify_backup(backup)


def test_sparse_vector_files_stay_sparse_and_identical(tmp_path: Path) -> None:
    """Qdrant Edge preallocates sparse segments: the copy keeps the holes and every byte."""
    data = tmp_path / "data"
    segment = data / "vectors" / "engram_x" / "segment.bin"
    segment.parent.mkdir(parents=True)
    with segment.open("wb") as out:
        out.write(b"head")
        out.seek(64 * 1024 * 1024)
        out.write(b"tail")
    if segment.stat().st_blocks * 512 > 1024 * 1024:
        pytest.skip("this filesystem does not keep holes")
    copy_parts(data, tmp_path / "backup")
    copied = tmp_path / "backup" / "vectors" / "engram_x" / "segment.bin"
    assert copied.read_bytes() == segment.read_bytes()
    assert copied.stat().st_blocks * 512 < 1024 * 1024  # not 64 MB of written zeros
