"""Subject names (SPEC section 6).

The streams that keep them, and their consumers, are rows of the operation table
(``contracts.operations``).
"""

from __future__ import annotations

__all__ = [
    "ADMIN_AGENT_CONFIG_CREATE",
    "ADMIN_AGENT_CONFIG_LIST",
    "ADMIN_CLIENT_LIST",
    "ADMIN_CLIENT_MINT",
    "ADMIN_CLIENT_REVOKE",
    "ADMIN_CLIENT_ROTATE",
    "ADMIN_ORG_CREATE",
    "ADMIN_ORG_DISABLE",
    "ADMIN_ORG_LIST",
    "ADMIN_REVOKED",
    "ADMIN_TOKEN_MINT",
    "ADMIN_TOKEN_REVOKE",
    "AUDIT",
    "AUDIT_QUERY",
    "AUDIT_VERIFY",
    "CONFIG_GET",
    "CONFIG_PUT",
    "DEAD_LETTER_PREFIX",
    "FEED_EVENTS",
    "FEED_PREFIX",
    "HEALTH_PREFIX",
    "MEMORY_DELETE",
    "MEMORY_EXPORT",
    "MEMORY_FEEDBACK",
    "MEMORY_GET",
    "MEMORY_LIST",
    "MEMORY_MANAGE",
    "MEMORY_PRUNE",
    "MEMORY_PURGE",
    "MEMORY_PURGED",
    "MEMORY_SAVE",
    "MEMORY_SAVE_ACCEPTED",
    "MEMORY_WRITTEN",
    "OPS_DEAD_LETTERS",
    "OPS_LAG",
    "RECALL",
    "RECALL_EXPAND",
    "SAVE_RESULT_PREFIX",
    "SESSION_ENDED",
    "SESSION_SUBMIT",
    "SESSION_VALIDATED",
    "WEBHOOKS_DELETE",
    "WEBHOOKS_LIST",
    "WEBHOOKS_REGISTER",
    "WEBHOOKS_REPLAY",
    "audit_subject",
    "dead_letter_subject",
    "feed_event_of",
    "feed_subject",
    "health_subject",
    "save_result_subject",
]

# -- events platforms publish -------------------------------------------------------------
SESSION_ENDED = "engram.session.ended"

#: The same session over request-reply (``POST /v1/sessions``): checked before anything is stored.
SESSION_SUBMIT = "engram.session.submit"

# -- internal hand-offs (JetStream, so a crash between services loses nothing) --------------
#: ingest → distill: a session whose token, schema and size were verified.
SESSION_VALIDATED = "engram.session.validated"
#: ingest → distill: an elective save, durably accepted before ingest answers 202.
MEMORY_SAVE_ACCEPTED = "engram.save.accepted"
#: distill → ingest (core NATS): the outcome of a ``wait: true`` save, per request id.
SAVE_RESULT_PREFIX = "engram.save.result"

# -- events Engram publishes --------------------------------------------------------------
MEMORY_WRITTEN = "engram.memory.written"
MEMORY_PURGED = "engram.memory.purged"
AUDIT = "engram.audit"
DEAD_LETTER_PREFIX = "engram.dlq"

#: ``engram.feed.<org_id>.<event>``: one organization's copy of its ``memory.written``,
#: ``memory.purged`` and ``audit.<kind>`` events (the same bytes), in the ``ENGRAM_FEED`` stream —
#: what that organization's platform clients, ``GET /v1/events`` and its webhooks follow
#: (docs/adr/0102-tenant-feeds.md). ``<event>`` is the original subject without ``engram.``.
FEED_PREFIX = "engram.feed"
#: The events a feed carries (``audit`` stands for every ``audit.<kind>``).
FEED_EVENTS = ("memory.written", "memory.purged", "audit")

# -- request-reply (core NATS, queue groups) ----------------------------------------------
MEMORY_SAVE = "engram.memory.save"
RECALL = "engram.recall"
RECALL_EXPAND = "engram.recall.expand"
MEMORY_FEEDBACK = "engram.memory.feedback"
MEMORY_LIST = "engram.memory.list"
MEMORY_GET = "engram.memory.get"
MEMORY_DELETE = "engram.memory.delete"
MEMORY_PURGE = "engram.memory.purge"
MEMORY_PRUNE = "engram.memory.prune"
MEMORY_MANAGE = "engram.memory.manage"
MEMORY_EXPORT = "engram.memory.export"
CONFIG_GET = "engram.config.get"
CONFIG_PUT = "engram.config.put"
AUDIT_QUERY = "engram.audit.query"
AUDIT_VERIFY = "engram.audit.verify"
OPS_DEAD_LETTERS = "engram.ops.dead_letters"
OPS_LAG = "engram.ops.lag"
WEBHOOKS_REGISTER = "engram.webhooks.register"
WEBHOOKS_LIST = "engram.webhooks.list"
WEBHOOKS_DELETE = "engram.webhooks.delete"
WEBHOOKS_REPLAY = "engram.webhooks.replay"

# -- administration of tenants (request-reply, the deployment's operator: docs/adr/0104-admin-api.md)
ADMIN_ORG_CREATE = "engram.admin.org.create"
ADMIN_ORG_LIST = "engram.admin.org.list"
ADMIN_ORG_DISABLE = "engram.admin.org.disable"
ADMIN_AGENT_CONFIG_CREATE = "engram.admin.agent_config.create"
ADMIN_AGENT_CONFIG_LIST = "engram.admin.agent_config.list"
ADMIN_CLIENT_MINT = "engram.admin.client.mint"
ADMIN_CLIENT_ROTATE = "engram.admin.client.rotate"
ADMIN_CLIENT_REVOKE = "engram.admin.client.revoke"
ADMIN_CLIENT_LIST = "engram.admin.client.list"
ADMIN_TOKEN_MINT = "engram.admin.token.mint"  # noqa: S105 (a subject, not a secret)
ADMIN_TOKEN_REVOKE = "engram.admin.token.revoke"  # noqa: S105 (a subject, not a secret)
#: Core NATS, internal: governance-audit tells every service process that a token was revoked or
#: an organization disabled (``{"org_id"?, "token_id"?}``), so each refuses it at once.
ADMIN_REVOKED = "engram.admin.revoked"

# -- liveness (core NATS request-reply, internal) ------------------------------------------
#: ``engram.health.<service>``: any running instance of the service answers, in the service's
#: queue group, ``{"service": "<service>"}`` (the gateway's ``/readyz``; docs/adr/0057-readiness.md).
HEALTH_PREFIX = "engram.health"


def audit_subject(kind: str) -> str:
    """``engram.audit.<kind>`` with the dots of a kind like ``memory.saved`` kept as tokens."""
    return f"{AUDIT}.{kind}"


def feed_subject(org_id: object, event: str = ">") -> str:
    """``engram.feed.<org_id>.<event>`` (``event`` a subject without ``engram.``; ``>``: all of
    the organization's). ``org_id`` is a UUID, so it is one token and no wildcard."""
    return f"{FEED_PREFIX}.{org_id}.{event}"


def feed_event_of(subject: str) -> str | None:
    """The feed event of an Engram subject (``engram.audit.memory.saved`` →
    ``audit.memory.saved``), or None for a subject no feed carries."""
    event = subject.removeprefix("engram.")
    if event in (MEMORY_WRITTEN.removeprefix("engram."), MEMORY_PURGED.removeprefix("engram.")):
        return event
    # Audit records have two-token kinds; audit.query and audit.verify are requests.
    if event.startswith("audit.") and event.count(".") == 2:
        return event
    return None


def dead_letter_subject(source: str) -> str:
    return f"{DEAD_LETTER_PREFIX}.{source}"


def health_subject(service: str) -> str:
    return f"{HEALTH_PREFIX}.{service}"


def save_result_subject(request_id: str) -> str:
    return f"{SAVE_RESULT_PREFIX}.{request_id}"
