"""Generate the checked-in AsyncAPI document of Engram's NATS interface: ``contracts/asyncapi.json``.

    python -m services.asyncapi            # (re)write the file
    python -m services.asyncapi --check    # exit 1 if the file is missing or stale

Everything in it comes from the operation table (``contracts.operations``): its stream consumers
and request-reply operations become documentation-only subscribers, the streams Engram publishes
documentation-only publishers, on a broker FastStream's generator reads (never connected; no
service is built). Every message payload is then set from the table (:data:`PAYLOADS`), and
request-reply operations get their reply. ``tests/unit/test_asyncapi_sync.py`` fails when the file
drifts; ``tests/unit/test_operations.py`` checks the services' routers against the same table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from faststream.nats import JStream, NatsBroker, PullSub
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from contracts.errors import ERROR_ENVELOPE_SCHEMA
from contracts.operations import CONSUMERS, OPERATIONS, STREAMS
from contracts.schema_export import component_schema, document_main, engram_version

__all__ = [
    "ASYNCAPI_FILE",
    "PAYLOADS",
    "REPLIES",
    "build_document",
    "documented_broker",
    "main",
]

ASYNCAPI_FILE = Path(__file__).resolve().parent.parent / "contracts" / "asyncapi.json"

#: The payload of every channel, by address (subject): what is actually on the wire.
PAYLOADS: dict[str, type[BaseModel]] = {
    **{stream.subject: stream.payload for stream in STREAMS},
    **{op.subject: op.request for op in OPERATIONS},
}

#: What a request-reply subject answers; any of them may instead answer the error envelope.
REPLIES: dict[str, tuple[type[BaseModel], ...]] = {op.subject: op.replies for op in OPERATIONS}

#: The SPEC 9 error envelope (``EngramError.to_wire``), which has no pydantic model.
_ERROR_REPLY = ERROR_ENVELOPE_SCHEMA

_SCHEMAS = "#/components/schemas/"


def documented_broker() -> NatsBroker:
    """The table as FastStream's AsyncAPI generator reads it: a broker carrying one
    documentation-only subscriber or publisher per row (never connected, nothing handled)."""
    broker = NatsBroker("nats://localhost:4222")
    # What the services consume from JetStream (shared.service.consumer subscribes them the same way).
    for consumer in CONSUMERS:
        broker.subscriber(
            consumer.stream.subject,
            stream=JStream(consumer.stream.jetstream, declare=False),
            durable=consumer.durable,
            pull_sub=PullSub(
                batch_size=consumer.batch_size, timeout=consumer.timeout_s, batch=consumer.batched
            ),
            title=consumer.title,
            description=consumer.summary,
        )(_documentation_only)
    # What the edge serves (on nats-py, shared/service/edge.py).
    for op in OPERATIONS:
        broker.subscriber(
            op.subject, queue=op.queue_group, title=f"{op.queue_group}:{op.name}", description=op.summary
        )(_documentation_only)
    # What Engram publishes (through the outbox relay).
    for stream in STREAMS:
        if stream.published_by != ("platform",):
            title = f"{'engram' if stream.public else stream.published_by[0]}:{stream.name}"
            broker.publisher(stream.subject, schema=stream.payload, title=title, description=stream.summary)
    return broker


async def _documentation_only(body: bytes) -> bytes:
    raise RuntimeError("documentation only: never subscribed")


def _schema(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, str]:
    return component_schema(model, schemas, _SCHEMAS)


def build_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document, as JSON-compatible data."""
    doc: dict[str, Any] = (
        AsyncAPI(
            documented_broker(),
            title="Engram",
            version=engram_version(),
            description="Long-term memory for AI agents, on NATS: the events platforms publish, "
            "the request-reply subjects they call, and the events Engram publishes.",
        )
        .to_specification()
        .to_jsonable()
    )

    # Every payload is replaced from PAYLOADS, so the schemas section is rebuilt from scratch
    # (dropping FastStream's placeholder for the raw ``NatsMessage`` handlers).
    components = doc["components"]
    schemas: dict[str, Any] = {}
    components["schemas"] = schemas
    for key, channel in list(doc["channels"].items()):
        address = channel["address"]
        if address not in PAYLOADS:
            raise RuntimeError(f"channel {key} ({address}) has no payload model in PAYLOADS")
        for message_ref in channel["messages"].values():
            message_name = message_ref["$ref"].rsplit("/", 1)[-1]
            components["messages"][message_name]["payload"] = _schema(PAYLOADS[address], schemas)

        if address in REPLIES and doc["operations"][key]["action"] == "receive":
            # The reply goes to the request's NATS reply inbox: a channel with a dynamic
            # (null) address, referenced from the operation's ``reply``.
            reply_key = f"{key}:reply"
            models = [_schema(model, schemas) for model in REPLIES[address]]
            schemas["ErrorReply"] = _ERROR_REPLY
            components["messages"][reply_key] = {
                "title": reply_key,
                "payload": {"oneOf": [*models, {"$ref": _SCHEMAS + "ErrorReply"}]},
            }
            doc["channels"][reply_key] = {
                "address": None,
                "description": f"The reply to {address}, on the request's reply inbox.",
                "messages": {"Reply": {"$ref": f"#/components/messages/{reply_key}"}},
            }
            doc["operations"][key]["reply"] = {
                "channel": {"$ref": f"#/channels/{reply_key}"},
                "messages": [{"$ref": f"#/channels/{reply_key}/messages/Reply"}],
            }
    return doc


def main(argv: list[str] | None = None) -> int:
    return document_main(
        argv, path=ASYNCAPI_FILE, build=build_document, prog="services.asyncapi", description=__doc__
    )


if __name__ == "__main__":
    sys.exit(main())
