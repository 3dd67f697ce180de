"""One process per Qdrant Edge store: a second process is refused with what to do instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.adapters.vectors.edge_lock import EdgeStoreInUse, exclusive_edge_store

REPO = Path(__file__).resolve().parents[2]
_OTHER = """
import sys
from pathlib import Path
from shared.adapters.vectors.edge_lock import EdgeStoreInUse, exclusive_edge_store
try:
    with exclusive_edge_store(Path(sys.argv[1])):
        print("acquired")
except EdgeStoreInUse as exc:
    print(exc)
    sys.exit(2)
"""


_HOLD = """
import sys
from pathlib import Path
from shared.adapters.vectors.edge_lock import exclusive_edge_store
with exclusive_edge_store(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def _other_process(store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _OTHER, str(store)], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_a_second_process_is_refused_while_the_first_holds_the_store(tmp_path: Path) -> None:
    """While one process holds the store another gets a clear refusal; after release it may open it."""
    store = tmp_path / "vectors" / "engram_hashing_384"
    with exclusive_edge_store(store):
        refused = _other_process(store)
        assert refused.returncode == 2
        assert "held by another process" in refused.stdout
        assert "engram serve embed recall" in refused.stdout
        assert "ENGRAM_VECTOR_STORE" in refused.stdout
        # The same process opening it twice is a bug too, and refused the same way.
        with pytest.raises(EdgeStoreInUse), exclusive_edge_store(store):
            pass
    assert _other_process(store).stdout.strip() == "acquired"


def test_the_lock_lives_beside_the_store_not_in_it(tmp_path: Path) -> None:
    """Edge refuses a store directory with foreign files, so the lock file sits next to it."""
    store = tmp_path / "engram_hashing_384"
    with exclusive_edge_store(store):
        assert (tmp_path / "engram_hashing_384.lock").exists()
        assert not store.exists()


def test_reindex_is_refused_while_a_service_holds_the_store(tmp_path: Path) -> None:
    """`engram reindex` on a Qdrant Edge store a running process holds stops before touching it."""
    from typer.testing import CliRunner

    from services.cli.main import app

    store = tmp_path.resolve() / "vectors" / "engram_hashing_384"
    env = {
        "ENGRAM_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "ENGRAM_DATA_DIR": str(tmp_path),
        "ENGRAM_EMBEDDER": "hashing-384",
        "ENGRAM_VECTOR_STORE": "",
    }
    # What `engram up` looks like to the OS: its argv ends in `engram up`.
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(store), "engram", "up"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        result = CliRunner().invoke(app, ["reindex", "--data-dir", str(tmp_path)], env=env)
    finally:
        holder.communicate("", timeout=60)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        f"UNAVAILABLE: the vector store is in use by a running `engram up` (pid {holder.pid}): stop it "
        "first (Ctrl-C), then run `engram reindex` (Qdrant Edge opens in one process only)"
    ]
