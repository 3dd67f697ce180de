"""The memory-entry table has one gateway (``shared.storage.entries``, docs/adr/0012-entry-gateway.md):
no production module outside it names the table — not its ``Table`` (``ENTRIES``), not its
model (``MemoryEntry``), not its name in SQL text. The schema (``shared/storage/db/models.py``) and the
migrations define it, so they name it too; nothing else does."""

from __future__ import annotations

import re
from pathlib import Path

from shared.storage.entries import ENTRY_COLUMNS, Entry

ROOT = Path(__file__).resolve().parents[2]
#: Where the table may be named: the gateway, the schema that defines it, the migrations.
ALLOWED = ("shared/storage/entries/", "shared/storage/db/models.py", "shared/storage/db/migrations/")
#: The table's names: ``MAX_ENTRIES`` or ``memory_entry_session_position`` (a sequence) are not.
NAMES = re.compile(r"\bENTRIES\b|\bMemoryEntry\b|\bmemory_entries\b")


def _naming(root: Path) -> list[str]:
    found = []
    for folder in ("services", "shared", "contracts"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(ALLOWED):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if NAMES.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_module_outside_the_gateway_names_the_entries_table() -> None:
    found = _naming(ROOT)
    assert found == [], "read and write entries through shared.storage.entries:\n" + "\n".join(found)


def test_the_scan_finds_each_way_of_naming_the_table(tmp_path: Path) -> None:
    """The scan is not blind: each name is found, in code and in SQL text alike."""
    (tmp_path / "services" / "x").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    (tmp_path / "contracts").mkdir()
    (tmp_path / "services" / "x" / "a.py").write_text(
        "from shared.storage.db.models import ENTRIES\nMAX_ENTRIES = 3\n"
    )
    (tmp_path / "shared" / "b.py").write_text('q = "SELECT id FROM memory_entries"\nseq = "memory_entry_x"\n')
    (tmp_path / "contracts" / "c.py").write_text("select(MemoryEntry)\n")
    assert [f.split(":")[0] for f in _naming(tmp_path)] == [
        "services/x/a.py",
        "shared/b.py",
        "contracts/c.py",
    ]


def test_an_entry_row_has_every_column_read() -> None:
    """:class:`Entry` is built from rows of ``ENTRY_COLUMNS`` by name: the two stay one list."""
    assert set(Entry._fields) == {c.name for c in ENTRY_COLUMNS}
    assert len(Entry._fields) == len(ENTRY_COLUMNS)
