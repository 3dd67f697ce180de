"""The request edge's consume spans carry OpenTelemetry's messaging attributes and the GenAI
memory conventions — ids only, never memory text — in the caller's trace. A real nats-server, the
edge serving on it, the SDK's in-memory exporter."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID, uuid4

import nats
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contracts.governance import DeleteRequest, PurgeReceipt
from contracts.operations import MEMORY_DELETE as DELETE_OP
from contracts.operations import RECALL as RECALL_OP
from contracts.recall import RecallReply, RecallRequest
from contracts.subjects import MEMORY_DELETE, RECALL
from shared.embedded.nats_server import NatsServerProcess
from shared.security.access import Caller
from shared.security.auth import TokenService
from shared.service.edge import Edge
from tests.factories import AgentConfigsOf
from tests.platform import eventually, request
from tests.support.servers import nats_server

pytestmark = pytest.mark.integration

SECRET_TEXT = "my card number is in the drawer"


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
async def open_nats(tmp_path: Path) -> AsyncIterator[NatsServerProcess]:
    async with nats_server(tmp_path / "nats") as server:
        yield server


# The edge is under test, not the operations: empty replies will do.
async def _recalled(_: Caller, __: RecallRequest) -> RecallReply:
    return RecallReply(
        strategy="semantic",
        results=[],
        context="",
        pack_id=None,
        count=0,
        matched_count=0,
        tokens_used=0,
        truncated=False,
        warnings=[],
    )


async def _deleted(_: Caller, request: DeleteRequest) -> PurgeReceipt:
    return PurgeReceipt(
        purge_id=request.entry_id,
        actor_ref=None,
        session_id=None,
        agent_config_ids=[],
        entries=0,
        observations=0,
        derived=0,
        recall_records=0,
        vectors=0,
        vectors_deferred=False,
        cache_entries=0,
        entry_ids=[],
    )


async def test_request_spans_carry_messaging_and_memory_attributes_without_text(
    open_nats: NatsServerProcess,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    tokens: TokenService,
    service_token: str,
) -> None:
    """A recall span says search_memory on the agent config's store, a delete span names the
    record, both say nats / subject / queue group, and no attribute holds the cue's text."""
    provider, exporter = spans
    edge = Edge(tokens, agent_configs=AgentConfigsOf())
    edge.serve(RECALL_OP, _recalled)
    edge.serve(DELETE_OP, _deleted)

    agent, entry = uuid4(), uuid4()
    nc = await nats.connect(open_nats.url)
    try:
        await edge.start(nc, tracer_provider=provider)
        await nc.flush()
        recalled = await request(
            nc,
            RECALL,
            {"agent_config_id": str(agent), "cue": SECRET_TEXT, "strategy": "semantic"},
            service_token,
        )
        deleted = await request(
            nc,
            MEMORY_DELETE,
            {
                "agent_config_id": str(agent),
                "entry_id": str(entry),
                "principal": {"kind": "end_user", "id": "a"},
            },
            service_token,
        )
    finally:
        await edge.stop()
        await nc.close()
    assert recalled["count"] == 0, recalled
    assert deleted["entry_ids"] == [], deleted

    def consumed(subject: str) -> ReadableSpan | None:
        for span in exporter.get_finished_spans():
            attributes = span.attributes or {}
            if (
                attributes.get("messaging.destination.name") == subject
                and "gen_ai.operation.name" in attributes
            ):
                return span
        return None

    async def both_exported() -> bool:
        return consumed(RECALL) is not None and consumed(MEMORY_DELETE) is not None

    await eventually(both_exported, timeout=10, what="the consume spans exported")
    recall_span, delete_span = consumed(RECALL), consumed(MEMORY_DELETE)
    assert recall_span is not None
    assert delete_span is not None
    recall_attributes, delete_attributes = (
        dict(recall_span.attributes or {}),
        dict(delete_span.attributes or {}),
    )
    assert recall_attributes["messaging.system"] == "nats"
    assert recall_attributes["messaging.consumer.group.name"] == "recall"
    assert recall_attributes["gen_ai.operation.name"] == "search_memory"
    assert recall_attributes["gen_ai.memory.store.id"] == str(agent)
    assert "gen_ai.memory.record.id" not in recall_attributes
    assert delete_attributes["messaging.consumer.group.name"] == "governance-audit"
    assert delete_attributes["gen_ai.operation.name"] == "delete_memory"
    assert delete_attributes["gen_ai.memory.record.id"] == str(entry)
    everything = json.dumps([dict(s.attributes or {}) for s in exporter.get_finished_spans()], default=str)
    assert SECRET_TEXT not in everything
    assert "drawer" not in everything
    assert isinstance(UUID(str(delete_attributes["gen_ai.memory.store.id"])), UUID)
