"""The agent interfaces against a real ``engram up``, as the README shows them: ``engram mcp`` over
stdio with the data dir (its connection.json supplies NATS, identity and agent config) and the
agent's own token in ``ENGRAM_TOKEN``, and the README's LangGraph graph on the same connection file."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from tests.engram_up import ENGRAM, EngramUp, clean_env, cli, stack_dir
from tests.integration.test_readme import python_block
from tests.mcp_clients import ok
from tests.platform import eventually

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="process checks read /proc"),
]


async def test_engram_mcp_and_the_langgraph_store_on_engram_up() -> None:
    """An MCP client launching ``engram mcp --data-dir D`` with a read/write end-user token minted
    as the README says remembers and recalls through the running stack (and without a token,
    ``engram mcp`` refuses to start rather than act with the data dir's operator token); the
    README's LangGraph snippet remembers and recalls on the same stack."""
    with stack_dir() as root, EngramUp(root / "data", root / "up.log") as up:
        await up.connection()  # up and serving
        data = str(root / "data")
        refused = subprocess.run(
            [str(ENGRAM), "mcp", "--data-dir", data],
            env=clean_env(),
            input="",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode != 0
        assert "ENGRAM_TOKEN" in refused.stderr
        rw = ["--perm", "memory.read", "--perm", "memory.write"]
        token = cli("token", "mint", "--kind", "end_user", "--id", "alice", *rw, "--data-dir", data).stdout
        params = StdioServerParameters(
            command=str(ENGRAM),
            args=["mcp", "--data-dir", data],
            env={**clean_env(), "ENGRAM_TOKEN": token.strip()},
        )
        async with Client(params, read_timeout_seconds=60) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            saved = ok(await client.call_tool("remember", {"text": "Releases are cut on Thursdays."}))
            recalled: dict[str, Any] = {}

            async def found() -> bool:
                # Semantic legs see a memory once embed has indexed it, moments after the save.
                recalled.update(ok(await client.call_tool("recall", {"cue": "when are releases cut"})))
                return saved["ids"][0] in [r["id"] for r in recalled["results"]]

            await eventually(found, timeout=60, what="the remembered memory in recall")
        assert {"remember", "recall", "expand", "forget", "list_memories", "memory_feedback"} <= names
        assert saved["ids"][0] in [r["id"] for r in recalled["results"]]
        assert "Releases are cut on Thursdays." in recalled["context"]

        namespace: dict[str, Any] = {}
        exec(compile(python_block("EngramStore"), "README.md", "exec"), namespace)  # noqa: S102
        assert await namespace["run"](str(root / "data" / "connection.json")) == "I prefer aisle seats"
        assert await up.stop() == 0
