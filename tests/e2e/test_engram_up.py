"""`engram up` (what `make run` starts) as a real subprocess: embedded nats-server and Postgres,
raw nats-py in and out, a clean SIGTERM shutdown, a restart on the same data, and the demo."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import nats
import pytest
from typer.testing import CliRunner

from contracts.common import Principal
from contracts.config import MemoryConfig
from contracts.connection import ConnectionInfo
from services.cli.main import app
from shared.embedded.stack import load_dev_identity
from shared.security.auth import TokenService
from tests.engram_up import (
    START_TIMEOUT_S,
    EngramUp,
    accepts,
    alive,
    cli,
    live_pids_mentioning,
    postmaster_pid,
    stack_dir,
)
from tests.platform import publish_session, request, session_payload

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="process checks read /proc"),
]

EVENT_TIMEOUT_S = 30.0
DEMO_TIMEOUT_S = 120.0


def _summary_row(out: str, label: str) -> str:
    """The value cell of one row of the demo's summary table."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip(" │|").split("│")]
        if len(cells) == 2 and cells[0] == label:
            return cells[1]
    raise AssertionError(f"no {label!r} row in the demo output:\n{out}")


def _assert_fully_stopped(data_dir: Path, nats_url: str, postmaster: int | None) -> None:
    assert not (data_dir / "connection.json").exists(), "connection.json left behind"
    assert not accepts(nats_url), f"{nats_url} still accepts connections"
    assert live_pids_mentioning(str(data_dir)) == [], "processes of the data dir still running"
    assert postmaster is not None, "no postmaster.pid while running"
    assert not alive(postmaster), f"embedded Postgres (pid {postmaster}) still running"
    assert not (data_dir / "postgres" / "postmaster.pid").exists(), "Postgres did not shut down cleanly"


# --- the tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """One data dir for the first run and the restart."""
    with stack_dir() as path:
        yield path


@pytest.fixture(scope="module")
def first_run() -> dict[str, Any]:
    """What the first run leaves for the restart test."""
    return {}


async def test_engram_up_serves_sessions_and_config_then_stops_cleanly(
    shared_dir: Path, first_run: dict[str, Any]
) -> None:
    """engram up on embedded NATS+Postgres turns a session published by the development client
    (its NATS identity from connection.json) into recallable memory, answers config.get, serves
    the CLI, logs no NATS permission violation, and on SIGTERM exits 0, removes connection.json
    and leaves no servers running."""
    data_dir = shared_dir / "data"
    with EngramUp(data_dir, shared_dir / "run1.log") as up:
        info = await up.connection()
        keys = {
            "nats_url",
            "nats_nkey_seed",
            "nats_inbox_prefix",
            "http_url",
            "token",
            "org_id",
            "agent_config_id",
        }
        assert keys | {"database_url"} <= set(info)
        assert stat.S_IMODE((data_dir / "connection.json").stat().st_mode) == 0o600
        org, agent, token = UUID(info["org_id"]), UUID(info["agent_config_id"]), info["token"]
        postmaster = postmaster_pid(data_dir)
        assert postmaster is not None
        assert alive(postmaster)
        assert live_pids_mentioning(str(data_dir)), "the checks below would prove nothing"

        nc = await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())
        try:
            trace = [
                {"tool": "search_kb", "input": {"q": "quota"}, "output": "2 hits"},
                {"tool": "deploy", "input": {"env": "staging"}, "error": "quota exceeded in region eu-1"},
            ]
            payload = session_payload(org, agent, status="failed", steps=3, tool_trace=trace)
            await publish_session(nc, payload, token)  # Authorization, as the README publishes

            asked = {"agent_config_id": str(agent), "principal": payload["principal"]}
            recalled: list[dict[str, Any]] = []
            deadline = time.monotonic() + EVENT_TIMEOUT_S
            while not recalled and time.monotonic() < deadline:
                reply = await request(nc, "engram.recall", asked, token)
                assert "error" not in reply, reply
                recalled = reply["results"]
                if not recalled:
                    await asyncio.sleep(0.2)
            if not recalled:
                up.fail(f"nothing recallable for org {org} within {EVENT_TIMEOUT_S}s")
            assert {r["session_id"] for r in recalled} == {payload["session_id"]}
            assert any("quota exceeded" in r["text"] for r in recalled), recalled

            # The same memory over the HTTP API, printed and in connection.json.
            assert f"HTTP API at {info['http_url']}" in up.output()
            async with httpx.AsyncClient(base_url=info["http_url"], timeout=30) as http:
                assert (await http.get("/readyz")).status_code == 200
                over_http = await http.post(
                    "/v1/recall", json=asked, headers={"Authorization": f"Bearer {token}"}
                )
                assert over_http.status_code == 200, over_http.text
                assert {r["id"] for r in over_http.json()["results"]} == {r["id"] for r in recalled}

            reply = await request(nc, "engram.config.get", {"agent_config_id": str(agent)}, token)
            assert "error" not in reply, reply
            assert reply["agent_config_id"] == str(agent)
            assert reply["version"] == 1  # created with defaults by the first save
            assert reply["config"] == MemoryConfig().model_dump(mode="json")

            # The operator's CLI against the running stack: export as JSON Lines, tail the audit.
            exported = await asyncio.to_thread(
                cli, "export", "--actor", "end_user:alice", "--data-dir", str(data_dir)
            )
            lines = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
            assert lines, exported.stderr
            assert all(e["owner"] == {"kind": "end_user", "id": "alice"} for e in lines)
            assert {e["session_id"] for e in lines} == {payload["session_id"]}
            tail = await asyncio.to_thread(
                cli, "audit", "tail", "--from-start", "--limit", "3", "--data-dir", str(data_dir)
            )
            assert "memory.saved" in tail.stdout or "distill.completed" in tail.stdout, tail.stdout
            assert (
                "memory.exported"
                in (
                    await asyncio.to_thread(
                        cli,
                        "audit",
                        "tail",
                        "--from-start",
                        "--kind",
                        "memory.exported",
                        "--limit",
                        "1",
                        "--data-dir",
                        str(data_dir),
                    )
                ).stdout
            )

            # A malformed session is acked by JetStream; `engram dlq` shows its rejection (never
            # the payload's text).
            bad = json.dumps(
                {**payload, "event_id": str(uuid4()), "steps": "many", "task": "mail bob@example.com"}
            )
            await publish_session(nc, bad.encode(), token, msg_id=None)
            digest = hashlib.sha256(bad.encode()).hexdigest()
            deadline = time.monotonic() + EVENT_TIMEOUT_S
            while (
                digest
                not in (letters := await asyncio.to_thread(cli, "dlq", "--data-dir", str(data_dir))).stdout
            ):
                if time.monotonic() > deadline:
                    up.fail(f"the rejected session never showed in `engram dlq`:\n{letters.stdout}")
                await asyncio.sleep(0.5)
            line = next(x for x in letters.stdout.splitlines() if digest in x)
            assert "engram.session.ended INVALID_REQUEST: " in line, line
            assert "bob@example.com" not in letters.stdout
        finally:
            await nc.close()

        assert await up.stop() == 0
        _assert_fully_stopped(data_dir, info["nats_url"], postmaster)
        # The services' identity had every right they used, the development client every right
        # the CLI and this test used: the server refused nothing.
        log = (data_dir / "nats" / "nats-server.log").read_text(errors="replace")
        assert "Violation" not in log, [line for line in log.splitlines() if "Violation" in line]
        # No nkey seed (the services', the development client's) was ever printed or logged.
        assert not re.findall(r"SU[A-Z2-7]{56}", up.output() + log)
    first_run.update(event_id=payload["event_id"], org_id=str(org))


async def test_restart_on_the_same_data_dir_keeps_the_audit_chain(
    shared_dir: Path, first_run: dict[str, Any]
) -> None:
    """A second engram up on the same data dir finds the first run's audit records, the chain verifies,
    and Ctrl-C (SIGINT to its process group) stops it as cleanly as SIGTERM."""
    if "event_id" not in first_run:
        pytest.skip("the first run did not complete")
    data_dir = shared_dir / "data"
    with EngramUp(data_dir, shared_dir / "run2.log") as up:
        info = await up.connection()
        assert info["org_id"] == first_run["org_id"]  # same dev identity
        postmaster = postmaster_pid(data_dir)
        nc = await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())
        try:
            page = await request(nc, "engram.audit.query", {"after_seq": 0, "limit": 1000}, info["token"])
            assert "error" not in page, page
            completed = [r for r in page["records"] if r["kind"] == "distill.completed"]
            assert [r["details"].get("event_id") for r in completed] == [first_run["event_id"]]
            assert any(r["kind"] == "memory.saved" for r in page["records"])
            verdict = await request(nc, "engram.audit.verify", {}, info["token"], timeout=60)
            assert verdict["ok"] is True, verdict
            assert verdict["checked"] == len(page["records"])
        finally:
            await nc.close()
        assert await up.ctrl_c() == 0
        _assert_fully_stopped(data_dir, info["nats_url"], postmaster)


async def test_ctrl_c_in_a_terminal_drains_then_stops_nats_and_postgres() -> None:
    """Ctrl-C in a terminal (SIGINT to the whole foreground process group, children included) while
    a client is connected: the services drain before NATS and Postgres stop, engram up exits 0 with
    no traceback and one line saying it stopped, and leaves no server running."""
    with stack_dir() as scratch, EngramUp(scratch / "data", scratch / "ctrl-c.log") as up:
        info = await up.connection()
        postmaster = postmaster_pid(up.data_dir)
        nc = await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())
        try:
            reply = await request(nc, "engram.config.get", {"agent_config_id": str(uuid4())}, info["token"])
            assert "error" not in reply, reply  # serving, not merely started
            code = await up.ctrl_c()
        finally:
            await nc.close()
        out = up.output()
        assert code == 0, f"exit {code}:\n{out}"
        assert "Traceback" not in out, out
        assert " ERROR " not in out, out
        assert [line for line in out.splitlines() if "stopped" in line] == ["Engram stopped."], out
        _assert_fully_stopped(up.data_dir, info["nats_url"], postmaster)


async def test_sigterm_during_startup_stops_what_was_started() -> None:
    """SIGTERM while the embedded Postgres is still starting exits 0 and leaves no nats-server or
    Postgres running (it used to kill engram at once and orphan both)."""
    with stack_dir() as scratch, EngramUp(scratch / "data", scratch / "early.log") as up:
        pgdata, conf = up.data_dir / "postgres", up.data_dir / "nats" / "nats-server.conf"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not pgdata.exists():  # nats-server is listening by now; Postgres is being set up
            if time.monotonic() > deadline or (up.proc is not None and up.proc.poll() is not None):
                up.fail("engram up never got as far as starting Postgres")
            await asyncio.sleep(0.02)
        assert not (up.data_dir / "connection.json").exists()
        nats_url = "nats://" + conf.read_text().split("listen:", 1)[1].split()[0]
        assert await up.stop() == 0
        assert not accepts(nats_url), f"{nats_url} still accepts connections"
        assert live_pids_mentioning(str(up.data_dir)) == [], "processes of the data dir still running"
        postmaster = postmaster_pid(up.data_dir)
        assert postmaster is None or not alive(postmaster), "embedded Postgres still running"


async def test_demo_prints_its_summary_and_keeps_serving() -> None:
    """engram up --demo publishes the bundled sessions, prints a summary with gate skips, lessons and a
    verified audit chain, says it is still serving, and stops with exit 0 on SIGTERM."""
    with stack_dir() as scratch, EngramUp(scratch / "data", scratch / "demo.log", "--demo") as up:
        out = await up.wait_for_output("Still serving", DEMO_TIMEOUT_S)
        info, postmaster = await up.connection(), postmaster_pid(up.data_dir)
        assert _summary_row(out, "sessions published").isdigit(), out
        assert int(_summary_row(out, "sessions published")) > 0
        assert int(_summary_row(out, "lessons saved")) > 0
        assert _summary_row(out, "audit chain") == "verified"
        assert _summary_row(out, "skipped by the gate") not in ("", "0")  # e.g. "too_few_steps: 2, ..."
        assert await up.stop() == 0
        _assert_fully_stopped(up.data_dir, info["nats_url"], postmaster)


@pytest.fixture
def no_engram_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ENGRAM_* settings and no .env: the CLI falls back to the data dir's development key."""
    for key in [k for k in os.environ if k.startswith("ENGRAM_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_token_mint_signs_with_the_data_dirs_dev_key(tmp_path: Path, no_engram_env: None) -> None:
    """engram token mint prints a token the data dir's dev key verifies, naming the requested principal."""
    org = uuid4()
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(
        app,
        [
            "token",
            "mint",
            "--org",
            str(org),
            "--kind",
            "end_user",
            "--id",
            "alice",
            "--data-dir",
            str(data_dir),
        ],
    )
    assert result.exit_code == 0, result.output
    identity = load_dev_identity(data_dir)
    credential = TokenService({identity.kid: identity.secret}).verify(result.output.strip())
    assert credential.org_id == org
    assert credential.principal == Principal(kind="end_user", id="alice")
    assert credential.permissions == {"memory.read", "memory.write"}
