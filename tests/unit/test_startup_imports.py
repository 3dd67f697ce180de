"""What the ``engram`` commands import, read from ``python -X importtime`` of the command itself
(docs/adr/0092-commands-that-start-fast.md): ``engram --help`` nothing of the client or the server,
a command that only talks to a running deployment the thin client and nothing of the server, and
``engram mcp`` nothing of the server's storage, vectors or embedder. An import of such a module
put back at module level fails here."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.engram_up import clean_env

#: No command that only talks to a running deployment needs any of these, nor ``engram mcp``.
SERVER_ONLY = (
    "alembic",
    "asyncpg",
    "numpy",
    "onnxruntime",
    "psutil",
    "qdrant_client",
    "qdrant_edge",
    "sqlalchemy",
    "tokenizers",
    "shared.storage.db",
    "shared.embedded",
    "shared.runtime.settings",
    "shared.messaging.wire",
    "services.gateway",
    "services.runtime",
)
#: Nor these the commands that reach Engram through the thin client (``engram mcp`` serves with
#: the MCP SDK, which brings some of them).
NOT_FOR_THE_CLIENT = (
    *SERVER_ONLY,
    "httpx",
    "mcp",
    "mcp_types",
    "opentelemetry",
    "starlette",
    "uvicorn",
    "shared",
    "services.mcp",
)
#: ``engram --help`` loads neither the client nor NATS.
NOT_FOR_HELP = (*NOT_FOR_THE_CLIENT, "nats", "engram_client.client", "engram_client.contracts.operations")

UNREACHABLE_NATS = "nats://127.0.0.1:1"
AGENT = "00000000-0000-0000-0000-000000000001"


def imported(stderr: str) -> set[str]:
    """The modules ``python -X importtime`` reports in ``stderr``."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    } - {"imported package"}


def offending(modules: Iterable[str], banned: Iterable[str]) -> list[str]:
    return sorted(m for m in modules for b in banned if m == b or m.startswith(f"{b}."))


def run_command(args: list[str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "services.cli.main", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )
    modules = imported(done.stderr)
    assert "services.cli.errors" in modules, done.stderr[-2000:]  # the command ran (as __main__)
    return modules


def test_help_loads_no_client_and_no_server() -> None:
    modules = run_command(["--help"])
    assert offending(modules, NOT_FOR_HELP) == []


@pytest.mark.parametrize(
    "args",
    [
        ["config", "get", "--agent-config", AGENT],
        ["recall", "a cue", "--agent-config", AGENT],
        ["audit", "verify"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_command_that_talks_to_engram_loads_only_the_thin_client(args: list[str], tmp_path: Path) -> None:
    """Run against a NATS that is not there: the command imports what it needs, fails to connect
    and reports it — the error report's imports included."""
    modules = run_command(
        [*args, "--nats-url", UNREACHABLE_NATS, "--token", "t", "--data-dir", str(tmp_path)]
    )
    assert "engram_client.client" in modules  # it got as far as the client
    assert offending(modules, NOT_FOR_THE_CLIENT) == []


def test_engram_mcp_loads_nothing_of_the_server(tmp_path: Path) -> None:
    """The whole of ``engram mcp`` up to its NATS connection (to one that is not there: nats-py
    retries, so the command is stopped once it says so — its imports are done by then)."""
    env = {
        **clean_env(),
        "ENGRAM_TOKEN": "t",
        "ENGRAM_NATS_URL": UNREACHABLE_NATS,
        "ENGRAM_AGENT_CONFIG_ID": AGENT,
    }
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "services.cli.main", "mcp", "--data-dir", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    connecting = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "NATS connection to" in line or "UNAVAILABLE" in line:
                connecting.set()
        connecting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert connecting.wait(120), "".join(lines)[-2000:]
    finally:
        proc.kill()
        proc.wait(30)
        reader.join(30)
    modules = imported("".join(lines))
    assert "services.mcp.server" in modules, "".join(lines)[-2000:]  # it got as far as serving
    assert offending(modules, SERVER_ONLY) == []
    assert proc.stdout is not None
    assert proc.stdout.read() == ""  # nothing on the MCP channel: no initialize was asked
