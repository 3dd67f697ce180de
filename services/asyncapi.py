"""Generate the checked-in AsyncAPI document of Engram's NATS interface: ``contracts/asyncapi.json``.

    python -m services.asyncapi            # (re)write the file
    python -m services.asyncapi --check    # exit 1 if the file is missing or stale

FastStream describes the brokers' subscribers (the four services' routers, built exactly as
``services.runtime`` builds them, but never connected), the request-reply operations those
services register on the edge (which serves them on nats-py, so they are declared here as
documentation-only subscribers) and the events Engram publishes, declared as documentation-only
publishers from the operation table's streams. Our handlers
take the raw ``NatsMessage`` (so bad input can be dead-lettered), which FastStream cannot see
through; so every message payload is then set from the operation table (:data:`PAYLOADS`), and
request-reply operations get their reply. ``tests/unit/test_asyncapi_sync.py`` fails when the file drifts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

from faststream.nats import NatsBroker
from faststream.specification import AsyncAPI
from nats.js import JetStreamContext
from pydantic import BaseModel, SecretStr

from contracts.errors import ERROR_ENVELOPE_SCHEMA
from contracts.operations import OPERATIONS, STREAMS
from contracts.schema_export import component_schema, document_main, engram_version
from services.distill.router import build_router as distill_router
from services.governance_audit.erasure_api import Erasures
from services.governance_audit.router import build_router as governance_router
from services.ingest.router import build_router as ingest_router
from services.recall.router import build_router as recall_router
from services.recall.service import Recall
from services.recall.side_effects import SideEffects
from shared.auth import TokenService, TokenVerifier
from shared.db.engine import Database
from shared.distillers.builtin import BuiltinDistiller
from shared.infra import Infra
from shared.outbox import OutboxRelay
from shared.provenance import MessageSigner
from shared.settings import EngramSettings

__all__ = [
    "ASYNCAPI_FILE",
    "PAYLOADS",
    "REPLIES",
    "build_document",
    "main",
    "offline_broker",
    "offline_infra",
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


def offline_infra(broker: NatsBroker) -> Infra:
    """What the routers are built with, never connected: enough to build them, not to run them."""
    settings = EngramSettings(
        nats_url="nats://localhost:4222",
        database_url="postgresql://localhost/x",
        token_keys=SecretStr("doc=" + "x" * 40),
        _env_file=None,
    )
    db = Database(settings.database_url)  # creates the engine; connects on first use only
    signer = MessageSigner(settings.signing_keys())
    return Infra(
        settings=settings,
        db=db,
        tokens=TokenVerifier(TokenService(settings.signing_keys(), settings.token_issuer)),
        broker=broker,
        # The relay only stores its JetStream context until started; it never is here.
        relay=OutboxRelay(db, cast(JetStreamContext, None), signer=signer),
        signer=signer,
    )


def offline_broker() -> NatsBroker:
    """A never-connected broker carrying the routers ``services.runtime`` would run (embed's
    consumers aside: they document nothing a platform uses)."""
    broker = NatsBroker("nats://localhost:4222")
    infra = offline_infra(broker)
    broker.include_router(ingest_router(infra))
    broker.include_router(distill_router(infra, BuiltinDistiller()))
    broker.include_router(governance_router(infra, Erasures(infra.db)))
    # Never started: its side effects and caches are only reached when a request arrives.
    broker.include_router(
        recall_router(infra, Recall(infra.db, SideEffects(infra.db), embedder=None, index=None))
    )

    # Documentation only: what the edge serves (on nats-py, not through these objects).
    for served in infra.edge.routes:
        op = served.op
        broker.subscriber(
            op.subject, queue=op.queue_group, title=f"{op.queue_group}:{op.name}", description=op.summary
        )(_served_by_the_edge)

    # Documentation only: what Engram publishes (through the outbox relay, not these objects).
    for stream in STREAMS:
        if stream.published_by != ("platform",):
            title = f"{'engram' if stream.public else stream.published_by[0]}:{stream.name}"
            broker.publisher(stream.subject, schema=stream.payload, title=title, description=stream.summary)
    return broker


async def _served_by_the_edge(body: bytes) -> bytes:
    raise RuntimeError("documentation only: the edge serves this operation (shared/edge.py)")


def _schema(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, str]:
    return component_schema(model, schemas, _SCHEMAS)


def build_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document, as JSON-compatible data."""
    doc: dict[str, Any] = (
        AsyncAPI(
            offline_broker(),
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
