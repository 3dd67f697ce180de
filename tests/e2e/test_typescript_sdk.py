"""The TypeScript SDK against a live ``engram up``: Node's own test runner (``npm test`` in
``clients/typescript``) calls every operation over NATS and over HTTP, provokes a typed error for
each SPEC 9 code a client can cause, and runs the README's TypeScript snippet as written."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.engram_up import EngramUp, stack_dir
from tests.typescript_sdk import NPM, PACKAGE, needs_node, require_packages

pytestmark = [pytest.mark.e2e, needs_node]

#: The build (tsc) and the suite; about 40 s on an idle machine, more when it is loaded.
NODE_SUITE_TIMEOUT_S = 300.0


async def test_typescript_sdk_suite_passes_against_engram_up() -> None:
    """``npm test`` exits 0 against a fresh ``engram up``, given its connection.json."""
    require_packages()
    assert NPM is not None
    with stack_dir() as scratch, EngramUp(scratch / "data", scratch / "engram-up.log") as up:
        await up.connection()
        env = {**os.environ, "ENGRAM_CONNECTION_FILE": str(scratch / "data" / "connection.json")}
        node = await asyncio.create_subprocess_exec(
            NPM,
            "test",
            cwd=PACKAGE,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(node.communicate(), NODE_SUITE_TIMEOUT_S)
        except TimeoutError:
            node.kill()
            out, _ = await node.communicate()
            up.fail(f"npm test still running after {NODE_SUITE_TIMEOUT_S}s; output so far:\n{out.decode()}")
        if node.returncode != 0:
            up.fail(f"npm test exited {node.returncode}:\n{out.decode()}")
