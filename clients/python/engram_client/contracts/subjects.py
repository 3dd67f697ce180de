"""Subject names and stream definitions (SPEC section 6).

Stream definitions are plain data here; ``shared.bus`` turns them into JetStream configs, so
this package stays free of any client library.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AUDIT",
    "AUDIT_QUERY",
    "AUDIT_VERIFY",
    "CONFIG_GET",
    "CONFIG_PUT",
    "DEAD_LETTER_PREFIX",
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
    "STREAMS",
    "StreamDef",
    "audit_subject",
    "dead_letter_subject",
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

# -- liveness (core NATS request-reply, internal) ------------------------------------------
#: ``engram.health.<service>``: any running instance of the service answers, in the service's
#: queue group, ``{"service": "<service>"}`` (the gateway's ``/readyz``; docs/adr/0057-readiness.md).
HEALTH_PREFIX = "engram.health"


def audit_subject(kind: str) -> str:
    """``engram.audit.<kind>`` with the dots of a kind like ``memory.saved`` kept as tokens."""
    return f"{AUDIT}.{kind}"


def dead_letter_subject(source: str) -> str:
    return f"{DEAD_LETTER_PREFIX}.{source}"


def health_subject(service: str) -> str:
    return f"{HEALTH_PREFIX}.{service}"


def save_result_subject(request_id: str) -> str:
    return f"{SAVE_RESULT_PREFIX}.{request_id}"


@dataclass(frozen=True)
class StreamDef:
    """A JetStream stream as the platform contract describes it."""

    name: str
    subjects: tuple[str, ...]
    #: seconds a message is kept; 0 keeps it until limits remove it.
    max_age_seconds: int
    #: the duplicate-detection window for ``Nats-Msg-Id``.
    duplicate_window_seconds: float = 120
    max_msg_bytes: int = 1024 * 1024
    description: str = ""
    #: A message is removed once its one consumer acknowledges it (JetStream work-queue retention).
    work_queue: bool = False


# Audit query/verify are request-reply on the same ``engram.audit.*`` namespace; the audit
# stream must not capture them, so it binds the record kinds explicitly (``engram.audit.*.*``)
# — every record kind has two tokens (``memory.saved``, ``session.rejected`` ...).
STREAMS: tuple[StreamDef, ...] = (
    StreamDef(
        name="ENGRAM_SESSIONS",
        subjects=(SESSION_ENDED, SESSION_VALIDATED, MEMORY_SAVE_ACCEPTED),
        # Sessions and saves carry raw traces and memory text: a work queue drops each message as
        # soon as it has been processed, so no text outlives its processing (an erased memory must
        # not live on in the stream); max_age bounds what waits through a long outage.
        max_age_seconds=24 * 3600,
        # The least nats-server allows (0 would mean its two-minute default). Platforms publish
        # here and choose their own Nats-Msg-Id, so an id in this window belongs to whoever
        # published it first: nothing relies on it. ingest and distill drop repeats by their inbox
        # rows, per organization and only after the token is verified (docs/adr/0081-session-dedupe.md).
        duplicate_window_seconds=0.1,
        description="Sessions and elective saves on their way in; removed once processed.",
        work_queue=True,
    ),
    StreamDef(
        name="ENGRAM_MEMORY",
        subjects=(MEMORY_WRITTEN, MEMORY_PURGED),
        max_age_seconds=7 * 24 * 3600,
        description="References to written and purged memories; never memory text.",
    ),
    StreamDef(
        name="ENGRAM_AUDIT",
        subjects=(f"{AUDIT}.*.*",),
        max_age_seconds=30 * 24 * 3600,
        description="The audit trail for audit consumers (the chain of record is Postgres).",
    ),
    StreamDef(
        name="ENGRAM_DLQ",
        subjects=(f"{DEAD_LETTER_PREFIX}.>",),
        max_age_seconds=7 * 24 * 3600,
        description="Events that could not be processed, with the reason.",
    ),
)
