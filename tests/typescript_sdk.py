"""Where the TypeScript SDK (``clients/typescript``) is and whether Node can run it here, for the
tests that drive it (``tests/unit/test_typescript_generated.py``, ``tests/e2e/test_typescript_sdk.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

__all__ = ["NODE", "NPM", "PACKAGE", "needs_node", "require_packages"]

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"
NODE = shutil.which("node")
NPM = shutil.which("npm")

#: The only reason these tests skip: a machine without Node (CI installs it; see .ci/run).
needs_node = pytest.mark.skipif(
    NODE is None or NPM is None, reason="node and npm are not installed (Debian: apt-get install nodejs npm)"
)


def require_packages() -> None:
    """Fail, saying what to run, when Node is here but the SDK's packages are not installed."""
    if not (PACKAGE / "node_modules").is_dir():
        pytest.fail(f"{PACKAGE / 'node_modules'} is missing: run `make install` (npm ci from the lockfile)")
