"""OpenTelemetry traces cross services through NATS headers: ingest, distill and governance-audit
run as separate ``engram serve`` processes with the console exporter, one ``session.ended`` goes in
with a ``traceparent`` of our own, and the spans they print afterwards form one trace back to it.

A subprocess per service because the global tracer provider can be set only once per process.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from contracts.subjects import MEMORY_WRITTEN, SESSION_ENDED
from shared.runtime.settings import EngramSettings
from tests.platform import session_payload
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("ingest", "distill", "governance-audit")
START_TIMEOUT_S = 20.0
FLOW_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
READY_LINE = "services running:"


class ServeProcess:
    """``engram serve <service>`` as its own OS process; spans on stdout, logs on stderr, to files."""

    def __init__(self, service: str, env: dict[str, str], log_dir: Path) -> None:
        self.service = service
        self.stdout = log_dir / f"{service}.stdout"
        self.stderr = log_dir / f"{service}.stderr"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli.main", "serve", service],
                cwd=log_dir,  # no stray .env
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def logs(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    def spans_text(self) -> str:
        return self.stdout.read_text(errors="replace") if self.stdout.exists() else ""

    def report(self) -> str:
        return (
            f"----- {self.service} (exit {self.proc.poll()}) stderr -----\n{self.logs()}\n"
            f"----- {self.service} stdout -----\n{self.spans_text()}"
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)


def _env(settings: EngramSettings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "OTEL_"))}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        ENGRAM_NATS_URL=settings.nats_url,
        ENGRAM_DATABASE_URL=settings.database_url,
        ENGRAM_TOKEN_KEYS=settings.token_keys.get_secret_value(),
        ENGRAM_OTEL_EXPORTER="console",
        ENGRAM_LOG_LEVEL="INFO",
    )
    return env


@contextmanager
def serving(settings: EngramSettings, log_dir: Path, seeds: dict[str, str]) -> Iterator[list[ServeProcess]]:
    """The services as separate processes, each under its own NATS identity, killed (process
    groups) whatever happens; their output is printed if the block fails."""
    procs: list[ServeProcess] = []
    try:
        env = _env(settings)
        for service in SERVICES:
            procs.append(ServeProcess(service, {**env, "ENGRAM_NATS_NKEY_SEED": seeds[service]}, log_dir))
        yield procs
    except BaseException:
        for proc in procs:
            print(proc.report(), file=sys.stderr)
        raise
    finally:
        for proc in procs:
            proc.kill()


async def _wait_ready(procs: list[ServeProcess]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.proc.poll() is not None:
                raise AssertionError(f"{proc.service} exited with {proc.proc.returncode} before it was ready")
        if all(READY_LINE in proc.logs() for proc in procs):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"services not ready within {START_TIMEOUT_S}s")


async def _stop(procs: list[ServeProcess]) -> None:
    """SIGTERM, as a supervisor does; each must exit cleanly (which is when spans get flushed)."""
    for proc in procs:
        proc.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(proc.proc.poll() is None for proc in procs):
        if time.monotonic() > deadline:
            raise AssertionError(f"services still running {STOP_TIMEOUT_S}s after SIGTERM")
        await asyncio.sleep(0.05)
    for proc in procs:
        assert proc.proc.returncode == 0, f"{proc.service} exited with {proc.proc.returncode}"


def parse_spans(text: str) -> list[dict[str, Any]]:
    """The console exporter's output: one indented JSON object per span, back to back."""
    decoder = json.JSONDecoder()
    spans: list[dict[str, Any]] = []
    pos = text.find("{")
    while pos != -1:
        span, end = decoder.raw_decode(text, pos)
        spans.append(span)
        pos = text.find("{", end)
    return spans


def _hex(value: str | None) -> str | None:
    return value[2:] if value and value.startswith("0x") else value


def _traceparent_ids(headers: dict[str, str] | None) -> tuple[str, str]:
    version, trace_id, parent_id, _flags = (headers or {})["traceparent"].split("-")
    assert version == "00"
    return trace_id, parent_id


def _by_name(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [span for span in spans if span["name"] == name]
    assert len(found) == 1, f"expected one {name!r} span, got {[s['name'] for s in spans]}"
    return found[0]


async def test_one_trace_spans_ingest_and_distill_processes_and_memory_written(
    settings: EngramSettings,
    nats_proc: SecuredNatsServer,
    nc: Client,
    observer_nc: Client,
    org: UUID,
    agent: UUID,
    service_token: str,
    tmp_path: Path,
) -> None:
    """A session.ended with our traceparent yields spans in the ingest and distill processes and a
    memory.written header, all in our trace, each hop parented on the one before it."""
    trace_id, root_span_id = secrets.token_hex(16), secrets.token_hex(8)
    payload = session_payload(
        org,
        agent,
        tool_trace=[{"tool": "deploy", "input": {"env": "staging"}, "error": "quota exceeded"}],
    )
    written: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_written(msg: Msg) -> None:
        await written.put(msg)

    sub = await observer_nc.subscribe(MEMORY_WRITTEN, cb=on_written)
    with serving(settings, tmp_path, nats_proc.service_seeds) as procs:
        await _wait_ready(procs)
        await nc.jetstream().publish(
            SESSION_ENDED,
            json.dumps(payload).encode(),
            headers={
                "Authorization": f"Bearer {service_token}",
                "traceparent": f"00-{trace_id}-{root_span_id}-01",
            },
        )

        async def lesson_written() -> Msg:
            while True:
                msg = await written.get()
                event = json.loads(msg.data)
                if event["org_id"] == str(org) and event["layer"] == "memory":
                    return msg

        lesson = await asyncio.wait_for(lesson_written(), FLOW_TIMEOUT_S)
        await _stop(procs)

        spans = {proc.service: parse_spans(proc.spans_text()) for proc in procs}
        ingest, distill = spans["ingest"], spans["distill"]
        assert ingest, "the ingest process exported no spans"
        assert distill, "the distill process exported no spans"
        for service, label in (("ingest", "engram-ingest"), ("distill", "engram-distill")):
            for span in spans[service]:
                assert span["resource"]["attributes"]["service.name"] == label
        # ingest and distill consume in batches: FastStream's batch spans stand for many sessions
        # at once, so each session gets its own span, parented on the trace its message carried.
        per_session = [s for s in [*ingest, *distill] if s["name"].endswith(".session")]
        assert len(per_session) == 2
        for span in per_session:
            assert _hex(span["context"]["trace_id"]) == trace_id, f"span outside our trace: {span}"

        ingest_process = _by_name(ingest, "engram.ingest.session")
        distill_process = _by_name(distill, "engram.distill.session")
        # Our publisher → ingest's consume span → (raw publish with injected headers) → distill's.
        assert _hex(ingest_process["parent_id"]) == root_span_id
        assert _hex(distill_process["parent_id"]) == _hex(ingest_process["context"]["span_id"])

        # The outbox kept distill's context from enqueue time through the relay's publish.
        lesson_trace, lesson_parent = _traceparent_ids(lesson.headers)
        assert lesson_trace == trace_id
        assert lesson_parent == _hex(distill_process["context"]["span_id"])
    await sub.unsubscribe()
