"""The admin API (``engram.admin.*``, docs/adr/0104-admin-api.md), attacked and used through NATS and
HTTP alike: only a deployment-wide ``tenant.admin`` token administers; an organization's own admin
administers nothing, its own organization included; a revoked client, a revoked token and a disabled
organization are refused on the very next request; bad input is a typed 400; every action is audited
without a secret."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

import nats
import pytest
from sqlalchemy import select
from sqlmodel import col

from contracts import subjects as s
from contracts.common import Principal
from contracts.operations import ADMIN_OPERATIONS
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TENANT_ADMIN, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord
from tests.security.transport import Interface
from tests.support.servers import SecuredNatsServer


@pytest.fixture(scope="module")
def settings(settings: EngramSettings, nats_proc: NatsServerProcess) -> EngramSettings:
    """The services' data dir is the NATS server's registry, as in ``engram up``: the admin API
    issues platform clients' NATS identities there and reloads the server."""
    assert isinstance(nats_proc, SecuredNatsServer)
    return settings.model_copy(update={"data_dir": nats_proc.identities.data_dir})


@pytest.fixture
def operator(tokens: TokenService) -> str:
    """The deployment's operator: tenant.admin on a token of an organization of its own."""
    return tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="operator"), permissions={TENANT_ADMIN}
    )


async def _admitted(url: str, creds: dict[str, Any]) -> bool:
    """Whether the NATS server lets a client log in with ``creds``' identity now."""
    try:
        client = await nats.connect(
            url,
            nkeys_seed_str=creds["nats_nkey_seed"],
            inbox_prefix=creds["nats_inbox_prefix"],
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=5,
        )
    except Exception:  # nats-py raises several kinds for a refused login
        return False
    await client.close()
    return True


def _ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert "error" not in reply, reply
    return reply


def _code(reply: dict[str, Any]) -> str:
    error = reply.get("error")
    assert isinstance(error, dict), f"expected an error, got {reply}"
    return str(error["code"])


async def _new_org(interface: Interface, operator: str) -> UUID:
    reply = _ok(await interface(s.ADMIN_ORG_CREATE, {"name": f"acme-{uuid4().hex[:6]}"}, operator))
    return UUID(reply["org_id"])


async def _save(interface: Interface, token: str, agent: UUID) -> dict[str, Any]:
    body = {"agent_config_id": str(agent), "content": "the deploy key rotates on Mondays"}
    return await interface(s.MEMORY_SAVE, body, token)


def _bodies(org: UUID, other: UUID) -> dict[str, dict[str, Any]]:
    """A valid request to every admin operation (so refusals are about who asks, not the body)."""
    return {
        s.ADMIN_ORG_CREATE: {"name": "intruder", "org_id": str(other)},
        s.ADMIN_ORG_LIST: {},
        s.ADMIN_ORG_DISABLE: {"org_id": str(other)},
        s.ADMIN_AGENT_CONFIG_CREATE: {"org_id": str(other)},
        s.ADMIN_AGENT_CONFIG_LIST: {"org_id": str(other)},
        s.ADMIN_CLIENT_MINT: {"org_id": str(other), "name": f"x-{uuid4().hex[:8]}"},
        s.ADMIN_CLIENT_ROTATE: {"name": "tenant"},
        s.ADMIN_CLIENT_REVOKE: {"name": "tenant"},
        s.ADMIN_CLIENT_LIST: {"org_id": str(other)},
        s.ADMIN_TOKEN_MINT: {
            "org_id": str(other),
            "principal": {"kind": "service", "id": "x"},
            "permissions": ["memory.admin"],
        },
        s.ADMIN_TOKEN_REVOKE: {"org_id": str(other), "token_id": "abc"},
    }


async def test_onboarding_a_client_then_revoking_it(
    interface: Interface, engram: Infra, nats_proc: NatsServerProcess, operator: str, db: Database
) -> None:
    """An operator registers an organization, creates its agent config and mints a client whose NATS
    identity and token work; once revoked, both are refused on the next request and connection."""
    org = await _new_org(interface, operator)
    agent = UUID(
        _ok(
            await interface(
                s.ADMIN_AGENT_CONFIG_CREATE, {"org_id": str(org), "config": {"top_k": 5}}, operator
            )
        )["agent_config_id"]
    )
    listed = _ok(await interface(s.ADMIN_AGENT_CONFIG_LIST, {"org_id": str(org)}, operator))
    assert [(c["agent_config_id"], c["version"]) for c in listed["agent_configs"]] == [(str(agent), 2)]
    name = f"runner-{uuid4().hex[:8]}"
    creds = _ok(
        await interface(
            s.ADMIN_CLIENT_MINT,
            {"org_id": str(org), "name": name, "permissions": ["memory.read", "memory.write"]},
            operator,
        )
    )
    assert creds["nats_inbox_prefix"] == f"_INBOX_{name}"
    clients = _ok(await interface(s.ADMIN_CLIENT_LIST, {"org_id": str(org)}, operator))["clients"]
    assert [c["name"] for c in clients] == [name]
    assert "nats_nkey_seed" not in clients[0]
    assert "token" not in clients[0]

    # Admitted by the time the reply came: the server reloaded its users before it.
    assert await _admitted(nats_proc.url, creds)
    client = await nats.connect(
        nats_proc.url, nkeys_seed_str=creds["nats_nkey_seed"], inbox_prefix=creds["nats_inbox_prefix"]
    )
    try:
        saved = await client.request(
            s.MEMORY_SAVE,
            json.dumps({"agent_config_id": str(agent), "content": "uses its own NATS identity"}).encode(),
            headers={"Authorization": f"Bearer {creds['token']}"},
            timeout=10,
        )
        assert "error" not in json.loads(saved.data)
    finally:
        await client.close()
    _ok(await _save(interface, creds["token"], agent))

    revoked = _ok(await interface(s.ADMIN_CLIENT_REVOKE, {"name": name}, operator))
    assert revoked["revoked_at"] is not None
    # At once: the NATS identity (the server reloaded its users before the reply), and the token
    # on whatever connection it comes.
    assert not await _admitted(nats_proc.url, creds)
    assert _code(await _save(interface, creds["token"], agent)) == "UNAUTHENTICATED"

    async with db.read() as session:
        rows = (
            (await session.execute(select(AuditRecord).where(col(AuditRecord.org_id) == org))).scalars().all()
        )
    kinds = [r.kind for r in rows]
    for kind in (
        "admin.org_created",
        "admin.agent_config_created",
        "admin.client_minted",
        "admin.client_revoked",
    ):
        assert kind in kinds, kinds
    recorded = json.dumps([r.details for r in rows])
    assert creds["token"] not in recorded
    assert creds["nats_nkey_seed"] not in recorded
    assert creds["token_id"] in recorded


async def test_rotation_refuses_the_old_key_and_token(
    interface: Interface, engram: Infra, nats_proc: NatsServerProcess, operator: str
) -> None:
    """A rotated client's old token is refused at once; the new one works."""
    org = await _new_org(interface, operator)
    agent = UUID(
        _ok(await interface(s.ADMIN_AGENT_CONFIG_CREATE, {"org_id": str(org)}, operator))["agent_config_id"]
    )
    name = f"rot-{uuid4().hex[:8]}"
    old = _ok(await interface(s.ADMIN_CLIENT_MINT, {"org_id": str(org), "name": name}, operator))
    assert await _admitted(nats_proc.url, old)
    new = _ok(await interface(s.ADMIN_CLIENT_ROTATE, {"name": name}, operator))
    assert await _admitted(nats_proc.url, new)
    assert not await _admitted(nats_proc.url, old)
    assert new["nats_public_key"] != old["nats_public_key"]
    assert new["token_id"] != old["token_id"]
    assert _code(await _save(interface, old["token"], agent)) == "UNAUTHENTICATED"
    _ok(await _save(interface, new["token"], agent))


async def test_an_organization_admin_administers_nothing(
    interface: Interface, engram: Infra, tokens: TokenService, operator: str
) -> None:
    """memory.admin (every permission of an organization) is FORBIDDEN for every admin operation,
    on another organization and on its own; so is tenant.admin on an end user's or a restricted
    token, and a token without it."""
    own, other = await _new_org(interface, operator), await _new_org(interface, operator)
    org_admin = tokens.mint(
        org_id=own, principal=Principal(kind="actor", id="admin"), permissions=set(ALL_PERMISSIONS)
    )
    end_user = tokens.mint(
        org_id=own, principal=Principal(kind="end_user", id="eve"), permissions={TENANT_ADMIN}
    )
    restricted = tokens.mint(
        org_id=own,
        principal=Principal(kind="service", id="ops"),
        permissions={TENANT_ADMIN},
        agent_config_id=uuid4(),
    )
    for target in (other, own):
        for subject, body in _bodies(own, target).items():
            for token in (org_admin, end_user, restricted):
                assert _code(await interface(subject, body, token)) == "FORBIDDEN", (subject, body)
    assert {op.subject for op in ADMIN_OPERATIONS} == set(_bodies(own, other))


async def test_a_disabled_organization_is_refused_at_once(
    interface: Interface, engram: Infra, tokens: TokenService, operator: str
) -> None:
    """Disabling an organization refuses its tokens on the next request, and the admin API acts
    for it no more."""
    org = await _new_org(interface, operator)
    agent = UUID(
        _ok(await interface(s.ADMIN_AGENT_CONFIG_CREATE, {"org_id": str(org)}, operator))["agent_config_id"]
    )
    runner = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="runner"), permissions=set(ALL_PERMISSIONS)
    )
    _ok(await _save(interface, runner, agent))
    disabled = _ok(await interface(s.ADMIN_ORG_DISABLE, {"org_id": str(org)}, operator))
    assert disabled["disabled_at"] is not None
    assert _code(await _save(interface, runner, agent)) == "UNAUTHENTICATED"
    refused = await interface(s.ADMIN_CLIENT_MINT, {"org_id": str(org), "name": "late"}, operator)
    assert _code(refused) == "FORBIDDEN"
    listed = _ok(await interface(s.ADMIN_ORG_LIST, {}, operator))["organizations"]
    assert str(org) not in [o["org_id"] for o in listed]
    listed = _ok(await interface(s.ADMIN_ORG_LIST, {"include_disabled": True}, operator))["organizations"]
    assert str(org) in [o["org_id"] for o in listed]


async def test_a_revoked_token_is_refused_at_once(interface: Interface, engram: Infra, operator: str) -> None:
    """A token minted through the API works until it is revoked, and not one request after."""
    org = await _new_org(interface, operator)
    agent = UUID(
        _ok(await interface(s.ADMIN_AGENT_CONFIG_CREATE, {"org_id": str(org)}, operator))["agent_config_id"]
    )
    minted = _ok(
        await interface(
            s.ADMIN_TOKEN_MINT,
            {"org_id": str(org), "principal": {"kind": "actor", "id": "carol"}, "ttl_seconds": 600},
            operator,
        )
    )
    _ok(await _save(interface, minted["token"], agent))
    _ok(await interface(s.ADMIN_TOKEN_REVOKE, {"org_id": str(org), "token_id": minted["token_id"]}, operator))
    assert _code(await _save(interface, minted["token"], agent)) == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    ("subject", "body", "code"),
    [
        # Deployment permissions are never minted through the API.
        (
            s.ADMIN_TOKEN_MINT,
            {"principal": {"kind": "service", "id": "x"}, "permissions": ["tenant.admin"]},
            "INVALID_REQUEST",
        ),
        (
            s.ADMIN_TOKEN_MINT,
            {"principal": {"kind": "service", "id": "x"}, "permissions": ["deployment.operator"]},
            "INVALID_REQUEST",
        ),
        (
            s.ADMIN_TOKEN_MINT,
            {"principal": {"kind": "actor", "id": "x"}, "ttl_seconds": 10**9},
            "INVALID_REQUEST",
        ),
        (
            s.ADMIN_TOKEN_MINT,
            {"principal": {"kind": "actor", "id": "x"}, "permissions": []},
            "INVALID_REQUEST",
        ),
        (s.ADMIN_CLIENT_MINT, {"name": "Not A Name"}, "INVALID_REQUEST"),
        (s.ADMIN_CLIENT_MINT, {"name": "dev"}, "INVALID_REQUEST"),
        (s.ADMIN_AGENT_CONFIG_CREATE, {"config": {"top_k": -1}}, "INVALID_REQUEST"),
        (s.ADMIN_AGENT_CONFIG_CREATE, {"surprise": 1}, "INVALID_REQUEST"),
        (s.ADMIN_CLIENT_REVOKE, {"name": "nobody-by-that-name"}, "NOT_FOUND"),
    ],
)
async def test_bad_input_is_a_typed_error(
    interface: Interface, engram: Infra, operator: str, subject: str, body: dict[str, Any], code: str
) -> None:
    """Bad admin requests are answered with their SPEC 9 code (400s, 404), never a 500."""
    org = await _new_org(interface, operator)
    if subject != s.ADMIN_CLIENT_REVOKE:
        body = {"org_id": str(org), **body}
    assert _code(await interface(subject, body, operator)) == code


async def test_an_unregistered_organization_is_not_found(
    interface: Interface, engram: Infra, operator: str
) -> None:
    """The admin API acts only on organizations it registered (tokens of others keep working)."""
    body = {"org_id": str(uuid4()), "principal": {"kind": "actor", "id": "x"}}
    assert _code(await interface(s.ADMIN_TOKEN_MINT, body, operator)) == "NOT_FOUND"
