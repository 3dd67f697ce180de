"""``GET /metrics`` on a real ``engram serve`` process (all five services, its own NATS identity):
after real traffic the counters moved by exactly what was done, and every metric the Grafana
dashboard and the Prometheus alert rules name is one the process exports."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
import yaml
from nats.aio.client import Client
from prometheus_client.parser import text_string_to_metric_families

from contracts.subjects import SESSION_VALIDATED
from services.runtime import SERVICES
from shared.embedded.nats_server import free_port
from shared.runtime.settings import EngramSettings
from tests.platform import eventually, publish_session, request, session_payload
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "infra" / "grafana" / "engram.json"
ALERTS = REPO / "infra" / "prometheus" / "alerts.yml"
RECALLS = 7

#: One sample: its name and its labels, sorted.
Key = tuple[str, tuple[tuple[str, str], ...]]


def _scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        return str(reply.read().decode())


async def scrape(port: int) -> dict[Key, float]:
    text = await asyncio.to_thread(_scrape_text, port)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def exported_names(port: int) -> set[str]:
    """Every series name the process can export (a labelled family exports its names before its
    first sample too, so the family's type decides the suffixes)."""
    text = await asyncio.to_thread(_scrape_text, port)
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gauge": ("",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
async def serve_port(
    nats_proc: SecuredNatsServer, settings: EngramSettings, tmp_path: Path
) -> AsyncIterator[int]:
    """``engram serve`` running every service, with /metrics on a port of its own."""
    assert nats_proc.services is not None
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(
        ENGRAM_NATS_URL=settings.nats_url,
        ENGRAM_NATS_NKEY_SEED=nats_proc.services.seed,
        ENGRAM_DATABASE_URL=settings.database_url,
        ENGRAM_TOKEN_KEYS=settings.token_keys.get_secret_value(),
        ENGRAM_HEALTH_PORT=str(port),
        ENGRAM_HEALTH_HOST="127.0.0.1",
        ENGRAM_OTEL_EXPORTER="none",
        ENGRAM_EMBEDDER="hashing-384",
        ENGRAM_DATA_DIR=str(tmp_path / "data"),
        ENGRAM_RETENTION_SWEEP_S="1",
    )
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", *SERVICES],
        cwd=tmp_path,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:

        async def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False

        await eventually(ready, timeout=90, interval=0.2, what="engram serve ready")
        yield port
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def test_metrics_count_what_was_done(
    serve_port: int, nc: Client, observer_nc: Client, org: UUID, agent: UUID, service_token: str
) -> None:
    """N recalls add N to that strategy's latency histogram and to the OK requests; an
    unauthenticated call counts under its code; a forged internal message adds one dead letter;
    sessions show up as audit records, consumer lag gauges and embedded entries."""
    before = await scrape(serve_port)
    principal = {"kind": "end_user", "id": "alice"}
    for _ in range(RECALLS):
        reply = await request(
            nc,
            "engram.recall",
            {"agent_config_id": str(agent), "strategy": "last_k", "principal": principal},
            service_token,
        )
        assert "error" not in reply, reply
    refused = await request(nc, "engram.recall", {"agent_config_id": str(agent)}, None)
    refused_code = refused["error"]["code"]
    forged = json.dumps({"event_id": str(uuid4()), "forged": True}).encode()
    await observer_nc.jetstream().publish(SESSION_VALIDATED, forged, headers={"Nats-Msg-Id": str(uuid4())})
    for _ in range(3):
        await publish_session(nc, session_payload(org, agent), service_token)

    async def moved() -> bool:
        now = await scrape(serve_port)
        return value(now, "engram_dead_letters_total", source="internal", reason="UNAUTHENTICATED") > value(
            before, "engram_dead_letters_total", source="internal", reason="UNAUTHENTICATED"
        ) and value(now, "engram_embedded_entries_total") > value(before, "engram_embedded_entries_total")

    await eventually(moved, timeout=60, interval=0.5, what="the dead letter and the embedded entries counted")
    after = await scrape(serve_port)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("engram_recall_duration_seconds_count", strategy="last_k") == RECALLS
    assert delta("engram_requests_total", operation="engram.recall", code="OK") == RECALLS
    assert delta("engram_requests_total", operation="engram.recall", code=refused_code) == 1
    assert delta("engram_request_duration_seconds_count", operation="engram.recall") == RECALLS + 1
    assert delta("engram_dead_letters_total", source="internal", reason="UNAUTHENTICATED") == 1
    # Each session: ingest's validation, distill's completion and its lessons' records at least.
    assert delta("engram_audit_records_total") >= 3 * 2
    assert delta("engram_outbox_published_total") > 0
    for stream, durable in (
        ("ENGRAM_SESSIONS", "ingest"),
        ("ENGRAM_SESSIONS", "distill"),
        ("ENGRAM_MEMORY", "embed"),
    ):
        key = ("engram_jetstream_consumer_num_pending", (("consumer_name", durable), ("stream_name", stream)))
        assert key in after, f"no lag figure for {stream}/{durable}"
    assert ("engram_outbox_backlog_messages", ()) in after
    assert value(after, "engram_retention_sweeps_total") >= 1
    # Bounded labels: nothing identifying an organization, an agent config or a session.
    for name, labels in after:
        for _, label_value in labels:
            assert str(org) not in label_value, (name, labels)
            assert str(agent) not in label_value, (name, labels)


def _dashboard_exprs() -> list[str]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]


def _alert_exprs() -> list[str]:
    rules: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return [str(r["expr"]) for group in rules["groups"] for r in group["rules"]]


_FUNCTIONS = {
    "rate", "irate", "increase", "sum", "max", "min", "avg", "by", "without", "histogram_quantile",
    "deriv", "delta", "clamp_min", "on", "ignoring", "and", "or", "unless", "offset", "count",
    "le", "vector", "topk", "label_replace", "time", "bool", "absent", "predict_linear",
}  # fmt: skip


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords,
    label names (inside braces or by/without lists) or label values (in quotes)."""
    stripped = re.sub(r'"[^"]*"', "", expr)  # label values
    stripped = re.sub(r"\{[^}]*\}", "", stripped)  # label matchers
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)  # grouping labels
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # range selectors
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped))
    return {n for n in names if n not in _FUNCTIONS and not re.fullmatch(r"\d+[smhd]?", n)}


async def test_dashboard_and_alerts_name_only_exported_metrics(serve_port: int) -> None:
    """Every metric infra/grafana/engram.json and infra/prometheus/alerts.yml read is one a
    running service process exports, and the alerts the runbook promises are all there."""
    exported = await exported_names(serve_port)
    board, alerts = _dashboard_exprs(), _alert_exprs()
    assert board
    assert alerts
    named = set().union(*(_metric_names(e) for e in board + alerts))
    assert any(n.startswith("engram_") for n in named)
    assert named <= exported, f"not exported: {sorted(named - exported)}"
    rules = yaml.safe_load(ALERTS.read_text())
    alert_names = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    assert {
        "EngramConsumerLagGrowing",
        "EngramDeadLetter",
        "EngramAuditVerificationFailed",
        "EngramRecallP99OverBudget",
        "EngramOutboxBacklog",
        "EngramStoreDiskFilling",
        "EngramStoreDiskFullIn4h",
        "EngramJetStreamStorageNearLimit",
    } <= alert_names
