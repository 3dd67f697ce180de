"""Each organization's feed (SPEC 11, docs/adr/0102-tenant-feeds.md): the outbox relay publishes a
copy of every ``memory.written``, ``memory.purged`` and ``audit.<kind>`` event on
``engram.feed.<org_id>.<event>`` (the ``ENGRAM_FEED`` stream), so that an organization's platform
clients, ``GET /v1/events`` and its webhooks can follow its own events — and, by subject
permission, no other organization's."""

from __future__ import annotations

import json
from uuid import UUID

from contracts import subjects as s

__all__ = ["feed_copy_subject", "org_of_feed_subject"]


def feed_copy_subject(subject: str, payload: bytes) -> str | None:
    """Where the feed copy of an event published on ``subject`` goes, or None when no feed carries
    it (sessions, hand-offs, dead letters) or its payload names no organization."""
    event = s.feed_event_of(subject)
    if event is None:
        return None
    try:
        org = UUID(str(json.loads(payload)["org_id"]))
    except (ValueError, KeyError, TypeError):
        return None
    return s.feed_subject(org, event)


def org_of_feed_subject(subject: str) -> tuple[UUID, str]:
    """``engram.feed.<org>.<event>`` → the organization and the event (``audit.memory.saved``)."""
    prefix = s.FEED_PREFIX + "."
    if not subject.startswith(prefix):
        raise ValueError(f"not a feed subject: {subject!r}")
    org, _, event = subject.removeprefix(prefix).partition(".")
    return UUID(org), event
