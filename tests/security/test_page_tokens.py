"""Page-token tampering on ``engram.memory.list`` and ``engram.memory.export`` (SPEC 7.2): bit flips
at every position (of the wire text and of the signed bytes), truncation, extension, another
caller, another organization, another filter, another purpose, expired, and signed with a wrong
key — each refused with ``INVALID_REQUEST`` and no ``entries``."""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client

from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.page_tokens import PageTokens
from tests.conftest import TEST_KID, TEST_SECRET
from tests.platform import request
from tests.security.support import Tally, b64url, error_code, mint, report, save, unb64url
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
BOB = {"kind": "end_user", "id": "bob"}
PAGE = 3


def list_filters(agent: UUID, keys: list[str], principal: str, **kw: Any) -> dict[str, Any]:
    """What ``inspect.list_entries`` signs a list token over (kept in step with it; the control
    case below proves it still is)."""
    return {
        "agent_config_id": str(agent),
        "keys": keys,
        "lifecycle": kw.get("lifecycle"),
        "layer": kw.get("layer"),
        "memory_types": kw.get("memory_types"),
        "min_importance": kw.get("min_importance"),
        "session_id": kw.get("session_id"),
        "metadata": kw.get("metadata"),
        "page_size": kw.get("page_size", 20),
        "principal": principal,
    }


def export_filters(agent: UUID | None, owner: str, principal: str, **kw: Any) -> dict[str, Any]:
    """What ``export.export_page`` signs an export token over."""
    return {
        "agent_config_id": str(agent) if agent else None,
        "owner": owner,
        "lifecycle": kw.get("lifecycle"),
        "page_size": kw.get("page_size", 100),
        "session_id": kw.get("session_id"),
        "principal": principal,
    }


def char_flips(token: str) -> list[str]:
    """One flipped bit at every character of the token's text (which bit varies with position)."""
    out = []
    for i, ch in enumerate(token):
        flipped = chr(ord(ch) ^ (1 << (i % 7)))
        out.append(token[:i] + flipped + token[i + 1 :])
    return out


def byte_flips(token: str) -> list[str]:
    """One flipped bit at every byte of the decoded body and MAC, re-encoded canonically: the
    tampering a careful attacker does (always valid base64url)."""
    body_part, _, mac_part = token.partition(".")
    body, mac = unb64url(body_part), unb64url(mac_part)
    out = []
    for i in range(len(body)):
        b = bytearray(body)
        b[i] ^= 1 << (i % 8)
        out.append(f"{b64url(bytes(b))}.{mac_part}")
    for i in range(len(mac)):
        m = bytearray(mac)
        m[i] ^= 1 << (i % 8)
        out.append(f"{body_part}.{b64url(bytes(m))}")
    return out


def decodes_same(original: str, candidate: str) -> bool:
    """Whether ``candidate`` decodes to the same body and MAC (a non-canonical base64 spelling)."""
    try:
        a, _, b = candidate.partition(".")
        x, _, y = original.partition(".")
        return (unb64url(a), unb64url(b)) == (unb64url(x), unb64url(y))
    except ValueError:
        return False


async def test_tampered_page_tokens_are_refused(
    interface: Interface,
    nc: Client,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """The tampering, sent through ``interface`` (NATS; over HTTP through GET /v1/memories and
    GET /v1/export with ?page_token=…); the memory, the honest tokens and the controls go over
    NATS either way."""
    name = interface.label("page-tokens")
    await save(nc, service_token, agent, [f"alice fact {i}" for i in range(8)], ALICE)
    await save(nc, service_token, agent, [f"bob fact {i}" for i in range(8)], BOB)
    alice = mint(tokens, org, "end_user:alice", {"memory.read"})
    bob = mint(tokens, org, "end_user:bob", {"memory.read"})
    carol = mint(tokens, org, "actor:carol", ALL_PERMISSIONS)
    other_org = uuid4()
    other_agent = uuid4()
    other_svc = mint(tokens, other_org, "service:runner", ALL_PERMISSIONS)
    await save(nc, other_svc, other_agent, [f"alice fact {i}" for i in range(8)], ALICE)
    other_alice = mint(tokens, other_org, "end_user:alice", {"memory.read"})

    a = str(agent)
    list_body: dict[str, Any] = {"agent_config_id": a, "page_size": PAGE}
    export_body: dict[str, Any] = {"actor_ref": "end_user:alice", "page_size": PAGE}
    first_list = await request(nc, "engram.memory.list", list_body, alice)
    first_export = await request(nc, "engram.memory.export", export_body, alice)
    list_token, export_token = first_list["next_page_token"], first_export["next_page_token"]
    assert list_token
    assert export_token
    # The honest continuation works (so every refusal below is the tampering's doing).
    assert (
        len(
            (await request(nc, "engram.memory.list", {**list_body, "page_token": list_token}, alice))[
                "entries"
            ]
        )
        == PAGE
    )
    assert (
        len(
            (await request(nc, "engram.memory.export", {**export_body, "page_token": export_token}, alice))[
                "entries"
            ]
        )
        == PAGE
    )

    tally = Tally(name)
    categories: dict[str, int] = {}
    benign: list[str] = []

    async def refuse(
        category: str, subject: str, body: dict[str, Any], token: str, original: str | None
    ) -> None:
        reply = await interface(subject, body, token)
        code = tally.note(reply)
        categories[category] = categories.get(category, 0) + 1
        # Another organization's caller naming this agent config is refused before its token is
        # read (FORBIDDEN: the agent config is not theirs); everything else is INVALID_REQUEST.
        expected = {"INVALID_REQUEST", "FORBIDDEN"} if category == "other_org" else {"INVALID_REQUEST"}
        if code in expected and "entries" not in reply:
            return
        if original is not None and code is None and decodes_same(original, body.get("page_token", "")):
            benign.append(f"{category}: {subject} accepted a non-canonical spelling of the same token")
            return
        tally.problem(f"{category}: {subject} -> {code or 'accepted'} {str(reply)[:160]}")

    now = time.time()
    signer = PageTokens({TEST_KID: TEST_SECRET})
    wrong_key = PageTokens({TEST_KID: TEST_SECRET + "x"})
    unknown_kid = PageTokens({"other-kid": TEST_SECRET})
    alice_list_filters = list_filters(agent, ["end_user:alice"], "end_user:alice", page_size=PAGE)
    alice_export_filters = export_filters(None, "end_user:alice", "end_user:alice", page_size=PAGE)
    position_list = {"i": 1.0, "c": "2100-01-01T00:00:00+00:00", "id": str(UUID(int=0))}
    position_export = {"c": "1970-01-01T00:00:00+00:00", "id": str(UUID(int=0))}

    def made(
        pages: PageTokens,
        purpose: str,
        filters: dict[str, Any],
        *,
        at: float = now,
        org_id: UUID = org,
        caller: str = "end_user:alice",
    ) -> str:
        position = position_list if purpose == "list" else position_export
        return pages.issue(
            purpose=purpose, org_id=org_id, caller=caller, filters=filters, position=position, now=at
        )

    # Control: tokens made here with the right key and filters are accepted.
    for subject, body, purpose, filters in (
        ("engram.memory.list", list_body, "list", alice_list_filters),
        ("engram.memory.export", export_body, "export", alice_export_filters),
    ):
        ok = await request(nc, subject, {**body, "page_token": made(signer, purpose, filters)}, alice)
        assert error_code(ok) is None, ok
        assert len(ok["entries"]) == PAGE

    for subject, body, token, purpose, filters in (
        ("engram.memory.list", list_body, list_token, "list", alice_list_filters),
        ("engram.memory.export", export_body, export_token, "export", alice_export_filters),
    ):
        for bad in char_flips(token):
            await refuse("char_flip", subject, {**body, "page_token": bad}, alice, token)
        for bad in byte_flips(token):
            await refuse("byte_flip", subject, {**body, "page_token": bad}, alice, None)
        for cut in range(1, len(token), max(1, len(token) // 40)):
            await refuse("truncated", subject, {**body, "page_token": token[:cut]}, alice, None)
        for bad in (
            token + "A",
            token + ".x",
            "." + token,
            token.replace(".", ""),
            token.split(".")[0] + ".",
            "." + token.split(".")[1],
            token[::-1],
        ):
            await refuse("reshaped", subject, {**body, "page_token": bad}, alice, None)
        # Another caller, same request: bob (another user), carol (an admin reading alice).
        if subject == "engram.memory.list":
            await refuse("other_caller", subject, {**body, "page_token": token}, bob, None)
            await refuse(
                "other_caller",
                subject,
                {**body, "actor_ref": "end_user:alice", "page_token": token},
                carol,
                None,
            )
            await refuse("other_org", subject, {**body, "page_token": token}, other_alice, None)
            await refuse(
                "other_org",
                subject,
                {**body, "agent_config_id": str(other_agent), "page_token": token},
                other_alice,
                None,
            )
        else:
            await refuse(
                "other_caller", subject, {**body, "actor_ref": "end_user:bob", "page_token": token}, bob, None
            )
            await refuse("other_caller", subject, {**body, "page_token": token}, carol, None)
            await refuse("other_org", subject, {**body, "page_token": token}, other_alice, None)
        # Another filter, same caller.
        changes: list[dict[str, Any]] = [
            {"page_size": PAGE + 1},
            {"lifecycle": ["active"]},
            {"agent_config_id": str(uuid4())},
        ]
        if subject == "engram.memory.list":
            changes += [
                {"min_importance": 0.1},
                {"layer": "memory"},
                {"memory_types": ["semantic"]},
                {"session_id": "s"},
                {"lifecycle": ["active", "disabled"]},
            ]
            # (``actor_ref: end_user:alice`` is not another filter for alice: it names the same
            # owners, and the token rightly continues it.)
        for change in changes:
            await refuse("other_filter", subject, {**body, **change, "page_token": token}, alice, None)
        # Another purpose: a list token continuing an export and the other way round.
        other_subject = "engram.memory.export" if subject == "engram.memory.list" else "engram.memory.list"
        other_body = export_body if subject == "engram.memory.list" else list_body
        await refuse("other_purpose", other_subject, {**other_body, "page_token": token}, alice, None)
        # Made here: expired, wrong key, unknown key id, other org, other caller, other purpose.
        for category, forged in (
            ("expired", made(signer, purpose, filters, at=now - 10 * 86400)),
            ("expired", made(signer, purpose, filters, at=now - 3601)),
            ("wrong_key", made(wrong_key, purpose, filters)),
            ("unknown_kid", made(unknown_kid, purpose, filters)),
            ("other_org", made(signer, purpose, filters, org_id=other_org)),
            ("other_caller", made(signer, purpose, filters, caller="end_user:bob")),
            ("other_purpose", made(signer, "export" if purpose == "list" else "list", filters)),
        ):
            await refuse(category, subject, {**body, "page_token": forged}, alice, None)

    report(
        name,
        **interface.counts(),
        requests=tally.requests,
        wrong_acceptances=len(tally.problems),
        non_canonical_base64_accepted=len(benign),
        by_category=categories,
        problems=tally.problems,
        benign=benign[:10],
    )
    assert tally.problems == []
