"""The previous release's code, for the upgrade tests (tests/e2e/test_upgrade.py, and the rolling
upgrade of tests/cluster/scenario.py): a pinned commit of main, or ENGRAM_TEST_UPGRADE_FROM, as a
plain tree (``git archive``: no worktree registered, nothing of ours touched), run with this
environment's packages and its own code first on the path."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

__all__ = ["PREVIOUS", "REPO", "checkout", "previous_command"]

REPO = Path(__file__).resolve().parents[2]
#: The release upgraded from: a pinned commit of main (the code before backup/restore and the purge
#: ledger), or ENGRAM_TEST_UPGRADE_FROM (e.g. the previous release's tag).
PREVIOUS = os.environ.get("ENGRAM_TEST_UPGRADE_FROM", "de0a48b")


def checkout(revision: str, into: Path) -> Path | str:
    """The tree of ``revision`` under ``into``; or why there is none (a shallow clone)."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{revision}^{{commit}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        return f"{revision} is not in this clone's history (a shallow clone?): {found.stderr.strip()}"
    archive = into / "previous.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", revision], stdout=out, check=True)
    tree = into / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def previous_command(tree: Path) -> list[str]:
    """``engram`` of the previous release: its code first on the path, this environment's packages."""
    return [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(tree)!r}); from services.cli.main import app; app()",
    ]
