"""Tracing and logging set-up: spans are exported, trace context crosses NATS headers, and log
lines carry the trace id.

The OpenTelemetry global provider can be set only once per process, so in-process tests use a
provider of their own (the code under test takes it as an argument or reads the current span
from the context); ``setup_telemetry`` itself runs in a subprocess.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from faststream.nats import NatsBroker, NatsMessage, TestNatsBroker
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.observability.logging import NOISY_LOGGERS, setup_logging
from shared.observability.telemetry import (
    TracePropagation,
    broker_middleware,
    extract_context,
    inject_trace_headers,
    nats_telemetry_middleware,
    setup_telemetry,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(spans: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider
    provider.shutdown()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    noisy = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, noisy_level in noisy.items():
        logging.getLogger(name).setLevel(noisy_level)


def test_setup_telemetry_exports_spans_once_even_when_called_twice() -> None:
    """After two ``setup_telemetry`` calls a ``tracer()`` span is exported once, with the service name."""
    script = textwrap.dedent(
        """
        import json, sys
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from shared.observability.telemetry import setup_telemetry, tracer

        first = setup_telemetry("engram-test", exporter="console")
        second = setup_telemetry("engram-test", exporter="console")
        memory = InMemorySpanExporter()
        first.add_span_processor(SimpleSpanProcessor(memory))
        with tracer("engram.test").start_as_current_span("unit-of-work"):
            pass
        first.shutdown()
        finished = memory.get_finished_spans()
        json.dump({
            "same_provider": first is second,
            "spans": [span.name for span in finished],
            "service": [span.resource.attributes["service.name"] for span in finished],
        }, sys.stderr)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stderr)
    assert result == {"same_provider": True, "spans": ["unit-of-work"], "service": ["engram-test"]}
    # The console exporter printed the span once: a second processor would have printed it twice.
    assert done.stdout.count('"name": "unit-of-work"') == 1, done.stdout


def test_setup_telemetry_none_installs_nothing() -> None:
    """``exporter="none"`` returns no provider and leaves the global no-op provider in place."""
    assert setup_telemetry("engram-test", exporter="none") is None
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_setup_telemetry_rejects_bad_configuration() -> None:
    """An unknown exporter, or otlp without an endpoint, fails at set-up with what to set."""
    with pytest.raises(ValueError, match="unknown OpenTelemetry exporter"):
        setup_telemetry("engram-test", exporter="jaeger")
    with pytest.raises(ValueError, match="ENGRAM_OTEL_ENDPOINT"):
        setup_telemetry("engram-test", exporter="otlp")


def test_span_is_exported(provider: TracerProvider, spans: InMemorySpanExporter) -> None:
    """A span finished under a tracer reaches the exporter."""
    with provider.get_tracer("engram.test").start_as_current_span("recall"):
        pass
    assert [span.name for span in spans.get_finished_spans()] == ["recall"]


def test_inject_and_extract_round_trip_the_trace(provider: TracerProvider) -> None:
    """Headers injected inside a span carry its trace id, and extracting them parents a new span on it."""
    with provider.get_tracer("engram.test").start_as_current_span("relay") as span:
        original = {"Nats-Msg-Id": "evt-1"}
        headers = inject_trace_headers(original)
    sent = span.get_span_context()

    assert "traceparent" in headers
    assert headers["Nats-Msg-Id"] == "evt-1"
    assert original == {"Nats-Msg-Id": "evt-1"}
    received = trace.get_current_span(extract_context(headers)).get_span_context()
    assert (received.trace_id, received.span_id) == (sent.trace_id, sent.span_id)


def test_inject_without_a_span_adds_no_traceparent() -> None:
    """Outside any span the headers go out unchanged."""
    assert inject_trace_headers({"Nats-Msg-Id": "evt-1"}) == {"Nats-Msg-Id": "evt-1"}


async def test_middleware_carries_the_trace_through_nats_headers(
    provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    """A message published inside a span reaches its subscriber with a traceparent of the same trace."""
    broker = NatsBroker(middlewares=[nats_telemetry_middleware(provider)])
    seen: list[tuple[str, int]] = []

    @broker.subscriber("engram.test.traced")
    async def handle(body: str, msg: NatsMessage) -> None:
        current = trace.get_current_span().get_span_context()
        seen.append((msg.headers.get("traceparent", ""), current.trace_id))

    async with TestNatsBroker(broker) as test_broker:
        with provider.get_tracer("engram.test").start_as_current_span("platform") as span:
            await test_broker.publish("hello", "engram.test.traced")

    trace_id = span.get_span_context().trace_id
    assert len(seen) == 1
    traceparent, handler_trace_id = seen[0]
    assert traceparent.split("-")[1] == format(trace_id, "032x")
    assert handler_trace_id == trace_id
    exported = spans.get_finished_spans()
    assert {s.context.trace_id for s in exported} == {trace_id}
    assert len(exported) >= 3  # the outer span, the publish span and the process span


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("middleware", ["faststream, no-op tracer", "propagation only"])
async def test_without_an_exporter_the_callers_trace_still_passes_through(middleware: str) -> None:
    """Where no spans are exported, the services' broker carries only the trace context
    (``TracePropagation``), and carries it exactly as FastStream's telemetry middleware does
    with the no-op tracer: what a handler publishes carries the caller's ``traceparent``; a
    message without one makes none up."""
    chosen = (
        nats_telemetry_middleware(None) if middleware.startswith("faststream") else broker_middleware(None)
    )
    broker = NatsBroker(middlewares=[chosen])
    forwarded: list[dict[str, str]] = []

    @broker.subscriber("engram.test.first")
    async def first(body: str) -> str:
        await broker.publish(body, "engram.test.second")
        return "reply"

    @broker.subscriber("engram.test.second")
    async def second(body: str, msg: NatsMessage) -> None:
        forwarded.append(dict(msg.headers))

    async with TestNatsBroker(broker) as test_broker:
        reply = await test_broker.request("traced", "engram.test.first", headers={"traceparent": TRACEPARENT})
        await test_broker.publish("untraced", "engram.test.first")

    assert [h.get("traceparent") for h in forwarded] == [TRACEPARENT, None]
    assert reply.body == b"reply"


def test_the_services_trace_in_full_only_where_spans_are_exported(provider: TracerProvider) -> None:
    """FastStream's telemetry middleware (spans) with a provider, the propagation alone without."""
    assert broker_middleware(None) is TracePropagation
    assert isinstance(broker_middleware(provider), NatsTelemetryMiddleware)


@pytest.mark.usefixtures("restore_logging")
def test_json_log_line_carries_message_extras_and_trace_id(
    provider: TracerProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    """With json=True a record inside a span is one JSON line with msg, extra fields and trace ids."""
    setup_logging("INFO", json=True)
    setup_logging("INFO", json=True)  # idempotent: still one line per record
    with provider.get_tracer("engram.test").start_as_current_span("save") as span:
        logging.getLogger("engram.test").info("saved %d entries", 3, extra={"agent_config_id": "cfg-1"})

    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    entry = json.loads(lines[0])
    context = span.get_span_context()
    assert entry["msg"] == "saved 3 entries"
    assert entry["level"] == "INFO"
    assert entry["logger"] == "engram.test"
    assert entry["agent_config_id"] == "cfg-1"
    assert entry["trace_id"] == format(context.trace_id, "032x")
    assert entry["span_id"] == format(context.span_id, "016x")
    assert "ts" in entry


@pytest.mark.usefixtures("restore_logging")
def test_human_log_line_and_quiet_libraries(capsys: pytest.CaptureFixture[str]) -> None:
    """With json=False a record is a short text line, and nats/asyncio INFO chatter is dropped."""
    setup_logging("info", json=False)
    logging.getLogger("engram.test").info("ready", extra={"service": "recall"})
    logging.getLogger("nats.aio.client").info("connected")

    err = capsys.readouterr().err
    assert "INFO  engram.test: ready service=recall" in err
    assert "connected" not in err


@pytest.mark.usefixtures("restore_logging")
def test_setup_logging_rejects_an_unknown_level() -> None:
    """A misspelt level fails with the setting to fix."""
    with pytest.raises(ValueError, match="ENGRAM_LOG_LEVEL"):
        setup_logging("verbose", json=True)
