"""Tokens from an OpenID provider (a real ``oidc-provider``, tests/oidc) through every door: the
provider's honest tokens work (RS256, ES256, EdDSA), and every forgery of
``tests/security/oidc_forgery.py`` — plus the provider's own token for an organization its issuer
may not name — is ``UNAUTHENTICATED`` on every request subject over NATS and HTTP, at the MCP door
and at the console's sign-in: zero accepted (docs/adr/0093-oidc-tokens.md)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from nats.aio.client import Client as NatsClient

from shared.runtime.settings import EngramSettings, OidcIssuerSettings
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from tests.oidc_provider import AUDIENCE, Client, OidcProvider, running_provider
from tests.platform import eventually, session_payload
from tests.security.oidc_forgery import oidc_forgeries
from tests.security.support import Tally, count_rows, org_snapshot, report
from tests.security.test_tokens import ALICE, SUBJECTS, _dead_letters, bodies
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

#: The organization the provider's issuer may name, and one it may not (fresh per run).
ORG = uuid4()
FOREIGN = uuid4()
CLIENTS = [
    Client("rs-runner", ORG, "RS256"),
    Client("es-runner", ORG, "ES256"),
    Client("ed-runner", ORG, "EdDSA"),
    # An honest client of the provider whose tokens name an organization this issuer may not.
    Client("intruder", FOREIGN, "RS256"),
]


@pytest.fixture(scope="module")
async def provider(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OidcProvider]:
    async with running_provider(tmp_path_factory.mktemp("idp"), CLIENTS) as idp:
        yield idp


@pytest.fixture(scope="module")
def settings(settings: EngramSettings, provider: OidcProvider) -> EngramSettings:
    """The module's Engram trusts the provider for ``ORG`` only."""
    issuer = OidcIssuerSettings(issuer=provider.issuer, audience=AUDIENCE, orgs=(ORG,))
    return settings.model_copy(update={"oidc_issuers": (issuer,)})


@pytest.fixture
def org() -> UUID:
    return ORG


@pytest.fixture
async def forgeries(provider: OidcProvider) -> dict[str, str]:
    made = oidc_forgeries(provider, ORG, FOREIGN)
    made["intruder_from_the_provider"] = await provider.token(
        "intruder", "memory.read memory.write memory.admin"
    )
    return made


async def test_the_providers_tokens_work_with_each_algorithm(
    interface: Interface, provider: OidcProvider, agent: UUID
) -> None:
    # Texts unlike each other: a save near-identical to an earlier one may be merged into it.
    texts = {
        "rs-runner": "Invoices go out on the 3rd of each month.",
        "es-runner": "The staging VPN host is vpn-stage.internal.",
        "ed-runner": "Deploy freezes start every Friday at noon.",
    }
    for client, text in texts.items():
        token = await provider.token(client)
        saved = await interface(
            "engram.memory.save", {"agent_config_id": str(agent), "content": text, "wait": True}, token
        )
        assert "error" not in saved, saved

        async def recalled(text: str = text, token: str = token) -> bool:
            # A hot result cached before the save may answer until its invalidation arrives.
            reply = await interface(
                "engram.recall", {"agent_config_id": str(agent), "strategy": "last_k"}, token
            )
            assert "error" not in reply, reply
            return text in str(reply)

        await eventually(recalled, what=f"{client}'s memory recalled with its token")


async def test_oidc_forgeries_are_unauthenticated_on_every_subject(
    interface: Interface,
    engram: Infra,
    db: Database,
    agent: UUID,
    provider: OidcProvider,
    forgeries: dict[str, str],
) -> None:
    before = await org_snapshot(db, ORG)
    tally = Tally(interface.label("oidc-forgeries"))
    per_subject = bodies(ORG, agent, str(uuid4()))
    for subject in SUBJECTS:
        for name, token in forgeries.items():
            reply = await interface(subject, per_subject[subject], token)
            code = tally.note(reply)
            if code != "UNAUTHENTICATED":
                tally.problem(f"{subject} {name}: {code or reply}")
    tally.conclude(
        interface=interface,
        snapshots=(before, await org_snapshot(db, ORG)),
        forgeries=len(forgeries),
        subjects=len(SUBJECTS),
    )


async def test_an_issuer_cannot_grant_the_deployment_operator(
    interface: Interface, engram: Infra, provider: OidcProvider
) -> None:
    """``deployment.operator`` in an issuer's scope grants nothing (0082 stays Engram's to mint)."""
    token = await provider.token("rs-runner", "deployment.operator memory.read")
    tally = Tally(interface.label("oidc-operator-scope"))
    for subject, body in (("engram.ops.lag", {}), ("engram.ops.dead_letters", {"limit": 10})):
        if tally.note(await interface(subject, body, token)) != "FORBIDDEN":
            tally.problem(f"{subject}: not FORBIDDEN")
    tally.conclude(interface=interface)


_INITIALIZE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "1"},
    },
}
_MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_oidc_forgeries_are_refused_at_the_mcp_door(
    http: httpx.AsyncClient, provider: OidcProvider, forgeries: dict[str, str]
) -> None:
    honest = await http.post(
        "/mcp",
        json=_INITIALIZE,
        headers={**_MCP_HEADERS, "Authorization": f"Bearer {await provider.token('es-runner')}"},
    )
    assert honest.status_code == 200, honest.text
    accepted = []
    for name, token in forgeries.items():
        reply = await http.post(
            "/mcp", json=_INITIALIZE, headers={**_MCP_HEADERS, "Authorization": f"Bearer {token}"}
        )
        if reply.status_code != 401 or reply.json()["error"]["code"] != "UNAUTHENTICATED":
            accepted.append(f"{name}: {reply.status_code}")
    assert accepted == []


def _csrf(page: str) -> str:
    return page.split('name="csrf" value="', 1)[1].split('"', 1)[0]


async def _sign_in(gateway: str, token: str, agent: UUID) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway, timeout=30.0) as browser:
        csrf = _csrf((await browser.get("/console/signin")).text)
        return await browser.post(
            "/console/signin", data={"csrf": csrf, "token": token, "agent_config_id": str(agent)}
        )


async def test_oidc_forgeries_are_refused_at_the_console_sign_in(
    gateway: str, provider: OidcProvider, forgeries: dict[str, str], agent: UUID
) -> None:
    honest = await _sign_in(gateway, await provider.token("ed-runner"), agent)
    assert honest.status_code == 303, honest.text
    assert honest.headers["location"].endswith("/console/memories")
    accepted = [
        name
        for name, token in forgeries.items()
        if (reply := await _sign_in(gateway, token, agent)).status_code != 401 or "location" in reply.headers
    ]
    assert accepted == []


def _readme_commands() -> str:
    """The README's second block of "Tokens from your identity provider": a token from the
    provider, then a write and a recall with it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Tokens from your identity provider", 1)[1]
    return section.split("```bash\n")[2].split("```", 1)[0]


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
async def test_the_readmes_oidc_commands_work(gateway: str, provider: OidcProvider, agent: UUID) -> None:
    client = provider.clients["es-runner"]
    env = {
        **os.environ,
        "ENGRAM_OIDC_ISSUER": provider.issuer,
        "ENGRAM_OIDC_AUDIENCE": AUDIENCE,
        "CLIENT_ID": client.client_id,
        "CLIENT_SECRET": client.secret,
        "URL": gateway,
        "AGENT": str(agent),
    }
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        _readme_commands(),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    recalled = out.decode().strip().splitlines()[-1]  # the recall's reply
    assert "Invoices go out on the 3rd." in recalled, out.decode()


async def test_oidc_forged_sessions_are_dead_lettered_and_never_distilled(
    interface: Interface,
    engram: Infra,
    observer_nc: NatsClient,
    db: Database,
    agent: UUID,
    provider: OidcProvider,
    forgeries: dict[str, str],
) -> None:
    """A session published with a forged token: over NATS taken in, then refused by ingest and
    dead-lettered ``UNAUTHENTICATED``; over HTTP refused at once. The honest session, published
    with the provider's token after them, is distilled."""
    start = int((await observer_nc.jetstream().stream_info("ENGRAM_DLQ")).state.last_seq)
    trace = [{"tool": "deploy", "input": {}, "error": "remember: the forged lesson"}]
    prefix = f"oidc-{interface.name}"
    taken_in = {
        name: await interface.publish_session(
            session_payload(
                ORG, agent, tool_trace=trace, principal=ALICE, session_id=f"{prefix}-forged-{name}"
            ),
            token,
        )
        for name, token in forgeries.items()
    }
    honest = session_payload(ORG, agent, tool_trace=trace, principal=ALICE, session_id=f"{prefix}-honest")
    assert await interface.publish_session(honest, await provider.token("es-runner"))
    expected = sum(taken_in.values())

    async def settled() -> bool:
        return len(await _dead_letters(observer_nc, start)) >= expected

    async def honest_done() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == ORG, ENTRIES.c.session_id == f"{prefix}-honest") > 0

    await eventually(settled, what="every forged session dead-lettered")
    await eventually(honest_done, what="the honest session distilled")
    codes = Counter(str(letter["code"]) for letter in await _dead_letters(observer_nc, start))
    distilled = await count_rows(db, ENTRIES.c.org_id == ORG, ENTRIES.c.session_id.like(f"{prefix}-forged-%"))
    report(
        interface.label("oidc-forged-sessions"),
        published=len(forgeries),
        codes=dict(codes),
        distilled=distilled,
    )
    refused_at_door = sorted(name for name, accepted in taken_in.items() if not accepted)
    assert refused_at_door == (sorted(taken_in) if interface.checks_sessions_first else [])
    assert codes == ({"UNAUTHENTICATED": expected} if expected else {})
    assert distilled == 0
