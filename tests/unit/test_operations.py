"""The operation table (``contracts/operations.py``) is the one list of Engram's operations: the
services' routers, ``EngramClient``, the AsyncAPI document, the NATS permissions and the CLI's
services all agree with it."""

from __future__ import annotations

import collections.abc
import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any, cast, get_args, get_origin
from uuid import UUID

import pytest
from engram_client import generate
from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from pydantic import BaseModel, SecretStr

from contracts import operations, subjects
from contracts.client import EngramClient, SyncEngramClient
from contracts.governance import EntryView
from contracts.operations import (
    JETSTREAMS,
    OPERATIONS,
    STREAMS,
    Operation,
    by_http_route,
    by_mcp_tool,
    by_name,
    by_subject,
    stream_by_subject,
)
from contracts.recall import RecallResult
from services.asyncapi import build_document
from services.distill.component import build as distill
from services.embed.router import EmbedPipeline
from services.embed.router import build_router as embed_router
from services.governance_audit.component import build as governance
from services.ingest.component import build as ingest
from services.recall.component import build as recall
from services.runtime import SERVICES
from shared.adapters.distillers.builtin import BuiltinDistiller
from shared.ports import VectorIndex
from shared.runtime.settings import EngramSettings
from shared.security.auth import TokenService
from shared.security.nats_auth import permissions
from shared.security.provenance import MessageSigner
from shared.service.component import Ports
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.outbox import OutboxRelay

#: The MCP tools issue 9 asks for, by the operation each calls.
REQUIRED_TOOLS = {
    "remember": "memory.save",
    "recall": "recall",
    "expand": "recall.expand",
    "forget": "memory.delete",
    "list_memories": "memory.list",
    "memory_feedback": "memory.feedback",
}


def _offline_infra(broker: NatsBroker, data_dir: Path) -> Infra:
    """What the routers are built with, never connected: enough to build them, not to run them."""
    settings = EngramSettings(
        nats_url="nats://localhost:4222",
        database_url="postgresql://localhost/x",
        data_dir=data_dir,  # governance creates its purge ledger here
        token_keys=SecretStr("doc=" + "x" * 40),
        _env_file=None,
    )
    db = Database(settings.database_url)  # creates the engine; connects on first use only
    signer = MessageSigner(settings.signing_keys())
    return Infra(
        settings=settings,
        db=db,
        tokens=TokenService(settings.signing_keys(), settings.token_issuer),
        broker=broker,
        # The relay only stores its JetStream context until started; it never is here.
        relay=OutboxRelay(db, cast(JetStreamContext, None), signer=signer),
        signer=signer,
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> NatsBroker:
    """Every service's router as its component builds it, on one never-connected broker (embed's
    handlers reach the pipeline and index only when a message arrives; none does here)."""
    broker = NatsBroker("nats://localhost:4222")
    infra = _offline_infra(broker, tmp_path_factory.mktemp("data"))
    ports = Ports(distiller=BuiltinDistiller())
    for build in (ingest, distill, recall, governance):
        for router in build(infra, ports).routers:
            broker.include_router(router)
    broker.include_router(embed_router(infra, cast(EmbedPipeline, None), cast(VectorIndex, None)))
    # What the edge serves is documented as queue-group subscribers (as the AsyncAPI document does).
    for served in infra.edge.routes:
        broker.subscriber(served.op.subject, queue=served.op.queue_group)(_never_called)
    return broker


async def _never_called(body: bytes) -> None:
    raise AssertionError("never subscribed")


def _subject(subscriber: Any) -> str:
    return str(subscriber.subject).removeprefix("Address('").removesuffix("')")


def test_every_request_subscriber_is_an_operation_and_every_operation_is_served(broker: NatsBroker) -> None:
    """Each request-reply operation the routers register on the edge (documented as a queue-group
    subscriber of the broker) is in the table with that queue group, and each operation of the
    table has its handler."""
    served: dict[str, str] = {}
    for sub in broker.subscribers:
        queue = getattr(sub, "queue", None)
        if queue and not sub._no_reply:  # request-reply (the cache listeners never answer)
            served[_subject(sub)] = queue
    assert served == {op.subject: op.queue_group for op in OPERATIONS}


def test_every_stream_consumer_is_declared(broker: NatsBroker) -> None:
    """The durable consumers of the routers consume the streams the table says, nothing else."""
    consumed = {_subject(sub) for sub in broker.subscribers if "Stream" in type(sub).__name__}
    assert consumed == {stream.subject for stream in STREAMS if stream.consumed_by}
    for stream in STREAMS:
        assert any(stream.subject in d.subjects for d in JETSTREAMS if d.name == stream.jetstream), (
            f"{stream.name}: JetStream stream {stream.jetstream} does not bind {stream.subject}"
        )


def test_permissions_consumers_match_the_table() -> None:
    """Each service may create exactly the durable consumers the table gives it, with their filter."""
    for service in SERVICES:
        creates = {
            subject
            for subject in permissions.service_permissions(service).publish_subjects()
            # governance-audit's ephemeral dead-letter readers (``ENGRAM_DLQ.>``) are no durables
            if subject.startswith("$JS.API.CONSUMER.CREATE.")
            and not subject.startswith("$JS.API.CONSUMER.CREATE.ENGRAM_DLQ.")
        }
        expected = {
            f"$JS.API.CONSUMER.CREATE.{c.stream.jetstream}.{c.durable}.{c.stream.subject}"
            for c in operations.consumers_of(service)
        }
        assert creates == expected, service


def test_the_cli_services_are_the_services_of_the_table() -> None:
    """``engram serve`` offers exactly the services the table has serve or consume something."""
    in_table = {op.queue_group for op in OPERATIONS} | {s for st in STREAMS for s in st.consumed_by}
    assert set(SERVICES) == in_table
    assert SERVICES == permissions.SERVICES


def test_each_service_may_subscribe_to_what_it_serves() -> None:
    for op in OPERATIONS:
        rights = permissions.service_permissions(op.queue_group)
        assert f"{op.subject} {op.queue_group}" in rights.subscribe_subjects()
    assert set(permissions.PUBLIC_REQUESTS) == {op.subject for op in OPERATIONS}


def _returned_models(annotation: Any) -> set[type[BaseModel]]:
    """The models a return annotation names (``A | B``; ``AsyncIterator[Page]``)."""
    origin = get_origin(annotation)
    if origin is collections.abc.AsyncIterator:
        return _returned_models(get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return {m for arg in get_args(annotation) for m in _returned_models(arg)}
    return {annotation} if isinstance(annotation, type) and issubclass(annotation, BaseModel) else set()


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_engram_client_has_a_method_per_operation_returning_its_replies(op: Operation[Any, Any]) -> None:
    """EngramClient calls each operation through ``_call(op, request)`` (mypy checks the request
    and reply types there); here: the method exists, returns the operation's replies, and its
    source sends that operation."""
    method = getattr(EngramClient, op.client_method, None)
    assert method is not None, f"EngramClient has no {op.client_method} for {op.name}"
    hints = typing.get_type_hints(method)
    assert _returned_models(hints["return"]) == set(op.replies)
    constant = next(k for k, v in vars(operations).items() if v is op)
    assert f"ops.{constant}" in inspect.getsource(method), f"{op.client_method} does not call {constant}"


def _public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


@pytest.mark.parametrize("client", [EngramClient, SyncEngramClient], ids=lambda c: c.__name__)
def test_every_client_method_is_in_the_table(client: type) -> None:
    """No client method (async or blocking) talks to a subject the table does not declare."""
    plumbing = {"connect", "connect_http", "from_connection", "close", "request", "publish_session"}
    assert _public_methods(client) - plumbing == {op.client_method for op in OPERATIONS}


def test_the_generated_client_methods_are_current() -> None:
    """The client's methods are generated from the table (``make schema``); a table changed
    without regenerating them fails here."""
    assert generate.render() == generate.METHODS_FILE.read_text(), "run `make schema`"


def test_the_generated_methods_take_the_tables_positional_fields() -> None:
    """Each method takes its operation's ``client_args`` in order (or its whole request), then
    any request field by keyword; each is a request field, so the call validates as the request."""
    for op in OPERATIONS:
        params = list(inspect.signature(getattr(EngramClient, op.client_method)).parameters.values())[1:]
        named = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert named == ([op.client_body] if op.client_body else list(op.client_args)), op.name
        assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
        assert set(op.client_args) <= set(op.request.model_fields), op.name


def test_the_asyncapi_document_names_every_subject_of_the_table() -> None:
    doc = build_document()
    addresses = {ch["address"] for ch in doc["channels"].values()}
    missing = {op.subject for op in OPERATIONS} - addresses
    missing |= {stream.subject for stream in STREAMS} - addresses
    assert not missing
    for op in OPERATIONS:
        served = [k for k in doc["operations"] if doc["channels"][k]["address"] == op.subject]
        assert served, f"{op.name} has no operation"
        assert all("reply" in doc["operations"][k] for k in served), f"{op.name} has no reply"


def test_every_subject_constant_is_in_the_table() -> None:
    """A subject added to contracts/subjects.py is an operation or a stream of the table (or one
    of the prefixes the families are built from)."""
    constants = {v for k, v in vars(subjects).items() if k.isupper() and isinstance(v, str)}
    prefixes = {
        subjects.AUDIT,
        subjects.DEAD_LETTER_PREFIX,
        subjects.SAVE_RESULT_PREFIX,
        subjects.HEALTH_PREFIX,
        # Internal core NATS, like liveness: the admin API's revocations to every process.
        subjects.ADMIN_REVOKED,
        subjects.FEED_PREFIX,
    }
    table = {op.subject for op in OPERATIONS} | {stream.subject for stream in STREAMS}
    assert constants - prefixes <= table
    assert {f"{subjects.AUDIT}.*.*", f"{subjects.DEAD_LETTER_PREFIX}.>"} <= table


def _discloses(model: type[BaseModel]) -> bool:
    """Whether the model's schema can carry memory text (an entry or a recalled result)."""
    text = json.dumps(model.model_json_schema(mode="serialization"))
    return any(f'"{m.__name__}"' in text for m in (EntryView, RecallResult)) or model in (
        EntryView,
        RecallResult,
    )


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_disclosure_is_what_the_reply_can_carry(op: Operation[Any, Any]) -> None:
    """``disclosure`` is true exactly for operations whose reply can carry memory text."""
    assert op.disclosure == any(_discloses(m) for m in op.replies)


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_http_routes_are_versioned_and_their_path_fields_are_request_fields(op: Operation[Any, Any]) -> None:
    assert op.http_path.startswith("/v1/")
    for field in op.path_params:
        assert field in op.request.model_fields, (
            f"{op.http_path}: {field} is not a {op.request.__name__} field"
        )
    assert op.name == op.subject.removeprefix("engram.")
    assert op.permission in {
        "memory.read",
        "memory.write",
        "memory.admin",
        "memory.purge",
        "deployment.operator",
        "tenant.admin",
    }


def test_lookups() -> None:
    assert by_name("recall").subject == subjects.RECALL
    assert by_subject(subjects.MEMORY_GET).http_path == "/v1/memories/{entry_id}"
    assert by_http_route("delete", "/v1/memories/{entry_id}").name == "memory.delete"
    assert stream_by_subject(subjects.SESSION_ENDED).jetstream == "ENGRAM_SESSIONS"
    assert by_http_route("post", "/v1/sessions").subject == subjects.SESSION_SUBMIT
    with pytest.raises(KeyError):
        by_name("memory.nothing")


def test_the_mcp_tools_issue_9_asks_for_are_declared_with_descriptions() -> None:
    for tool, name in REQUIRED_TOOLS.items():
        op = by_mcp_tool(tool)
        assert op.name == name
        assert op.mcp_description
        assert len(op.mcp_description) > 60
    tools = [op.mcp_tool for op in OPERATIONS if op.mcp_tool]
    assert len(tools) == len(set(tools))


def test_parse_reply_picks_the_reply_model_that_fits() -> None:
    save = by_name("memory.save")
    accepted = save.parse_reply({"status": 202, "request_id": str(UUID(int=1))})
    outcome = save.parse_reply({"status": 200, "saved": 1, "skipped": 0, "reinforced": 0, "ids": []})
    assert type(accepted).__name__ == "Accepted"
    assert type(outcome).__name__ == "SaveOutcome"
    with pytest.raises(ValueError, match="validation error"):
        save.parse_reply({"status": 500})
