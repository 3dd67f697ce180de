"""The pieces of the tenant feeds that need no server: which events a feed carries and under which
subject, the SSRF rule for webhook URLs, Standard Webhooks signatures (checked with the
``standardwebhooks`` library a receiver uses), and the SSE frame."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from pydantic import ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from contracts import subjects as s
from contracts.errors import Forbidden, InvalidRequest
from contracts.feeds import WebhookRegister
from services.gateway.events import sse_frame
from services.governance_audit.webhooks.api import new_secret
from services.governance_audit.webhooks.delivery import Attempt, signed_request
from services.governance_audit.webhooks.fanout import wanted
from services.governance_audit.webhooks.targets import check_target
from shared.messaging.feed import feed_copy_subject, org_of_feed_subject

ORG = uuid4()


@pytest.mark.parametrize(
    ("subject", "event"),
    [
        ("engram.memory.written", "memory.written"),
        ("engram.memory.purged", "memory.purged"),
        ("engram.audit.memory.saved", "audit.memory.saved"),
        ("engram.audit.session.rejected", "audit.session.rejected"),
    ],
)
def test_memory_and_audit_events_have_a_feed_copy_under_their_organization(subject: str, event: str) -> None:
    """An event of a feed is copied to engram.feed.<its org>.<event>, and read back as such."""
    copy = feed_copy_subject(subject, json.dumps({"org_id": str(ORG)}).encode())
    assert copy == f"engram.feed.{ORG}.{event}"
    assert org_of_feed_subject(copy) == (ORG, event)


@pytest.mark.parametrize(
    "subject",
    [
        "engram.session.ended",
        "engram.save.accepted",
        "engram.dlq.session",
        "engram.audit.query",
        "engram.recall",
    ],
)
def test_sessions_hand_offs_dead_letters_and_requests_have_none(subject: str) -> None:
    """Raw sessions, saves and dead letters (which keep original bytes) never reach a feed."""
    assert feed_copy_subject(subject, json.dumps({"org_id": str(ORG)}).encode()) is None


@pytest.mark.parametrize("org", ["*", ">", "a.b", "", None, "not-a-uuid"])
def test_a_payload_naming_no_organization_has_no_feed_copy(org: object) -> None:
    """The organization token is a UUID or nothing: no wildcard or extra token reaches a subject."""
    assert feed_copy_subject(s.MEMORY_WRITTEN, json.dumps({"org_id": org}).encode()) is None
    assert feed_copy_subject(s.MEMORY_WRITTEN, b"not json") is None


def test_webhooks_choose_events_and_never_get_records_of_webhooks() -> None:
    """A webhook gets the events it named (``audit``: every audit kind), and never audit.webhook.*
    (a failing receiver would otherwise be sent the record of its own failure)."""
    assert wanted(None, "memory.written")
    assert wanted(["audit"], "audit.memory.saved")
    assert not wanted(["memory.written"], "audit.memory.saved")
    assert not wanted(["memory.written"], "memory.purged")
    assert not wanted(None, "audit.webhook.rejected")
    assert not wanted(["audit"], "audit.webhook.registered")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://10.0.0.5/x",
        "http://192.168.1.1/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "http://[fd00::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://100.64.0.1/x",
        "http://0.0.0.0/x",
        "http://224.0.0.1/x",
    ],
)
async def test_internal_addresses_are_refused_by_default(url: str) -> None:
    """Loopback, private, link-local (cloud metadata), CGNAT, unspecified and multicast targets are
    refused (FORBIDDEN) unless the deployment allows private networks."""
    with pytest.raises(Forbidden):
        await check_target(url, allow_private=False)
    await check_target(url, allow_private=True)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "http://user:pw@example.com/x",
        "file:///etc/passwd",
        "http:///x",
        "http://h:99999/",
    ],
)
async def test_malformed_targets_are_refused_even_when_private_networks_are_allowed(url: str) -> None:
    with pytest.raises(InvalidRequest):
        await check_target(url, allow_private=True)


async def test_a_public_address_is_accepted() -> None:
    await check_target("https://93.184.215.14/hook", allow_private=False)


async def test_a_host_that_cannot_resolve_is_forbidden_not_a_crash() -> None:
    """A label longer than DNS allows (IDNA refuses to encode it) is refused like any unresolvable
    host, and a bracketed host that is no IPv6 address like any host Engram may not call."""
    with pytest.raises(Forbidden):
        await check_target(f"https://{'0' * 200}/x", allow_private=False)
    for allow_private in (False, True):
        with pytest.raises(Forbidden):
            await check_target("http://[00]/x", allow_private=allow_private)


@pytest.mark.parametrize(
    ("url", "valid"),
    [
        ("https://hooks.example.com/engram?x=1", True),
        ("http://127.0.0.1:65535/a", True),
        ("http://[::1]:8080/a", True),
        ("http://h:65536/", False),
        ("http://h:0/", False),
        ("http://u@h/", False),
        ("ftp://h/", False),
        ("http://" + "a" * 254, False),
    ],
)
def test_the_request_model_refuses_malformed_urls(url: str, valid: bool) -> None:
    """Scheme, user info, port range and host length are the model's: schema-valid means well formed."""
    try:
        WebhookRegister(url=url)
    except ValidationError:
        assert not valid
    else:
        assert valid


def test_a_signed_request_verifies_with_standardwebhooks_and_only_with_its_secret() -> None:
    """The body is {type, timestamp, data}; webhook-id is the event id; a receiver holding the
    secret verifies it with the standardwebhooks library, another secret or a changed byte fails."""
    secret, event_id = new_secret(), uuid4()
    payload = json.dumps(
        {"event_id": str(event_id), "org_id": str(ORG), "occurred_at": "2026-12-03T17:00:00Z"}
    )
    attempt = Attempt(
        1, uuid4(), ORG, event_id, "memory.written", "engram.feed.x", payload.encode(), 0, "u", secret
    )
    body, headers = signed_request(attempt, datetime.now(UTC))
    event = Webhook(secret).verify(body, headers)
    assert event == {
        "type": "memory.written",
        "timestamp": "2026-12-03T17:00:00Z",
        "data": json.loads(payload),
    }
    assert headers["webhook-id"] == str(event_id)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"memory.written", b"memory.purged"), headers)


def test_an_sse_frame_is_one_event_whose_data_cannot_break_out() -> None:
    """id, event and one data line; a newline in the data cannot start a field of its own."""
    frame = sse_frame(7, "memory.written", b'{"a":1}\nid: 99\n\nevent: x')
    assert frame.startswith(b"id: 7\nevent: memory.written\ndata: ")
    assert frame.endswith(b"\n\n")
    assert frame.count(b"\n") == 4
