"""The TypeScript SDK's generated files (``clients/typescript/src/generated``) are what its
generator makes of the checked-in contracts: changing a contract without regenerating fails here."""

from __future__ import annotations

import subprocess

from tests.typescript_sdk import NODE, PACKAGE, needs_node, require_packages

pytestmark = needs_node


def test_generated_sdk_files_are_up_to_date() -> None:
    """``node scripts/generate.mjs --check`` finds the types, operation map and error classes
    equal to what contracts/openapi.json and contracts/operations.json generate."""
    require_packages()
    assert NODE is not None
    done = subprocess.run(
        [NODE, "scripts/generate.mjs", "--check"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr}{done.stdout}\nrun `make schema` and commit the result"
