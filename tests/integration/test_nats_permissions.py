"""The least-privilege NATS identities of ``infra/nats/engram-auth.conf`` on a real nats-server.

Two checks. The permission matrix: every user's allowed publishes and subscriptions go through
and a wide set of forbidden ones — including what an attacker holding the ``platform`` key
would try — are refused by the server. And end to end: every service runs under its own nkey
(one broker connection each, through ``services.runtime.running_services``), a platform
publishes a session and makes requests as ``platform``, an ``audit-reader`` reads the audit
stream, and the server logs no permission violation at all.

The server reports a refused publish or subscription asynchronously, as
``-ERR 'Permissions Violation for Publish to "<subject>"'``, which nats-py hands to the
connection's error callback (the connection stays open). To decide "allowed" without waiting
for an error that never comes, each operation is followed by a publish that every user is
refused (a barrier): the server answers in order, so once the barrier's error has arrived,
whatever the operation caused has arrived before it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import nats
import pytest
from nats.aio.client import Client
from pydantic import SecretStr
from sqlalchemy import func, select

from contracts import subjects
from contracts.operations import JETSTREAMS as STREAMS
from services.runtime import SERVICES, build_embedder, build_vector_index, running_services
from shared.embedded.nats_server import NatsServerProcess, find_nats_server, free_port, port_in_use
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.infra import INFRA_AUTH_FILE, INFRA_USERS, nkey_variable
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import PUBLIC_REQUESTS
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES, OUTBOX
from tests.nats_probe import Probe, cannot_connect
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration

AUTH_CONF = INFRA_AUTH_FILE
USERS = INFRA_USERS
#: External users have their own inbox prefix (see the config's comments); services use nats-py's.
INBOX_PREFIX = {
    "platform": "_INBOX_platform",
    "audit-reader": "_INBOX_audit_reader",
    "engram": "_INBOX_engram",
    "gateway": "_INBOX_engram-gateway",
    "embed+recall": "_INBOX_engram-embed+recall",
    # services/runtime.py: each service process gets its own inbox prefix.
    **{
        name: f"_INBOX_engram-{name}" for name in ("ingest", "distill", "embed", "recall", "governance-audit")
    },
}


class AuthNatsServer(NatsServerProcess):
    """The embedded launcher's config plus ``include "engram-auth.conf"`` (the checked-in file,
    copied beside it because nats-server resolves includes relative to the including file)."""

    def __init__(self, store_dir: Path) -> None:
        super().__init__(store_dir)
        self.seeds = {user: new_user_seed() for user in USERS}

    def _write_config(self) -> Path:
        conf = super()._write_config()
        shutil.copy(AUTH_CONF, self.store_dir / AUTH_CONF.name)
        with conf.open("a") as f:
            f.write(f'include "{AUTH_CONF.name}"\n')
        return conf

    async def start(self, timeout_s: float = 15.0) -> None:
        # The public keys reach the server only through its environment, as in a deployment.
        with pytest.MonkeyPatch.context() as env:
            for user, seed in self.seeds.items():
                env.setenv(nkey_variable(user), public_key_of(seed))
            await super().start(timeout_s)

    def options_for(self, user: str, seed: str | None = None) -> dict[str, Any]:
        return {"nkeys_seed_str": seed or self.seeds[user], "inbox_prefix": INBOX_PREFIX.get(user, "_INBOX")}

    def log_lines(self, *needles: str) -> list[str]:
        text = (self.store_dir / "nats-server.log").read_text(errors="replace")
        return [line for line in text.splitlines() if any(n in line for n in needles)]


@asynccontextmanager
async def auth_nats_server(store_dir: Path) -> AsyncIterator[AuthNatsServer]:
    server = AuthNatsServer(store_dir)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="module")
async def nats_proc(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NatsServerProcess]:
    """This module's NATS requires the Engram users (overrides the conftest's open server; the
    ``settings`` fixture's URL carries no user, so every connection here names its own)."""
    async with auth_nats_server(tmp_path_factory.mktemp("nats-auth")) as server:
        yield server


# -- the permission matrix ------------------------------------------------------------------

JS_ACK_SAMPLE = "1.1.1.1700000000000000000.0"  # delivered.stream_seq.consumer_seq.timestamp.pending
RELAY = [
    "engram.memory.written",
    "engram.memory.purged",
    "engram.audit.memory.saved",
    "engram.audit.session.rejected",
    "engram.audit.config.changed",
    "engram.dlq.session",
    "engram.dlq.distill",
    f"engram.feed.{uuid4()}.memory.written",
    f"engram.feed.{uuid4()}.audit.memory.saved",
]
ENSURE_STREAMS = [f"$JS.API.STREAM.{op}.{s.name}" for s in STREAMS for op in ("INFO", "CREATE", "UPDATE")]
REQUESTS = [
    "engram.memory.save",
    "engram.session.submit",
    "engram.recall",
    "engram.recall.expand",
    "engram.memory.feedback",
    *(f"engram.memory.{op}" for op in ("list", "get", "delete", "purge", "prune", "manage", "export")),
    "engram.config.get",
    "engram.config.put",
    "engram.audit.query",
    "engram.audit.verify",
    "engram.ops.dead_letters",
    "engram.ops.lag",
    # The admin API (tenant.admin): served by governance-audit like the governance requests.
    *(f"engram.admin.org.{op}" for op in ("create", "list", "disable")),
    *(f"engram.admin.agent_config.{op}" for op in ("create", "list")),
    *(f"engram.admin.client.{op}" for op in ("mint", "rotate", "revoke", "list")),
    *(f"engram.admin.token.{op}" for op in ("mint", "revoke")),
    "engram.webhooks.register",
    "engram.webhooks.list",
    "engram.webhooks.delete",
    "engram.webhooks.replay",
]
RECALL = ["engram.recall", "engram.recall.expand", "engram.memory.feedback"]
INGEST = ["engram.memory.save", "engram.session.submit"]
GOVERNANCE = [s for s in REQUESTS if s not in INGEST and s not in RECALL]
CONSUMERS = {  # (stream, durable, filter subject) per service, as services/*/router.py declare them
    "ingest": [("ENGRAM_SESSIONS", "ingest", "engram.session.ended")],
    "distill": [
        ("ENGRAM_SESSIONS", "distill", "engram.session.validated"),
        ("ENGRAM_SESSIONS", "distill-saves", "engram.save.accepted"),
    ],
    "embed": [
        ("ENGRAM_MEMORY", "embed", "engram.memory.written"),
        ("ENGRAM_MEMORY", "embed-purge", "engram.memory.purged"),
    ],
    "recall": [],
    "governance-audit": [("ENGRAM_FEED", "webhooks", "engram.feed.>")],
}
ALL_CONSUMERS = [c for cs in CONSUMERS.values() for c in cs]


def consumer_api(stream: str, durable: str, filter_subject: str) -> list[str]:
    return [
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{filter_subject}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.{JS_ACK_SAMPLE}",
    ]


#: What no service may do: administer streams and consumers, speak for a platform, forge replies,
#: or listen to everything.
SERVICE_FORBIDDEN_PUB = [
    "engram.session.ended",
    *REQUESTS,
    "_INBOX.abc.1",
    "_INBOX_platform.abc.1",
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.CREATE.EVIL",
    "$JS.API.STREAM.DELETE.ENGRAM_AUDIT",
    "$JS.API.STREAM.DELETE.ENGRAM_SESSIONS",
    "$JS.API.STREAM.PURGE.ENGRAM_MEMORY",
    "$JS.API.STREAM.MSG.DELETE.ENGRAM_AUDIT",
    "$JS.API.STREAM.SNAPSHOT.ENGRAM_AUDIT",
    "$JS.API.STREAM.MSG.GET.ENGRAM_SESSIONS",
    "$JS.API.DIRECT.GET.ENGRAM_SESSIONS",
    "$JS.API.CONSUMER.CREATE.ENGRAM_SESSIONS",
    "$JS.API.CONSUMER.CREATE.ENGRAM_AUDIT.spy.engram.audit.>",
    "$JS.API.CONSUMER.DELETE.ENGRAM_SESSIONS.ingest",
    "$JS.API.CONSUMER.DELETE.ENGRAM_MEMORY.embed",
    "$JS.API.CONSUMER.DURABLE.CREATE.ENGRAM_SESSIONS.ingest",
    "zz.anything",
]
SERVICE_FORBIDDEN_SUB: list[tuple[str, str | None]] = [
    (">", None),
    ("engram.>", None),
    ("$JS.API.>", None),
    ("$JS.ACK.>", None),
    ("engram.session.ended", None),
    ("engram.memory.written", None),
    ("engram.audit.>", None),
    ("_INBOX_platform.>", None),
    ("_INBOX_audit_reader.>", None),
]


@dataclass
class UserCase:
    allowed_pub: list[str]
    allowed_sub: list[tuple[str, str | None]]
    refused_pub: list[str]
    refused_sub: list[tuple[str, str | None]]


def _service_case(name: str, pub: list[str], sub: Sequence[tuple[str, str | None]]) -> UserCase:
    """A service: ``pub``/``sub`` are its own subjects; stream set-up, the outbox relay and its
    consumers are added here, and every other consumer's API is expected to be refused."""
    own = [api for c in CONSUMERS[name] for api in consumer_api(*c)]
    others = [api for c in ALL_CONSUMERS if c not in CONSUMERS[name] for api in consumer_api(*c)]
    # Its own durable under another filter, or another durable name: refused, too.
    mismatched = [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.engram.dlq.session"
        for stream, durable, _ in CONSUMERS[name]
    ] + [f"$JS.API.CONSUMER.CREATE.{stream}.sneaky.{filt}" for stream, _, filt in CONSUMERS[name]]
    liveness = f"engram.health.{name}"  # shared/observability/liveness.py: in its own queue group only
    return UserCase(
        allowed_pub=[*pub, *RELAY, *ENSURE_STREAMS, *own],
        allowed_sub=[
            *sub,
            (liveness, name),
            (f"_INBOX_engram-{name}.>", None),
            (f"_INBOX_engram-{name}.abc.*", None),
        ],
        refused_pub=[*SERVICE_FORBIDDEN_PUB, *others, *mismatched, liveness],
        # Not the default inbox, nor another service's: what it pulled is its own business.
        refused_sub=[
            *SERVICE_FORBIDDEN_SUB,
            ("_INBOX.>", None),
            *((f"_INBOX_engram-{other}.>", None) for other in CONSUMERS if other != name),
            (liveness, None),
            ("engram.health.*", name),
        ],
    )


def _cases() -> dict[str, UserCase]:
    cases = {
        "ingest": _service_case(
            "ingest",
            ["engram.session.validated", "engram.save.accepted"],
            [*((subject, "ingest") for subject in INGEST), (f"engram.save.result.{uuid4()}", None)],
        ),
        "distill": _service_case("distill", [f"engram.save.result.{uuid4()}"], []),
        "embed": _service_case("embed", [], []),
        "recall": _service_case(
            "recall",
            [],
            [(s, "recall") for s in RECALL]
            # the result cache's invalidations (services/recall/router.py)
            + [("engram.memory.written", "recall-cache"), ("engram.memory.purged", "recall-cache")],
        ),
        "governance-audit": _service_case(
            "governance-audit", [], [(s, "governance-audit") for s in GOVERNANCE]
        ),
    }
    # What each service must not do that another one does.
    cases["ingest"].refused_pub += [f"engram.save.result.{uuid4()}"]
    cases["ingest"].refused_sub += [
        ("engram.memory.save", None),  # outside its queue group
        ("engram.memory.save", "other"),
        ("engram.recall", "recall"),
        ("engram.session.validated", None),
    ]
    cases["distill"].refused_pub += ["engram.session.validated", "engram.save.accepted"]
    cases["distill"].refused_sub += [("engram.save.result.*", None), ("engram.memory.save", "ingest")]
    cases["embed"].refused_pub += [
        "engram.session.validated",
        "engram.save.accepted",
        f"engram.save.result.{uuid4()}",
    ]
    cases["embed"].refused_sub += [("engram.memory.purged", None), ("engram.recall", "recall")]
    cases["recall"].refused_pub += ["engram.session.validated", "engram.save.accepted"]
    cases["recall"].refused_sub += [
        ("engram.recall", None),
        ("engram.recall", "governance-audit"),
        ("engram.config.get", "governance-audit"),
        ("engram.memory.save", "ingest"),
        ("engram.memory.written", "other"),
        ("engram.memory.purged", None),
        ("engram.audit.*.*", "recall-cache"),
    ]
    cases["governance-audit"].refused_pub += ["engram.session.validated", "engram.save.accepted"]
    # engram.ops.dead_letters: ephemeral readers of ENGRAM_DLQ (no delete, no acks);
    # engram.ops.lag: every durable's info.
    ops_reads = [
        "$JS.API.CONSUMER.CREATE.ENGRAM_DLQ.ops-1",
        "$JS.API.CONSUMER.CREATE.ENGRAM_DLQ.ops-1.engram.dlq.session",
        "$JS.API.CONSUMER.INFO.ENGRAM_DLQ.ops-1",
        "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_DLQ.ops-1",
        *(f"$JS.API.CONSUMER.INFO.{st}.{d}" for st, d, _ in ALL_CONSUMERS),
    ]
    governance = cases["governance-audit"]
    governance.allowed_pub += ops_reads
    governance.refused_pub = [x for x in governance.refused_pub if x not in ops_reads] + [
        "$JS.API.CONSUMER.DELETE.ENGRAM_DLQ.ops-1",
        f"$JS.ACK.ENGRAM_DLQ.ops-1.{JS_ACK_SAMPLE}",
        "$JS.API.STREAM.MSG.GET.ENGRAM_DLQ",
    ]
    cases["governance-audit"].refused_sub += [
        ("engram.config.get", None),
        ("engram.recall", "recall"),
        ("engram.memory.save", "ingest"),
    ]
    # engram (every service in one process): exactly the union of the five, with one inbox.
    services = [cases[name] for name in CONSUMERS]
    own_inboxes = {f"_INBOX_engram-{name}" for name in CONSUMERS}
    cases["engram"] = UserCase(
        allowed_pub=list(dict.fromkeys(x for c in services for x in c.allowed_pub)),
        allowed_sub=[
            *dict.fromkeys(
                x for c in services for x in c.allowed_sub if x[0].split(".")[0] not in own_inboxes
            ),
            ("_INBOX_engram.>", None),
            ("_INBOX_engram.abc.*", None),
        ],
        refused_pub=[
            *SERVICE_FORBIDDEN_PUB,
            # its consumers under another filter or another durable name
            *(f"$JS.API.CONSUMER.CREATE.{st}.{d}.engram.dlq.session" for st, d, _ in ALL_CONSUMERS),
            *(f"$JS.API.CONSUMER.CREATE.{st}.sneaky.{f}" for st, _, f in ALL_CONSUMERS),
        ],
        refused_sub=[
            *SERVICE_FORBIDDEN_SUB,
            ("_INBOX.>", None),
            *((f"{inbox}.>", None) for inbox in sorted(own_inboxes)),
            # request subjects only in their queue groups
            ("engram.recall", None),
            ("engram.memory.save", None),
            ("engram.config.get", "recall"),
            ("engram.health.distill", None),
        ],
    )
    # embed+recall (the Edge vector process): the union of the two, with one inbox of its own.
    pair = [cases["embed"], cases["recall"]]
    pair_inbox = "_INBOX_engram-embed+recall"
    cases["embed+recall"] = UserCase(
        allowed_pub=list(dict.fromkeys(x for c in pair for x in c.allowed_pub)),
        allowed_sub=[
            *dict.fromkeys(x for c in pair for x in c.allowed_sub if x[0].split(".")[0] not in own_inboxes),
            (f"{pair_inbox}.>", None),
            (f"{pair_inbox}.abc.*", None),
        ],
        refused_pub=[
            *SERVICE_FORBIDDEN_PUB,
            *(api for c in ALL_CONSUMERS if c not in CONSUMERS["embed"] for api in consumer_api(*c)),
            "engram.session.validated",
            "engram.save.accepted",
            f"engram.save.result.{uuid4()}",
        ],
        refused_sub=[
            *SERVICE_FORBIDDEN_SUB,
            ("_INBOX.>", None),
            ("_INBOX_engram.>", None),
            *((f"{inbox}.>", None) for inbox in sorted(own_inboxes)),
            ("engram.recall", None),
            ("engram.memory.save", "ingest"),
            ("engram.config.get", "governance-audit"),
        ],
    )
    cases["platform"] = UserCase(
        allowed_pub=["engram.session.ended", *REQUESTS],
        allowed_sub=[("_INBOX_platform.>", None), ("_INBOX_platform.abc.*", None)],
        refused_pub=[
            # forging internal events (a lesson, an erasure, an audit record, a verified session)
            "engram.memory.written",
            "engram.memory.purged",
            "engram.session.validated",
            "engram.save.accepted",
            f"engram.save.result.{uuid4()}",
            "engram.audit.memory.saved",
            "engram.dlq.session",
            # the services' liveness probes are the gateway's to ask
            "engram.health.ingest",
            # forging replies into the services' inboxes
            "_INBOX.abc.1",
            "_INBOX_audit_reader.abc.1",
            # reading or wrecking the streams through the JetStream API
            "$JS.API.INFO",
            "$JS.API.STREAM.NAMES",
            "$JS.API.STREAM.INFO.ENGRAM_SESSIONS",
            "$JS.API.STREAM.CREATE.EVIL",
            "$JS.API.STREAM.UPDATE.ENGRAM_SESSIONS",
            "$JS.API.STREAM.DELETE.ENGRAM_AUDIT",
            "$JS.API.STREAM.PURGE.ENGRAM_SESSIONS",
            "$JS.API.STREAM.MSG.GET.ENGRAM_MEMORY",
            "$JS.API.DIRECT.GET.ENGRAM_SESSIONS",
            "$JS.API.CONSUMER.CREATE.ENGRAM_MEMORY.spy.engram.memory.written",
            "$JS.API.CONSUMER.CREATE.ENGRAM_SESSIONS.spy.engram.session.ended",
            "$JS.API.CONSUMER.CREATE.ENGRAM_AUDIT.spy.engram.audit.>",
            *(api for c in ALL_CONSUMERS for api in consumer_api(*c)),
            "zz.anything",
        ],
        refused_sub=[
            # other tenants' traffic
            ("engram.memory.written", None),
            ("engram.memory.written", "recall-cache"),
            ("engram.memory.purged", None),
            ("engram.audit.>", None),
            ("engram.audit.*.*", None),
            ("engram.session.ended", None),
            ("engram.session.validated", None),
            ("engram.save.accepted", None),
            ("engram.save.result.*", None),
            ("engram.dlq.>", None),
            # every organization's feed (a platform user of no organization follows none)
            ("engram.feed.>", None),
            (f"engram.feed.{uuid4()}.>", None),
            # answering liveness probes as a service would
            ("engram.health.distill", "distill"),
            # other tenants' requests, with their tokens (posing as a service)
            ("engram.recall", None),
            ("engram.recall", "recall"),
            ("engram.memory.save", "ingest"),
            ("engram.config.get", "governance-audit"),
            ("engram.audit.query", None),
            # replies and pulled messages meant for the services or the audit reader
            ("_INBOX.>", None),
            ("_INBOX.abc.*", None),
            ("_INBOX_audit_reader.>", None),
            ("$JS.API.>", None),
            ("$JS.ACK.>", None),
            ("engram.>", None),
            (">", None),
        ],
    )
    cases["audit-reader"] = UserCase(
        allowed_pub=[
            "$JS.API.STREAM.INFO.ENGRAM_AUDIT",
            "$JS.API.CONSUMER.CREATE.ENGRAM_AUDIT.siem",
            "$JS.API.CONSUMER.CREATE.ENGRAM_AUDIT.siem.engram.audit.*.*",
            "$JS.API.CONSUMER.INFO.ENGRAM_AUDIT.siem",
            "$JS.API.CONSUMER.DELETE.ENGRAM_AUDIT.siem",
            "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_AUDIT.siem",
            f"$JS.ACK.ENGRAM_AUDIT.siem.{JS_ACK_SAMPLE}",
        ],
        allowed_sub=[("_INBOX_audit_reader.>", None)],
        refused_pub=[
            "engram.session.ended",
            *REQUESTS,
            *RELAY,
            "engram.session.validated",
            f"engram.save.result.{uuid4()}",
            "_INBOX.abc.1",
            "_INBOX_platform.abc.1",
            # tampering with the audit stream itself
            "$JS.API.STREAM.CREATE.ENGRAM_AUDIT",
            "$JS.API.STREAM.UPDATE.ENGRAM_AUDIT",
            "$JS.API.STREAM.DELETE.ENGRAM_AUDIT",
            "$JS.API.STREAM.PURGE.ENGRAM_AUDIT",
            "$JS.API.STREAM.MSG.DELETE.ENGRAM_AUDIT",
            # any other stream
            "$JS.API.STREAM.NAMES",
            "$JS.API.STREAM.INFO.ENGRAM_SESSIONS",
            "$JS.API.STREAM.MSG.GET.ENGRAM_SESSIONS",
            "$JS.API.CONSUMER.CREATE.ENGRAM_SESSIONS.spy.engram.session.ended",
            "$JS.API.CONSUMER.CREATE.ENGRAM_MEMORY.spy",
            "$JS.API.CONSUMER.CREATE.ENGRAM_DLQ.spy",
            *(api for c in ALL_CONSUMERS for api in consumer_api(*c)),
            "zz.anything",
        ],
        refused_sub=[
            ("engram.audit.>", None),
            ("engram.audit.*.*", None),
            ("engram.audit.query", None),
            ("engram.session.ended", None),
            ("_INBOX.>", None),
            ("_INBOX_platform.>", None),
            ("$JS.API.>", None),
            ("engram.>", None),
            (">", None),
        ],
    )
    # The HTTP gateway: a platform client's rights under its own inbox, and the liveness probes.
    # GET /v1/events: ephemeral readers of one organization's feed each. Pulling is by consumer
    # name, so the gateway could pull any feed consumer's messages (the webhooks durable's too:
    # unacked, they come back after ack_wait) — it may read every organization's feed anyway.
    gateway_feed = [
        f"$JS.API.CONSUMER.CREATE.ENGRAM_FEED.sse1.engram.feed.{uuid4()}.>",
        "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_FEED.sse1",
        "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_FEED.webhooks",
    ]
    cases["gateway"] = UserCase(
        allowed_pub=[
            *cases["platform"].allowed_pub,
            *(f"engram.health.{name}" for name in CONSUMERS),
            *gateway_feed,
        ],
        allowed_sub=[("_INBOX_engram-gateway.>", None), ("_INBOX_engram-gateway.abc.*", None)],
        refused_pub=[
            *(
                x
                for x in cases["platform"].refused_pub
                if not x.startswith("engram.health.") and x not in gateway_feed
            ),
            # the feed: only with one organization's filter; no other consumer API
            "$JS.API.CONSUMER.CREATE.ENGRAM_FEED.sse1",
            "$JS.API.CONSUMER.CREATE.ENGRAM_FEED",
            "$JS.API.CONSUMER.CREATE.ENGRAM_FEED.sse1.engram.feed.>",
            "$JS.API.CONSUMER.CREATE.ENGRAM_FEED.webhooks.engram.feed.>",
            "$JS.API.CONSUMER.DURABLE.CREATE.ENGRAM_FEED.sse1",
            "$JS.API.CONSUMER.DELETE.ENGRAM_FEED.webhooks",
            "$JS.API.CONSUMER.INFO.ENGRAM_FEED.webhooks",
            f"$JS.ACK.ENGRAM_FEED.webhooks.{JS_ACK_SAMPLE}",
            "$JS.API.STREAM.MSG.GET.ENGRAM_FEED",
            "$JS.API.DIRECT.GET.ENGRAM_FEED",
        ],
        refused_sub=[
            *((subject, queue) for subject, queue in cases["platform"].refused_sub),
            ("_INBOX_platform.>", None),
            ("engram.health.*", None),
        ],
    )
    return cases


async def test_each_user_may_do_exactly_what_its_role_needs(tmp_path: Path) -> None:
    """Every user's allowed publishes and subscriptions pass; every forbidden one is refused
    (none unexpectedly allowed); nobody gets in without a known nkey."""
    tried = refused = 0
    wrong: list[str] = []
    async with auth_nats_server(tmp_path) as server:
        # No stream exists on this server: a publish that got through would change nothing.
        for user, case in _cases().items():
            probe = await Probe.connect(server.url, f"probe-{user}", **server.options_for(user))
            try:
                for subject in case.allowed_pub:
                    tried += 1
                    if await probe.publish_refused(subject):
                        refused += 1
                        wrong.append(f"{user}: publish {subject} refused but needed")
                for subject, queue in case.allowed_sub:
                    tried += 1
                    if await probe.subscribe_refused(subject, queue):
                        refused += 1
                        wrong.append(f"{user}: subscribe {subject} [{queue}] refused but needed")
                for subject in case.refused_pub:
                    tried += 1
                    if await probe.publish_refused(subject):
                        refused += 1
                    else:
                        wrong.append(f"{user}: publish {subject} ALLOWED")
                for subject, queue in case.refused_sub:
                    tried += 1
                    if await probe.subscribe_refused(subject, queue):
                        refused += 1
                    else:
                        wrong.append(f"{user}: subscribe {subject} [{queue}] ALLOWED")
                assert probe.nc.is_connected, f"{user}: a refusal closed the connection"
            finally:
                await probe.nc.close()

        plain = f"nats://{server.host}:{server.port}"
        logins: list[tuple[str, str, dict[str, Any]]] = [
            ("anonymous", plain, {}),
            ("a user name and password", f"nats://platform:pw-guess@{server.host}:{server.port}", {}),
            ("a token", plain, {"token": "guess"}),
        ]
        # A key the server does not know, with each user's inbox prefix.
        logins += [
            (f"{user} prefix, unknown key", plain, server.options_for(user, new_user_seed()))
            for user in USERS
        ]
        for label, url, options in logins:
            tried += 1
            if await cannot_connect(url, **options):
                refused += 1
            else:
                wrong.append(f"login accepted: {label}")
    expected_refusals = sum(len(c.refused_pub) + len(c.refused_sub) for c in _cases().values()) + len(logins)
    print(f"\nNATS permissions: {tried} operations tried, {refused} refused, {len(wrong)} unexpected")
    assert wrong == []
    assert refused == expected_refusals


async def test_the_production_config_is_authenticated_as_shipped(tmp_path: Path) -> None:
    """infra/nats/nats-server.conf as checked in (only its listen address and store moved to a
    scratch place) refuses an anonymous client and admits a service by its key."""
    port = free_port()
    shutil.copy(AUTH_CONF, tmp_path / AUTH_CONF.name)
    shipped = (AUTH_CONF.parent / "nats-server.conf").read_text()
    moved = shipped.replace("0.0.0.0:4222", f"127.0.0.1:{port}").replace(
        "/var/lib/nats/jetstream", str(tmp_path / "js")
    )
    assert moved != shipped
    (tmp_path / "nats-server.conf").write_text(moved)
    seeds = {user: new_user_seed() for user in USERS}
    env = {**os.environ, **{nkey_variable(u): public_key_of(seed) for u, seed in seeds.items()}}
    log = (tmp_path / "nats.log").open("wb")
    proc = subprocess.Popen(
        [find_nats_server(), "-c", str(tmp_path / "nats-server.conf")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"nats://127.0.0.1:{port}"
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while not port_in_use(port):
            assert proc.poll() is None, (tmp_path / "nats.log").read_text()
            assert loop.time() < deadline, "nats-server did not listen"
            await asyncio.sleep(0.05)
        assert await cannot_connect(url)
        nc = await nats.connect(url, nkeys_seed_str=seeds["ingest"], inbox_prefix="_INBOX_engram-ingest")
        assert nc.is_connected
        await nc.close()
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_every_contract_subject_is_in_the_matrix() -> None:
    """A request-reply subject added to the contract must get its permissions (the config's
    platform and service blocks, and this matrix) before this passes."""
    constants = {v for k, v in vars(subjects).items() if k.isupper() and isinstance(v, str)}
    streamed = {s for d in STREAMS for s in d.subjects}
    prefixes = {
        subjects.AUDIT,
        subjects.DEAD_LETTER_PREFIX,
        subjects.SAVE_RESULT_PREFIX,
        subjects.HEALTH_PREFIX,
        # Internal core NATS: the admin API's revocations to every service process.
        subjects.ADMIN_REVOKED,
        subjects.FEED_PREFIX,
    }
    assert constants - streamed - prefixes == set(REQUESTS) == set(PUBLIC_REQUESTS)
    conf = AUTH_CONF.read_text()
    for subject in REQUESTS:
        assert f'"{subject}"' in conf, f"{subject}: the platform user may not request it"


# -- end to end, every service under its own user ------------------------------------------


async def _connect_as(server: AuthNatsServer, user: str, errors: list[str]) -> Client:
    async def on_error(exc: Exception) -> None:
        errors.append(f"{user}: {exc}")

    return await nats.connect(server.url, name=user, error_cb=on_error, **server.options_for(user))


async def _entries(db: Database, org: UUID) -> int:
    async with db.read() as s:
        query = select(func.count()).select_from(ENTRIES).where(ENTRIES.c.org_id == org)
        return int((await s.execute(query)).scalar_one())


async def _outbox_rows(db: Database) -> int:
    async with db.read() as s:
        return int((await s.execute(select(func.count()).select_from(OUTBOX))).scalar_one())


async def test_services_run_and_answer_under_their_own_users(
    nats_proc: AuthNatsServer,
    settings: EngramSettings,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ingest, distill, embed, recall and governance-audit each connect as their own user; a
    session published as ``platform`` is distilled, indexed (memory.written → embed), recalled,
    saved to, rated until purged (memory.purged → embed), configured and audited, and the audit
    trail is read as ``audit-reader`` — with not one permission violation on the server."""
    caplog.set_level(logging.INFO)
    server = nats_proc
    errors: list[str] = []
    # embed and recall share one Qdrant Edge index in one process (the runtime's own rule).
    embedder = build_embedder(settings)
    index = build_vector_index(settings, embedder)
    assert index is not None
    async with AsyncExitStack() as stack:
        stack.push_async_callback(index.close)
        for name in SERVICES:
            own = settings.model_copy(
                update={"nats_url": server.url, "nats_nkey_seed": SecretStr(server.seeds[name])}
            )
            infra = await stack.enter_async_context(
                running_services(own, [name], embedder=embedder, vector_index=index)
            )
            # Connected: the server admits no one without a known key, so it proved this one.
            assert infra.nc.is_connected
        platform = await _connect_as(server, "platform", errors)
        stack.push_async_callback(platform.drain)
        alice = {"kind": "end_user", "id": "alice"}
        trace = [{"tool": "refund_payment", "input": {"order": "A-9"}, "error": "card declined by issuer"}]
        lesson = "refund_payment failed with 'card declined by issuer'."

        async def recall(**fields: object) -> dict[str, Any]:
            body = {"agent_config_id": str(agent), "principal": alice, **fields}
            return await request(platform, "engram.recall", body, service_token)

        # session.ended (platform) → ingest → session.validated → distill → Postgres + outbox
        await publish_session(
            platform,
            session_payload(org, agent, principal=alice, tool_trace=trace, task="Refund order A-9"),
            service_token,
        )

        async def recalled() -> bool:
            return lesson in [r["text"] for r in (await recall(strategy="last_k"))["results"]]

        await eventually(recalled, what="the lesson recalled as platform")

        # memory.written (a relay) → embed (its own durable) → vectors → semantic recall
        async def indexed() -> bool:
            reply = await recall(strategy="semantic", cue="card declined refund", top_k=10)
            return lesson in [r["text"] for r in reply["results"]]

        await eventually(indexed, what="the lesson indexed by embed and found semantically")

        # elective save, waiting: ingest → save.accepted → distill → save.result.<id> → ingest
        saved = await request(
            platform,
            "engram.memory.save",
            {
                "agent_config_id": str(agent),
                "wait": True,
                "principal": alice,
                "entries": [
                    {
                        "text": "Alice wants store credit, never refunds.",
                        "importance": 0.6,
                        "memory_type": "fact",
                    }
                ],
            },
            service_token,
        )
        assert saved["status"] == 200, saved
        entry_id = saved["ids"][0]
        expanded = await request(
            platform,
            "engram.recall.expand",
            {"agent_config_id": str(agent), "principal": alice, "ids": [entry_id]},
            service_token,
        )
        assert [r["id"] for r in expanded["results"]] == [entry_id], expanded
        listed = await request(
            platform, "engram.memory.list", {"agent_config_id": str(agent), "principal": alice}, service_token
        )
        assert entry_id in [e["id"] for e in listed["entries"]], listed

        async def in_step() -> bool:
            """This module's vector store holds exactly this organization's entries."""
            return await index.count() == await _entries(db, org)

        await eventually(in_step, what="every entry indexed, the saved one included")
        before = await index.count()
        # governance-audit: one failure now prunes a fact; recall's feedback then purges it
        put = await request(
            platform,
            "engram.config.put",
            {"agent_config_id": str(agent), "config": {"type_policies": {"fact": {"prune_below": 0.99}}}},
            service_token,
        )
        assert put["config"]["type_policies"]["fact"]["prune_below"] == 0.99, put
        feedback = await request(
            platform,
            "engram.memory.feedback",
            {"agent_config_id": str(agent), "principal": alice, "entry_id": entry_id, "success": False},
            service_token,
        )
        assert feedback["deleted"] == 1, feedback
        # memory.purged (a relay) → embed-purge → the vector is gone
        await eventually(in_step, what="the purged entry's vector deleted by embed")
        assert await index.count() == before - 1

        # A session that fails validation: dead-lettered (engram.dlq.session) and audited.
        bad = session_payload(org, agent, principal=alice, steps=-1)
        await publish_session(platform, bad, service_token)

        async def outbox_empty() -> bool:
            return await _outbox_rows(db) == 0

        verify = await request(platform, "engram.audit.verify", {}, service_token)
        assert verify["ok"] is True, verify

        # audit-reader: its own pull consumer on ENGRAM_AUDIT, this organization's records.
        reader = await _connect_as(server, "audit-reader", errors)
        stack.push_async_callback(reader.drain)
        sub = await reader.jetstream().pull_subscribe(
            "engram.audit.*.*", durable="siem", stream="ENGRAM_AUDIT"
        )
        kinds: set[str] = set()
        wanted = {"distill.completed", "config.changed", "memory.feedback", "session.rejected"}

        async def audited() -> bool:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except TimeoutError:
                return False
            for m in msgs:
                await m.ack()
                record = json.loads(m.data)
                if record["org_id"] == str(org):
                    assert m.subject == f"engram.audit.{record['kind']}"
                    kinds.add(record["kind"])
            return wanted <= kinds

        await eventually(audited, timeout=30, what=f"audit records {wanted} read by audit-reader")
        await eventually(outbox_empty, what="every outbox row published by some relay")
        await reader.flush()
        await platform.flush()

    violations = server.log_lines("Violation", "authentication error")
    print(f"\nend to end: {len(violations)} violations in the server log; audit kinds {sorted(kinds)}")
    assert violations == []
    assert errors == []
    leaked = [
        r.getMessage() for r in caplog.records if any(k in r.getMessage() for k in server.seeds.values())
    ]
    assert leaked == [], "a NATS seed reached the logs"
