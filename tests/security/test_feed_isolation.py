"""A platform client follows its own organization's feed and never another's, on a real
nats-server with the users rendered from the permission table (shared/security/nats_auth/permissions.py),
from the attacker's side: a client of organization A subscribes, creates consumers and pulls
everything it can think of on organization B's feed, and the server refuses it all."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from contracts import subjects as s
from contracts.operations import JETSTREAMS
from shared.embedded.nats_server import AUTH_INCLUDE, NatsServerProcess
from shared.messaging.bus import ensure_streams
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import all_in_one_permissions, platform_permissions, service_inbox
from shared.security.nats_auth.render import NatsUser, render_authorization
from tests.nats_probe import Probe

pytestmark = pytest.mark.integration

ORG_A, ORG_B = uuid4(), uuid4()
STREAM = "ENGRAM_FEED"


class Users:
    def __init__(self) -> None:
        self.seeds = {name: new_user_seed() for name in ("engram", "client-a", "client-b")}

    def render(self) -> str:
        return render_authorization(
            [
                NatsUser(public_key_of(self.seeds["engram"]), all_in_one_permissions(), "services"),
                NatsUser(
                    public_key_of(self.seeds["client-a"]),
                    platform_permissions("_INBOX_client-a", org_id=ORG_A, consumer="client-a"),
                ),
                NatsUser(
                    public_key_of(self.seeds["client-b"]),
                    platform_permissions("_INBOX_client-b", org_id=ORG_B, consumer="client-b"),
                ),
            ]
        )

    def options(self, name: str) -> dict[str, object]:
        prefix = service_inbox("engram") if name == "engram" else f"_INBOX_{name}"
        return {"nkeys_seed_str": self.seeds[name], "inbox_prefix": prefix}


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[NatsServerProcess, Users]]:
    users = Users()
    store = tmp_path_factory.mktemp("feed-nats")
    (store / AUTH_INCLUDE).write_text(users.render())
    proc = NatsServerProcess(store, auth=True)
    await proc.start()
    services = await nats.connect(proc.url, **users.options("engram"))  # type: ignore[arg-type]
    try:
        await ensure_streams(services.jetstream(), JETSTREAMS)
        js = services.jetstream()
        for org in (ORG_A, ORG_B):
            for n in range(3):
                body = json.dumps({"org_id": str(org), "n": n}).encode()
                await js.publish(s.feed_subject(org, "memory.written"), body)
        yield proc, users
    finally:
        await services.close()
        await proc.stop()


async def _probe(server: tuple[NatsServerProcess, Users], name: str) -> Probe:
    proc, users = server
    return await Probe.connect(proc.url, name, **users.options(name))


async def _api(probe: Probe, subject: str, body: dict[str, object]) -> dict[str, object] | None:
    """A JetStream API request: its answer, or None when the server refused the publish."""
    answer: list[dict[str, object]] = []

    async def ask() -> None:
        try:
            msg = await probe.nc.request(subject, json.dumps(body).encode(), timeout=1.0)
            answer.append(json.loads(msg.data))
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            pass

    refused = await probe.refused("publish", subject, ask)
    return None if refused else (answer[0] if answer else {})


def _create(name: str, filter_subject: str, **config: object) -> dict[str, object]:
    return {
        "stream_name": STREAM,
        "config": {
            "name": name,
            "durable_name": name,
            "filter_subject": filter_subject,
            "ack_policy": "explicit",
            "deliver_policy": "all",
            **config,
        },
    }


async def test_a_client_follows_its_own_organizations_feed(server: tuple[NatsServerProcess, Users]) -> None:
    """Client A's durable on its organization's feed pulls exactly organization A's events."""
    probe = await _probe(server, "client-a")
    try:
        js = probe.nc.jetstream()
        sub = await js.pull_subscribe(
            s.feed_subject(ORG_A),
            durable="client-a",
            stream=STREAM,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        msgs = await sub.fetch(10, timeout=2.0)
        orgs = {UUID(json.loads(m.data)["org_id"]) for m in msgs}
        for m in msgs:
            await m.ack()
        assert len(msgs) == 3
        assert orgs == {ORG_A}, orgs
        assert not probe.errors, probe.errors
        # And live, as a core subscription of its organization's subjects.
        assert not await probe.subscribe_refused(s.feed_subject(ORG_A), None)
    finally:
        await probe.nc.close()


async def test_a_client_cannot_reach_another_organizations_feed(
    server: tuple[NatsServerProcess, Users],
) -> None:
    """Client A cannot subscribe to organization B's feed, nor to every feed, nor create or use a
    consumer that would read it — whatever name, filter or API it tries."""
    probe = await _probe(server, "client-a")
    b_feed = s.feed_subject(ORG_B)
    try:
        for subject in (
            b_feed,
            s.feed_subject(ORG_B, "memory.written"),
            "engram.feed.>",
            "engram.feed.*.>",
            ">",
            "engram.memory.written",
            "engram.audit.*.*",
            "$JS.>",
        ):
            assert await probe.subscribe_refused(subject, None), subject

        refused = [
            # B's filter under A's own consumer name: the filter is part of the subject.
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a.{b_feed}",
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a.engram.feed.>",
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a.engram.feed.*.memory.written",
            # B's consumer name, or any other.
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-b.{s.feed_subject(ORG_A)}",
            f"$JS.API.CONSUMER.CREATE.{STREAM}.other.{s.feed_subject(ORG_A)}",
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a",  # no filter in the subject: unchecked
            f"$JS.API.CONSUMER.CREATE.{STREAM}",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.client-a",
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.client-b",
            f"$JS.API.CONSUMER.INFO.{STREAM}.client-b",
            f"$JS.API.CONSUMER.DELETE.{STREAM}.client-b",
            f"$JS.API.DIRECT.GET.{STREAM}",
            f"$JS.API.STREAM.MSG.GET.{STREAM}",
            f"$JS.API.STREAM.INFO.{STREAM}",
            f"$JS.API.STREAM.UPDATE.{STREAM}",
            f"$JS.API.STREAM.PURGE.{STREAM}",
        ]
        for subject in refused:
            assert await _api(probe, subject, _create("client-a", b_feed)) is None, subject

        # A's allowed create subject, with B's filter in the body: the server refuses the mismatch.
        answer = await _api(
            probe,
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a.{s.feed_subject(ORG_A)}",
            _create("client-a", b_feed),
        )
        assert answer is not None
        assert "error" in answer, answer
        answer = await _api(
            probe,
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a.{s.feed_subject(ORG_A)}",
            {
                "stream_name": STREAM,
                "config": {
                    "name": "client-a",
                    "durable_name": "client-a",
                    "filter_subjects": [b_feed],
                    "ack_policy": "explicit",
                },
            },
        )
        assert answer is not None
        assert "error" in answer, answer
        # A push consumer delivering to A's inbox with A's filter in the subject and B's in the body.
        answer = await _api(
            probe,
            f"$JS.API.CONSUMER.CREATE.{STREAM}.client-a.{s.feed_subject(ORG_A)}",
            _create("client-a", b_feed, deliver_subject="_INBOX_client-a.stolen"),
        )
        assert answer is not None
        assert "error" in answer, answer

        # Nor can it write into anyone's feed.
        for subject in (s.feed_subject(ORG_A, "memory.written"), s.feed_subject(ORG_B, "audit.memory.saved")):
            assert await probe.publish_refused(subject, b"{}"), subject
    finally:
        await probe.nc.close()


async def test_b_never_receives_what_a_pulls(server: tuple[NatsServerProcess, Users]) -> None:
    """Client B, following its own organization live, gets B's event and not A's published before it."""
    probe = await _probe(server, "client-b")
    try:
        sub = await probe.nc.subscribe(s.feed_subject(ORG_B))
        await probe.nc.flush()
        proc, users = server
        services = await nats.connect(proc.url, **users.options("engram"))  # type: ignore[arg-type]
        try:
            js = services.jetstream()
            for org in (ORG_A, ORG_B):
                body = json.dumps({"org_id": str(org)}).encode()
                await js.publish(s.feed_subject(org, "memory.purged"), body)
        finally:
            await services.close()
        first = await sub.next_msg(timeout=5.0)
        assert json.loads(first.data)["org_id"] == str(ORG_B)
        assert not probe.errors, probe.errors
    finally:
        await probe.nc.close()
