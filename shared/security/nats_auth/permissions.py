"""Who may do what on NATS: every Engram identity's subject permissions, as data.

One table serves every deployment: ``engram up`` renders it into its embedded server's config
(``shared.security.nats_auth.store``), and ``infra/nats/engram-auth.conf`` is the same table rendered for a
production server (``python -m shared.security.nats_auth.infra``; a test keeps the file in sync).

Subject permissions match whole tokens (``*`` one token, ``>`` the rest), so streams and consumers
are named one by one. Everything not allowed is refused. Services answer requests through
``allow_responses`` (one reply to the reply subject of a request they received), never through a
publish right on inboxes, and each identity subscribes only under its own inbox prefix, so nobody
can read a reply or a pulled message meant for someone else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from contracts import subjects as s
from contracts.operations import CONSUMERS, FEED, JETSTREAMS, OPERATIONS, Consumer, consumers_of

__all__ = [
    "ALL_IN_ONE",
    "EDGE_VECTOR_PROCESS",
    "GATEWAY",
    "PUBLIC_REQUESTS",
    "SERVICES",
    "Grant",
    "Permissions",
    "all_in_one_permissions",
    "audit_reader_permissions",
    "dead_letter_reader_permissions",
    "feed_follower_permissions",
    "feed_reader_permissions",
    "gateway_permissions",
    "platform_permissions",
    "process_name",
    "process_permissions",
    "service_inbox",
    "service_permissions",
]

SERVICES = ("ingest", "distill", "embed", "recall", "governance-audit")
#: The identity of a process that runs every service (``engram up``).
ALL_IN_ONE = "engram"
#: The HTTP gateway (``engram serve gateway``, and inside ``engram up``): a NATS client of its own.
GATEWAY = "gateway"
#: The services that share one process when vectors live in Qdrant Edge (in-process, opened by
#: one process at a time): the vector process of a deployment without a Qdrant server.
EDGE_VECTOR_PROCESS = ("embed", "recall")

#: The request-reply subjects platforms may call (SPEC 4.2, 5, 7): the public API besides
#: publishing ``engram.session.ended`` — every operation of the table.
PUBLIC_REQUESTS: tuple[str, ...] = tuple(op.subject for op in OPERATIONS)
#: A JetStream consumer name that is one subject token and no wildcard.
_CONSUMER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Grant:
    """Subjects allowed together, with the reason they are (rendered as a comment)."""

    why: str
    subjects: tuple[str, ...]


@dataclass(frozen=True)
class Permissions:
    """An identity's allow lists; ``publish``/``subscribe`` grants render in order."""

    publish: tuple[Grant, ...] = ()
    subscribe: tuple[Grant, ...] = ()
    allow_responses: bool = False
    #: Where this identity's replies and pulled messages arrive (its connection's inbox prefix).
    inbox_prefix: str = ""

    def publish_subjects(self) -> list[str]:
        return _flatten(self.publish)

    def subscribe_subjects(self) -> list[str]:
        return _flatten(self.subscribe)

    def __or__(self, other: Permissions) -> Permissions:
        """Both identities' rights (the all-in-one process; the development client)."""
        return Permissions(
            publish=_merge(self.publish, other.publish),
            subscribe=_merge(self.subscribe, other.subscribe),
            allow_responses=self.allow_responses or other.allow_responses,
            inbox_prefix=self.inbox_prefix or other.inbox_prefix,
        )


def _flatten(grants: Iterable[Grant]) -> list[str]:
    seen: dict[str, None] = {}
    for grant in grants:
        seen.update(dict.fromkeys(grant.subjects))
    return list(seen)


def _merge(first: tuple[Grant, ...], second: tuple[Grant, ...]) -> tuple[Grant, ...]:
    """Grants of both, each subject once (the first grant that names it keeps it)."""
    taken: set[str] = set()
    merged: list[Grant] = []
    for grant in (*first, *second):
        fresh = tuple(x for x in grant.subjects if x not in taken)
        taken.update(fresh)
        if fresh:
            same = next((i for i, g in enumerate(merged) if g.why == grant.why), None)
            if same is None:
                merged.append(Grant(grant.why, fresh))
            else:
                merged[same] = Grant(grant.why, merged[same].subjects + fresh)
    return tuple(merged)


def service_inbox(name: str) -> str:
    """The inbox prefix of a process running ``name`` (``services/runtime.py`` uses the same)."""
    return "_INBOX_engram" if name == ALL_IN_ONE else f"_INBOX_engram-{name}"


def _inbox(prefix: str) -> Grant:
    return Grant("its own inbox: replies, JetStream acks and pulled messages", (f"{prefix}.>",))


# -- services ---------------------------------------------------------------------------------

#: Every service process runs an outbox relay over the ONE shared outbox table, and a relay
#: publishes whichever committed rows it claims, whichever service wrote them.
_RELAY = Grant(
    "outbox relay",
    (
        s.MEMORY_WRITTEN,
        s.MEMORY_PURGED,
        f"{s.AUDIT}.*.*",
        f"{s.DEAD_LETTER_PREFIX}.>",
        # each organization's copy of those (shared/messaging/feed.py)
        s.feed_subject("*"),
    ),
)
#: Every service process runs ``shared.messaging.bus.ensure_streams`` at start-up for all four streams, and
#: reads their info for the usage metrics (``record_stream_usage``); nothing else of the stream
#: API (no DELETE, PURGE, MSG.DELETE, SNAPSHOT ...).
_ENSURE_STREAMS = Grant(
    "ensure_streams",
    tuple(f"$JS.API.STREAM.{op}.{d.name}" for d in JETSTREAMS for op in ("INFO", "CREATE", "UPDATE")),
)


def _consumer(consumer: Consumer) -> Grant:
    """A durable pull consumer: looked up, created with exactly this filter (the filter is part of
    the subject), fetched from, acked. No DELETE or UPDATE: a service cannot remove or rewire
    another's consumer."""
    stream, durable, filter_subject = consumer.stream.jetstream, consumer.durable, consumer.stream.subject
    return Grant(
        f"consumer {stream}/{durable} on {filter_subject}",
        (
            f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{filter_subject}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>",
        ),
    )


def _queue(queue: str, names: Iterable[str]) -> Grant:
    """Request subscriptions pinned to the service's queue group (``"<subject> <queue>"``)."""
    return Grant(f"requests, queue group {queue!r}", tuple(f"{n} {queue}" for n in names))


def _served(service: str) -> Grant:
    """The operations the table has ``service`` serve, in its queue group."""
    return _queue(service, [op.subject for op in OPERATIONS if op.queue_group == service])


def _service_rights(name: str) -> Permissions:
    """A service's rights apart from its inbox."""
    if name not in SERVICES:
        raise ValueError(f"unknown service {name!r}; choose from {', '.join(SERVICES)}")
    publish: list[Grant] = []
    # Every service answers its liveness probe (shared/observability/liveness.py), so every service responds.
    subscribe: list[Grant] = [
        Grant(f"liveness probe, queue group {name!r}", (f"{s.health_subject(name)} {name}",)),
        # Every process refuses a revoked token or a disabled organization at once.
        Grant("revocations announced by the admin API", (s.ADMIN_REVOKED,)),
    ]
    if name == "ingest":
        publish.append(Grant("hand-offs to distill", (s.SESSION_VALIDATED, s.MEMORY_SAVE_ACCEPTED)))
        subscribe.append(_served("ingest"))
        subscribe.append(Grant("outcomes of waiting saves", (f"{s.SAVE_RESULT_PREFIX}.*",)))
    elif name == "distill":
        publish.append(Grant("outcomes of waiting saves", (f"{s.SAVE_RESULT_PREFIX}.*",)))
    elif name == "recall":
        subscribe.append(_served("recall"))
        # The Redis result cache's invalidations (ids and metadata, never memory text).
        subscribe.append(_queue("recall-cache", [s.MEMORY_WRITTEN, s.MEMORY_PURGED]))
    elif name == "governance-audit":
        subscribe.append(_served("governance-audit"))
        # engram.ops.dead_letters reads ENGRAM_DLQ with ephemeral consumers the server removes
        # when idle: no DELETE, no acks (AckPolicy none). engram.ops.lag looks the durables up.
        publish.append(
            Grant(
                "ephemeral readers of ENGRAM_DLQ (engram.ops.dead_letters)",
                (
                    "$JS.API.CONSUMER.CREATE.ENGRAM_DLQ.>",
                    "$JS.API.CONSUMER.INFO.ENGRAM_DLQ.*",
                    "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_DLQ.*",
                ),
            )
        )
        publish.append(Grant("revocations (the admin API)", (s.ADMIN_REVOKED,)))
        publish.append(
            Grant(
                "consumer lag (engram.ops.lag)",
                tuple(f"$JS.API.CONSUMER.INFO.{c.stream.jetstream}.{c.durable}" for c in CONSUMERS),
            )
        )
    publish += [_RELAY, _ENSURE_STREAMS, *(_consumer(c) for c in consumers_of(name))]
    return Permissions(tuple(publish), tuple(subscribe), allow_responses=True)


def _with_inbox(rights: Permissions, prefix: str) -> Permissions:
    return Permissions(rights.publish, (*rights.subscribe, _inbox(prefix)), rights.allow_responses, prefix)


def service_permissions(name: str) -> Permissions:
    """What one service process (``engram serve <name>``) needs, and nothing more."""
    return _with_inbox(_service_rights(name), service_inbox(name))


def process_name(names: Iterable[str]) -> str:
    """The NATS identity of a process running ``names``: the service's own name for one,
    ``engram`` for all five, else the services joined by ``+`` in :data:`SERVICES` order
    (``embed+recall``, the Edge vector process)."""
    chosen = set(names)
    unknown = chosen - set(SERVICES)
    if unknown or not chosen:
        raise ValueError(f"unknown services {sorted(unknown)}; choose from {', '.join(SERVICES)}")
    if chosen == set(SERVICES):
        return ALL_IN_ONE
    return "+".join(name for name in SERVICES if name in chosen)


def process_permissions(names: Iterable[str]) -> Permissions:
    """What a process running ``names`` needs: the union of their rights, one inbox of its own."""
    name = process_name(names)
    if name == ALL_IN_ONE:
        return all_in_one_permissions()
    merged = Permissions()
    for service in name.split("+"):
        merged = merged | _service_rights(service)
    return _with_inbox(merged, service_inbox(name))


def all_in_one_permissions() -> Permissions:
    """``engram up``: every service in one process on one connection — the union of the five
    service identities, with the process's own inbox instead of five."""
    merged = Permissions()
    for name in SERVICES:
        merged = merged | _service_rights(name)
    return _with_inbox(merged, service_inbox(ALL_IN_ONE))


# -- clients ----------------------------------------------------------------------------------


def platform_permissions(
    inbox_prefix: str, *, org_id: UUID | None = None, consumer: str | None = None
) -> Permissions:
    """A platform client (an agent runner, a backend): publishes ended sessions (a JetStream
    publish needs nothing but the subject and a reply inbox for the ack) and calls the public
    requests. It reads nothing but its own inbox and, given its organization, that
    organization's feed (:func:`feed_follower_permissions`); it publishes no internal subject and
    touches no other ``$JS.API``. Tenancy still comes from the bearer token in each message."""
    rights = Permissions(
        publish=(
            Grant("ended sessions (JetStream; the ack comes back on its inbox)", (s.SESSION_ENDED,)),
            Grant("the public requests", PUBLIC_REQUESTS),
        ),
        subscribe=(_inbox(inbox_prefix),),
        inbox_prefix=inbox_prefix,
    )
    if org_id is None:
        return rights
    return rights | feed_follower_permissions(org_id, consumer or inbox_prefix.removeprefix("_INBOX_"))


def feed_follower_permissions(org_id: UUID, consumer: str) -> Permissions:
    """Following one organization's feed (``engram.feed.<org_id>.>``, docs/adr/0102-tenant-feeds.md)
    and nothing else: live, as a core subscription; or durably, through the one consumer named
    ``consumer`` (the client's name: unique to it) on ENGRAM_FEED, created only with a filter
    inside its organization — the filter is part of the create subject, and nats-server refuses a
    request whose filter differs from it. No DURABLE.CREATE (it would not check the filter), no
    DIRECT.GET or STREAM.MSG.GET (they read any message), no other consumer's name."""
    feed, stream = s.feed_subject(org_id), FEED.jetstream
    if not _CONSUMER_NAME.fullmatch(consumer):
        raise ValueError(f"not a consumer name: {consumer!r}")
    return Permissions(
        publish=(
            Grant(
                f"its own consumer {stream}/{consumer}, filtered within {feed}",
                (
                    f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}.{feed}",
                    f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
                    f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}",
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
                    f"$JS.ACK.{stream}.{consumer}.>",
                ),
            ),
        ),
        subscribe=(Grant("its organization's feed, live", (feed,)),),
    )


def gateway_permissions() -> Permissions:
    """The HTTP gateway: what a platform client may do — publish ended sessions (the JetStream ack
    comes back on its inbox) and make the public requests, each with its HTTP caller's token
    unchanged — under its own inbox, ``_INBOX_engram-gateway``. No internal subject, no
    ``$JS.API``, no subscription but its inbox: it holds no business logic, so it needs no more —
    but for asking whether each service runs (``/readyz``; shared/observability/liveness.py) and for reading a
    caller's feed (``GET /v1/events``): ephemeral consumers on ENGRAM_FEED whose filter is one
    organization's feed, no acks (``AckPolicy.NONE``), removed by the server once idle (no DELETE).
    Which organization's is the verified token's (services/gateway/events.py)."""
    stream = FEED.jetstream
    liveness = Permissions(
        publish=(
            Grant("liveness probes (/readyz)", (f"{s.HEALTH_PREFIX}.*",)),
            Grant(
                f"ephemeral readers of one organization's feed on {stream} (GET /v1/events)",
                (
                    f"$JS.API.CONSUMER.CREATE.{stream}.*.{s.feed_subject('*')}",
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
                ),
            ),
        )
    )
    return platform_permissions(service_inbox(GATEWAY)) | liveness


def _stream_reader(stream: str, inbox_prefix: str) -> Permissions:
    """Pull consumers of its own on ``stream`` only, which it must name (looking a stream up by
    subject is not allowed)."""
    return Permissions(
        publish=(
            Grant(
                f"pull consumers of its own on {stream}, durable or ephemeral",
                (
                    f"$JS.API.STREAM.INFO.{stream}",
                    f"$JS.API.CONSUMER.CREATE.{stream}.>",
                    f"$JS.API.CONSUMER.INFO.{stream}.*",
                    f"$JS.API.CONSUMER.DELETE.{stream}.*",
                    f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
                    f"$JS.ACK.{stream}.>",
                ),
            ),
        ),
        subscribe=(_inbox(inbox_prefix),),
        inbox_prefix=inbox_prefix,
    )


def feed_reader_permissions(inbox_prefix: str) -> Permissions:
    """Every organization's feed (``engram up``'s development client, whose operator runs it all)."""
    return _stream_reader(FEED.jetstream, inbox_prefix)


def audit_reader_permissions(inbox_prefix: str) -> Permissions:
    """An audit consumer (SIEM export, compliance, ``engram audit tail``) on ENGRAM_AUDIT."""
    return _stream_reader("ENGRAM_AUDIT", inbox_prefix)


def dead_letter_reader_permissions(inbox_prefix: str) -> Permissions:
    """An operator reading rejected events (``engram dlq``) on ENGRAM_DLQ. Dead letters keep the
    original bytes with PII replaced; `engram dlq` prints their metadata only."""
    return _stream_reader("ENGRAM_DLQ", inbox_prefix)
