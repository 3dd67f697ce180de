"""What ``TokenVerifier.verify`` costs (docs/adr/0093-oidc-tokens.md), against a real OpenID provider
(tests/oidc): the first verification of each of ``--fresh`` new tokens (the provider's keys already
cached) and a remembered token (``--calls`` calls), for Engram's own HS256 and the provider's RS256,
ES256 and EdDSA tokens; then the first ES256 token after the provider rotated its key (one key-set
fetch on loopback) and the synchronous ``TokenService.verify`` of a remembered token.

    .venv/bin/python -m tests.bench.token_verify
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from uuid import uuid4

from contracts.common import Principal
from shared.runtime.settings import OidcIssuerSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService, TokenVerifier, generate_secret
from shared.security.oidc.issuer import OidcIssuer
from tests.oidc_provider import AUDIENCE, Client, new_key, running_provider

ORG = uuid4()
CLIENTS = [Client("rs", ORG, "RS256"), Client("es", ORG, "ES256"), Client("ed", ORG, "EdDSA")]


async def _median_us(verify: Callable[[str], Awaitable[object]], tokens: list[str]) -> float:
    times = []
    for token in tokens:
        started = time.perf_counter()
        await verify(token)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


async def main(fresh: int, calls: int) -> None:
    own = TokenService({"k": generate_secret()})
    with tempfile.TemporaryDirectory() as tmp:
        async with running_provider(Path(tmp), CLIENTS) as idp:
            settings = OidcIssuerSettings(issuer=idp.issuer, audience=AUDIENCE, orgs=(ORG,))
            verifier = TokenVerifier(own, [OidcIssuer(settings)])
            try:
                runner = Principal(kind="service", id="runner")
                kinds: dict[str, list[str]] = {
                    "HS256": [
                        own.mint(org_id=ORG, principal=runner, permissions=ALL_PERMISSIONS)
                        for _ in range(fresh)
                    ]
                }
                for client in CLIENTS:
                    await verifier.verify(await idp.token(client.client_id))  # the keys, cached
                    kinds[client.alg] = [await idp.token(client.client_id) for _ in range(fresh)]
                for alg, tokens in kinds.items():
                    first = await _median_us(verifier.verify, tokens)
                    remembered = await _median_us(verifier.verify, [tokens[0]] * calls)
                    print(f"{alg}: first {first:.0f} µs, remembered {remembered:.1f} µs")
                await idp.publish([new_key("ES256", "es-rotated"), *idp.keys])
                token = await idp.token("es")
                started = time.perf_counter()
                await verifier.verify(token)
                print(f"first ES256 token after a rotation: {(time.perf_counter() - started) * 1e3:.1f} ms")
                hs = kinds["HS256"][0]
                own.verify(hs)
                times = []
                for _ in range(calls):
                    started = time.perf_counter()
                    own.verify(hs)
                    times.append(time.perf_counter() - started)
                print(f"TokenService.verify, remembered: {statistics.median(times) * 1e6:.1f} µs")
            finally:
                await verifier.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", type=int, default=200)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.fresh, args.calls))
