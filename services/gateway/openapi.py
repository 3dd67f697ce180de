"""Generate the checked-in OpenAPI 3.1 document of the HTTP gateway: ``contracts/openapi.json``.

    python -m services.gateway.openapi            # (re)write the file
    python -m services.gateway.openapi --check    # exit 1 if the file is missing or stale

Built from the operation table, as the routes are (``services/gateway/app.py``): one path item
per operation, its request from the request model (query parameters for GET and DELETE, the JSON
body otherwise, path fields from the path), its replies from the reply models, and the SPEC 9
envelope for every error. ``tests/unit/test_openapi_sync.py`` fails when the file drifts.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from contracts import subjects as s
from contracts.common import PRINCIPAL_REF_PATTERN
from contracts.errors import ERROR_ENVELOPE_SCHEMA
from contracts.feeds import FeedEvent
from contracts.governance import EntryView
from contracts.operations import MEMORY_EXPORT, OPERATIONS, WEBHOOKS_LIST, Operation
from contracts.schema_export import component_schema, document_main, engram_version
from services.gateway.app import JSONL
from services.gateway.docs import OPENAPI_FILE
from services.gateway.events import EVENTS_PATH
from services.gateway.payloads import Shape
from shared.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

__all__ = ["OPENAPI_FILE", "build_document", "main"]

_SCHEMAS = "#/components/schemas/"
_ERROR = {"$ref": _SCHEMAS + "ErrorReply"}
_JSON = "application/json"


def _errors(op: Operation[Any, Any]) -> dict[str, Any]:
    described = {"description": "The SPEC 9 error envelope; its status is the HTTP status."}
    errors = {status: {**described, "content": {_JSON: {"schema": _ERROR}}} for status in ("4XX", "5XX")}
    if op.quota_class is not None:
        errors["429"] = {
            "description": f"RATE_LIMITED: over the organization's or the token's {op.quota_class} "
            "budget (ENGRAM_QUOTAS); retry after the seconds of Retry-After (details.retry_after_s).",
            "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
            "content": {_JSON: {"schema": _ERROR}},
        }
    return errors


def _parameters(op: Operation[Any, Any], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """Path fields, and for a query-carried request every other field of the request model."""
    shape = Shape.of(op)
    model = op.request
    component_schema(model, schemas, _SCHEMAS)
    properties: dict[str, Any] = schemas[model.__name__].get("properties", {})
    required = set(schemas[model.__name__].get("required", []))
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": properties[name]} for name in op.path_params
    ]
    if shape.in_body:
        return parameters
    for name in shape.query_fields:
        schema = properties[name]
        if name in shape.principal_fields:
            schema = {
                "type": "string",
                "pattern": PRINCIPAL_REF_PATTERN,
                "maxLength": len("end_user:") + 200,
                "description": "For service tokens: act for this principal, as `<kind>:<id>` "
                "(`end_user:alice`) or `none`.",
            }
        parameter: dict[str, Any] = {"name": name, "in": "query", "required": name in required}
        if name in shape.object_fields:
            # An object travels as its JSON text (``?metadata={"k":"v"}``, URL-encoded).
            parameter["content"] = {_JSON: {"schema": schema}}
        else:
            parameter["schema"] = schema
        if name in shape.list_fields:
            parameter |= {"style": "form", "explode": True}
        parameters.append(parameter)
    return parameters


def _request_body(op: Operation[Any, Any], schemas: dict[str, Any]) -> dict[str, Any] | None:
    if not Shape.of(op).in_body:
        return None
    ref = component_schema(op.request, schemas, _SCHEMAS)
    required = bool(schemas[op.request.__name__].get("required"))
    if op.path_params:
        # The body is the request without what the path already says.
        body = copy.deepcopy(schemas[op.request.__name__])
        for name in op.path_params:
            body["properties"].pop(name, None)
            body["required"] = [r for r in body.get("required", []) if r != name]
        body["title"] = f"{op.request.__name__}Body"
        schemas[body["title"]] = body
        ref = {"$ref": _SCHEMAS + body["title"]}
        # Required only when it has a required field the path does not already give.
        required = bool(body["required"])
    return {"required": required, "content": {_JSON: {"schema": ref}}}


def _responses(op: Operation[Any, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    if op is MEMORY_EXPORT:
        entry = component_schema(EntryView, schemas, _SCHEMAS)
        success = {
            "200": {
                "description": "Every page's entries, one EntryView per line (JSON Lines). An error on a "
                "later page ends the stream with the error envelope as the last line.",
                "content": {JSONL: {"schema": entry}},
            }
        }
        return success | _errors(op)
    by_status: dict[str, list[dict[str, str]]] = {}
    for model in op.replies:
        field = model.model_fields.get("status")
        status = str(field.default) if field is not None else "200"
        by_status.setdefault(status, []).append(component_schema(model, schemas, _SCHEMAS))
    success = {
        status: {
            "description": " or ".join(r["$ref"].removeprefix(_SCHEMAS) for r in refs),
            "content": {_JSON: {"schema": refs[0] if len(refs) == 1 else {"oneOf": refs}}},
        }
        for status, refs in sorted(by_status.items())
    }
    return success | _errors(op)


def _operation(op: Operation[Any, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "tags": [op.queue_group],
        "parameters": _parameters(op, schemas),
        "responses": _responses(op, schemas),
        "x-nats-subject": op.subject,
        "x-engram-permission": op.permission,
    }
    if op.mcp_description:
        item["description"] = op.mcp_description
    body = _request_body(op, schemas)
    if body is not None:
        item["requestBody"] = body
    if not item["parameters"]:
        del item["parameters"]
    return item


def _probe(
    summary: str, statuses: dict[str, str], content: tuple[str, dict[str, Any]] = (_JSON, {"type": "object"})
) -> dict[str, Any]:
    media_type, schema = content
    return {
        "get": {
            "summary": summary,
            "tags": ["probes"],
            "security": [],
            "responses": {
                status: {"description": text, "content": {media_type: {"schema": schema}}}
                for status, text in statuses.items()
            },
        }
    }


def _events(schemas: dict[str, Any]) -> dict[str, Any]:
    """``GET /v1/events`` (services/gateway/events.py): a stream, so no operation of the table."""
    event = component_schema(FeedEvent, schemas, _SCHEMAS)
    return {
        "get": {
            "operationId": "events",
            "summary": "The organization's feed as Server-Sent Events: its memory.written, memory.purged "
            "and audit records (ids and metadata, never memory text). Each event's id is its position "
            "in the ENGRAM_FEED stream; reconnect with Last-Event-ID to resume after it, losing nothing "
            "the stream still keeps. Without one, events from now on (from_start=true: all kept).",
            "tags": ["gateway"],
            "parameters": [
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"},
                    "description": "Resume after this event (its id).",
                },
                {
                    "name": "last_event_id",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"},
                    "description": "The same, for clients that cannot set the header.",
                },
                {"name": "from_start", "in": "query", "required": False, "schema": {"type": "boolean"}},
            ],
            "responses": {
                "200": {
                    "description": "text/event-stream: `id: <seq>`, `event: <memory.written | "
                    "memory.purged | audit.<kind>>`, `data: <FeedEvent JSON>`; comment lines keep an "
                    "idle stream open. It ends when the token expires.",
                    "content": {"text/event-stream": {"schema": {"type": "string"}, "x-event-data": event}},
                },
                **{k: v for k, v in _errors(WEBHOOKS_LIST).items() if k != "429"},
            },
            "x-nats-subject": s.feed_subject("{org_id}"),
            "x-engram-permission": "memory.admin",
        }
    }


def build_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document, as JSON-compatible data."""
    schemas: dict[str, Any] = {"ErrorReply": ERROR_ENVELOPE_SCHEMA}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.http_path, {})[op.http_method.lower()] = _operation(op, schemas)
    paths[EVENTS_PATH] = _events(schemas)
    paths["/healthz"] = _probe("Liveness: the gateway answers.", {"200": "Alive."})
    paths["/readyz"] = _probe(
        "Readiness: NATS reachable and every service (ingest, distill, embed, recall, "
        "governance-audit) running somewhere: each answers its liveness probe.",
        {"200": "Ready; each check true.", "503": "Not ready; the checks say what is missing."},
    )
    paths["/metrics"] = _probe(
        "Prometheus metrics of the gateway process (text exposition format): HTTP requests by route "
        "and status, their latency, the process's resources.",
        {"200": f"The metrics, as `{METRICS_CONTENT_TYPE}`."},
        # The media type without its parameters: the exposition format's version is the
        # description's, as served.
        (METRICS_CONTENT_TYPE.split(";")[0], {"type": "string"}),
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Engram HTTP API",
            "version": engram_version(),
            "description": "Long-term memory for AI agents. Each route is the NATS request-reply named "
            "by its x-nats-subject (see contracts/asyncapi.json); the bearer token passes through "
            "unchanged and decides tenancy and permissions (x-engram-permission).",
        },
        "servers": [{"url": "http://127.0.0.1:8080", "description": "engram up (default port)"}],
        "security": [{"bearer": []}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": dict(sorted(schemas.items())),
        },
    }


def main(argv: list[str] | None = None) -> int:
    return document_main(
        argv, path=OPENAPI_FILE, build=build_document, prog="services.gateway.openapi", description=__doc__
    )


if __name__ == "__main__":
    sys.exit(main())
