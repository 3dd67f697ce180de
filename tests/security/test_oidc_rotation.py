"""Key rotation at the OpenID provider in the middle of traffic: 0 failed requests.

Workers keep asking the provider for a token and Engram for a recall with it, over NATS and HTTP.
Mid-traffic the provider's operator publishes a new ES256 key that signs from then on (the old one
still published), and once every worker has been served under the new key, withdraws the old one.
Every request must succeed throughout; a token of the withdrawn key is refused afterwards, also
when Engram remembered it (docs/adr/0093-oidc-tokens.md, "Keys"). Progress is counted, never
timed: each phase waits for a number of answered requests."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import jwt
import pytest

from shared.runtime.settings import EngramSettings, OidcIssuerSettings
from shared.security.oidc.issuer import OidcIssuer
from shared.service.infra import Infra
from tests.oidc_provider import AUDIENCE, Client, OidcProvider, SigningKey, new_key, running_provider
from tests.platform import eventually
from tests.security.support import report
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

ORG = uuid4()
WORKERS = 4
#: Requests answered under each key before the next step.
PER_PHASE = 12


@pytest.fixture(scope="module")
async def provider(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OidcProvider]:
    async with running_provider(tmp_path_factory.mktemp("idp"), [Client("es-runner", ORG, "ES256")]) as idp:
        yield idp


@pytest.fixture(scope="module")
def settings(settings: EngramSettings, provider: OidcProvider) -> EngramSettings:
    # Each interface's run rotates again, soon after the last: the rate limit on fetches for
    # unknown key ids (tested in tests/integration/test_oidc_keys.py) is off here, so no run
    # depends on how long the one before took.
    issuer = OidcIssuerSettings(issuer=provider.issuer, audience=AUDIENCE, orgs=(ORG,), refresh_min_s=0)
    return settings.model_copy(update={"oidc_issuers": (issuer,)})


async def test_rotation_at_the_provider_mid_traffic_fails_no_request(
    interface: Interface, engram: Infra, provider: OidcProvider, agent: UUID
) -> None:
    original = list(provider.keys)
    old_kid = provider.key("ES256").kid
    rotated = new_key("ES256", f"es-{uuid4().hex[:8]}")
    served: Counter[str] = Counter()  # answered requests per signing kid
    workers_on_new: set[int] = set()
    failures: list[str] = []
    stop = asyncio.Event()
    body = {"agent_config_id": str(agent), "strategy": "last_k"}

    async def worker(n: int) -> None:
        while not stop.is_set():
            token = await provider.token("es-runner", "memory.read")
            kid = str(jwt.get_unverified_header(token)["kid"])
            reply = await interface("engram.recall", body, token)
            if "error" in reply:
                failures.append(f"{kid}: {reply['error'].get('code')}")
            else:
                served[kid] += 1
                if kid == rotated.kid:
                    workers_on_new.add(n)

    async def at_least(kid: str, count: int) -> bool:
        return served[kid] >= count

    tasks = [asyncio.create_task(worker(n)) for n in range(WORKERS)]
    try:
        await eventually(lambda: at_least(old_kid, PER_PHASE), timeout=120, what="traffic under the old key")
        await provider.publish([rotated, *original])  # the new key signs; the old one is still published
        await eventually(
            lambda: at_least(rotated.kid, PER_PHASE), timeout=120, what="traffic under the new key"
        )

        async def all_moved() -> bool:
            return len(workers_on_new) == WORKERS

        await eventually(all_moved, timeout=120, what="every worker served under the new key")
        old_token = _token_of(provider, old_kid, original)
        # Remembered by Engram while its key is published ...
        assert "error" not in await interface("engram.recall", body, old_token)
        await provider.publish([rotated, *(k for k in original if k.alg != "ES256")])  # withdraw the old key
        settled = served[rotated.kid]
        await eventually(
            lambda: at_least(rotated.kid, settled + PER_PHASE), timeout=120, what="traffic after withdrawal"
        )
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await task
    report(
        interface.label("oidc-rotation"),
        requests=sum(served.values()),
        failed=len(failures),
        by_kid=dict(served),
    )
    assert failures == []
    # A token of the withdrawn key, remembered before: once Engram has seen the withdrawal, refused.
    await _refused_eventually(interface, engram, old_token, body)


def _token_of(provider: OidcProvider, kid: str, keys: list[SigningKey]) -> str:
    """A token signed with the (still published) old key, as one kept by a client would be."""
    key = next(k for k in keys if k.kid == kid)
    return key.sign(provider.claims(ORG, scope="memory.read"))


async def _refused_eventually(
    interface: Interface, engram: Infra, token: str, body: dict[str, object]
) -> None:
    """... and refused once Engram has fetched the set without it (the services verify; a
    refresh stands in for the background one past ``keys_ttl_s``)."""

    async def refused() -> bool:
        for issuer in engram.tokens.issuers:
            assert isinstance(issuer, OidcIssuer)
            await issuer.keys.refresh()
        reply = await interface("engram.recall", body, token)
        return reply.get("error", {}).get("code") == "UNAUTHENTICATED"

    await eventually(refused, timeout=60, what="the withdrawn key's token refused")
