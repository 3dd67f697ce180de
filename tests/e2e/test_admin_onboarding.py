"""Onboarding an organization entirely through the admin API, as the README's "Run it for many
tenants" says — its commands, run as written: the operator registers the organization under the id
its identity provider (a real ``oidc-provider``) names, creates its agent config and a platform
client (over HTTP, then with ``engram credentials … --url``); the organization's runner takes a token
from the provider, publishes a session and recalls what was distilled from it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest

from contracts.common import Principal
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings, OidcIssuerSettings
from shared.security.auth import TENANT_ADMIN, TokenService
from shared.service.infra import Infra
from tests.oidc_provider import AUDIENCE, Client, OidcProvider, running_provider
from tests.platform import eventually, save_over_http
from tests.support.servers import SecuredNatsServer
from tests.support.webhook_receiver import webhook_receiver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq"),
]

README = Path(__file__).resolve().parents[2] / "README.md"
#: The organization the provider speaks for, onboarded by the test (fresh per run).
ORG = uuid4()
RUNNER = Client("acme-idp-runner", ORG, "ES256")


@pytest.fixture(scope="module")
async def provider(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OidcProvider]:
    async with running_provider(tmp_path_factory.mktemp("idp"), [RUNNER]) as idp:
        yield idp


@pytest.fixture(scope="module")
def settings(
    settings: EngramSettings, provider: OidcProvider, nats_proc: NatsServerProcess
) -> EngramSettings:
    """Engram trusts the provider for ``ORG``, and issues NATS identities from the server's registry
    (as ``engram up`` does)."""
    assert isinstance(nats_proc, SecuredNatsServer)
    issuer = OidcIssuerSettings(issuer=provider.issuer, audience=AUDIENCE, orgs=(ORG,))
    return settings.model_copy(
        update={
            "oidc_issuers": (issuer,),
            "data_dir": nats_proc.identities.data_dir,
            # The organization's webhook receiver runs on this machine (tests/support).
            "webhook_allow_private_networks": True,
        }
    )


def _blocks() -> list[str]:
    """The bash blocks of "Onboarding through the admin API": onboarding, a session, a recall."""
    section = README.read_text().split("### Onboarding through the admin API", 1)[1]
    section = section.split("\n## ", 1)[0].split("\n### ", 1)[0]
    return [part.split("```", 1)[0] for part in section.split("```bash\n")[1:]]


async def _bash(script: str, env: dict[str, str], cwd: Path) -> str:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, f"{err.decode()[-3000:]}\n{out.decode()[-2000:]}"
    return out.decode()


async def test_the_readme_onboards_an_organization_through_the_admin_api(
    engram: Infra,
    gateway: str,
    settings: EngramSettings,
    provider: OidcProvider,
    tokens: TokenService,
    tmp_path: Path,
    http: httpx.AsyncClient,
    org: UUID,
    service_token: str,
) -> None:
    """The README's commands onboard ``ORG`` and its runner's session becomes recallable memory
    with the provider's token; the platform client's file holds a NATS identity and a token, the
    CLI's client was minted and revoked, and only that organization's agent config exists."""
    onboard, publish, recall = _blocks()
    operator = tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="ops"), permissions={TENANT_ADMIN}
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")},
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "URL": gateway,
        "NATS_URL": settings.nats_url,
        "ENGRAM_TOKEN": operator,
        "ORG": str(ORG),
        "ENGRAM_OIDC_ISSUER": provider.issuer,
        "ENGRAM_OIDC_AUDIENCE": AUDIENCE,
        "CLIENT_ID": RUNNER.client_id,
        "CLIENT_SECRET": RUNNER.secret,
    }
    state = tmp_path / "state"
    # The blocks in order in one shell; what the recall needs is kept for it.
    await _bash(f'{onboard}\n{publish}\nprintf "%s\\n%s\\n" "$AGENT" "$TOKEN" > {state}', env, tmp_path)
    agent, token = state.read_text().split()
    client = json.loads((tmp_path / "acme-runner.json").read_text())
    assert client["org_id"] == str(ORG)
    assert client["nats_inbox_prefix"] == "_INBOX_acme-runner"
    assert client["nats_nkey_seed"].startswith("SU")
    batch = json.loads((tmp_path / "acme-batch.json").read_text())
    assert batch["org_id"] == str(ORG)
    assert batch["http_url"] == gateway

    recalled: list[str] = []

    async def learnt() -> bool:
        out = await _bash(recall, {**env, "AGENT": agent, "TOKEN": token}, tmp_path)
        recalled.append(out)
        return bool(json.loads(out)["results"])

    await eventually(learnt, what=lambda: f"the session's lesson recalled (last reply: {recalled[-1:]})")

    listing = await _bash(
        'engram credentials list --url "$URL" --all\n'
        # Over NATS, as a client's file says (its NATS identity, the operator's token).
        'engram credentials mint --url "$URL" --org "$ORG" --name acme-ops \\\n'
        '  --nats-url "$NATS_URL" --out ops.json\n'
        'engram credentials agent-config-list --connection ops.json --org "$ORG"',
        env,
        tmp_path,
    )
    lines = [json.loads(line) for line in listing.splitlines() if line.startswith("{")]
    minted = await _bash('engram token mint --url "$URL" --org "$ORG" --kind actor --id carol', env, tmp_path)
    credential, _ = tokens.check(minted.strip())
    assert (credential.org_id, credential.principal.ref) == (ORG, "actor:carol")
    clients = {c["name"]: c for c in lines if "name" in c and c.get("org_id") == str(ORG)}
    assert clients["acme-runner"]["revoked_at"] is None
    assert clients["acme-batch"]["revoked_at"] is not None
    assert [c["agent_config_id"] for c in lines if "agent_config_id" in c and "version" in c] == [agent]

    feed_token = (
        await _bash(
            'engram token mint --url "$URL" --org "$ORG" --kind service --id compliance --perm memory.admin',
            env,
            tmp_path,
        )
    ).strip()
    await _feeds_show_only_the_organization(http, feed_token, token, UUID(agent), service_token)
    assert org != ORG


async def _feeds_show_only_the_organization(
    http: httpx.AsyncClient, feed_token: str, runner_token: str, agent: UUID, other_token: str
) -> None:
    auth = {"Authorization": f"Bearer {feed_token}"}
    async with webhook_receiver() as receiver:
        hook = await http.post("/v1/webhooks", json={"url": receiver.url("/acme")}, headers=auth)
        assert hook.status_code == 200, hook.text
        endpoint = receiver.endpoints["/acme"]
        endpoint.secret = hook.json()["secret"]

        other = await save_over_http(http, other_token, uuid4(), "Bob's parcels go to the back door.")
        ours = await save_over_http(http, runner_token, agent, "Alice's refunds go to store credit.")

        await eventually(
            lambda: any(ours in e["_body"].decode() for e in endpoint.received),
            what=lambda: f"the organization's memory delivered (deliveries: {len(endpoint.received)})",
        )
        bodies = [e["_body"].decode() for e in endpoint.received]
        assert all(str(ORG) in body and other not in body for body in bodies), bodies
        assert all("store credit" not in body for body in bodies)  # ids and metadata, never text

        seen: list[dict[str, Any]] = []
        async with http.stream("GET", "/v1/events?from_start=true", headers=auth, timeout=60) as events:
            assert events.status_code == 200
            async for line in events.aiter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line.removeprefix("data: ")))
                    if ours in line:
                        break
        assert ours in {d.get("entry_id") for d in seen}
        assert {d.get("org_id") for d in seen} == {str(ORG)}
        assert other not in {d.get("entry_id") for d in seen}
