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
from uuid import uuid4

import pytest

from contracts.common import Principal
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings, OidcIssuerSettings
from shared.security.auth import TENANT_ADMIN, TokenService
from shared.service.infra import Infra
from tests.oidc_provider import AUDIENCE, Client, OidcProvider, running_provider
from tests.platform import eventually
from tests.support.servers import SecuredNatsServer

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
    return settings.model_copy(update={"oidc_issuers": (issuer,), "data_dir": nats_proc.identities.data_dir})


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
