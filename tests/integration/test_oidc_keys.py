"""An issuer's key set against a real OpenID provider (tests/oidc): discovery, the three
algorithms, one shared and rate-limited fetch for unknown key ids, a rotation right after start-up,
failing closed while the provider is down, and the epoch that makes remembered tokens checked again
when a key is withdrawn (docs/adr/0093-oidc-tokens.md, "Keys")."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID, uuid4

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from contracts.errors import Unauthenticated
from shared.runtime.settings import OidcIssuerSettings
from shared.security.auth import TokenService, TokenVerifier
from shared.security.oidc.issuer import OidcIssuer
from shared.security.oidc.keys import KeySet, parse_keys
from tests.conftest import TEST_KID, TEST_SECRET
from tests.oidc_provider import AUDIENCE, Client, OidcProvider, new_key, running_provider

ORG = UUID("6f1c0f5e-3c1a-4c2e-9b7a-1d2e3f405061")
CLIENTS = [
    Client("rs-runner", ORG, "RS256"),
    Client("es-runner", ORG, "ES256"),
    Client("ed-runner", ORG, "EdDSA"),
]


@pytest.fixture(scope="module")
async def provider(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OidcProvider]:
    async with running_provider(tmp_path_factory.mktemp("idp"), CLIENTS) as idp:
        yield idp


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key_set(provider: OidcProvider, clock: Clock | None = None, **kw: float) -> KeySet:
    return KeySet(
        provider.issuer, refresh_min_s=kw.pop("refresh_min_s", 3600.0), clock=clock or Clock(), **kw
    )


async def test_discovery_finds_a_key_of_each_algorithm(provider: OidcProvider) -> None:
    keys = key_set(provider)
    try:
        for key in provider.keys:
            assert (await keys.key(key.kid)).algorithm_name == key.alg
    finally:
        await keys.aclose()


async def test_unknown_kids_share_one_fetch_at_most_once_per_refresh_interval(provider: OidcProvider) -> None:
    keys = key_set(provider)
    try:
        await keys.key("rs-1")  # the first load
        before = await provider.fetches()
        results = await asyncio.gather(
            *(keys.key(f"invented-{i}") for i in range(25)), return_exceptions=True
        )
        assert all(isinstance(r, Unauthenticated) for r in results)
        assert await provider.fetches() == before + 1  # one fetch, shared
        for i in range(25):  # within refresh_min_s: refused without asking the provider again
            with pytest.raises(Unauthenticated):
                await keys.key(f"again-{i}")
        assert await provider.fetches() == before + 1
        assert (await keys.key("es-1")).algorithm_name == "ES256"  # known keys never wait
    finally:
        await keys.aclose()


async def test_a_rotation_right_after_start_up_is_seen(provider: OidcProvider) -> None:
    keys = key_set(provider)
    old = list(provider.keys)
    try:
        await keys.key("ed-1")
        rotated = new_key("ES256", f"es-{uuid4().hex[:8]}")
        await provider.publish([rotated, *old])
        assert (await keys.key(rotated.kid)).algorithm_name == "ES256"
    finally:
        await provider.publish(old)
        await keys.aclose()


async def test_the_provider_down_keeps_known_keys_and_refuses_unknown_ones(provider: OidcProvider) -> None:
    clock = Clock()
    keys = key_set(provider, clock, refresh_min_s=5.0, keys_ttl_s=60.0)
    try:
        await keys.key("rs-1")
        await provider.set_down(True)
        clock.now += 61  # stale: the next use refreshes in the background, which fails
        assert (await keys.key("rs-1")).algorithm_name == "RS256"
        await keys.refresh()
        assert (await keys.key("rs-1")).algorithm_name == "RS256"
        clock.now += 6
        with pytest.raises(Unauthenticated):
            await keys.key("rotated-while-down")
    finally:
        await provider.set_down(False)
        await keys.aclose()


async def test_a_withdrawn_key_bumps_the_epoch_and_its_remembered_tokens_are_refused(
    provider: OidcProvider,
) -> None:
    clock = Clock()
    keys = key_set(provider, clock, keys_ttl_s=60.0)
    settings = OidcIssuerSettings(issuer=provider.issuer, audience=AUDIENCE, orgs=(ORG,))
    verifier = TokenVerifier(TokenService({TEST_KID: TEST_SECRET}), [OidcIssuer(settings, keys)])
    old = list(provider.keys)
    try:
        token = await provider.token("es-runner")
        credential = await verifier.verify(token)
        assert credential.org_id == ORG
        assert credential.principal.ref == "service:es-runner"
        assert credential.permissions == {"memory.read", "memory.write"}
        assert (await verifier.verify(token)) == credential  # remembered
        await provider.publish([new_key("ES256", "es-next"), *(k for k in old if k.alg != "ES256")])
        clock.now += 61
        await verifier.verify(await provider.token("rs-runner"))  # a known key: stale set refetched behind it
        await keys.refresh()
        assert keys.epoch == 1
        assert "es-1" not in keys.kids
        with pytest.raises(Unauthenticated):
            await verifier.verify(token)
        assert (await verifier.verify(await provider.token("es-runner"))).org_id == ORG  # the new key
    finally:
        await provider.publish(old)
        await verifier.aclose()


async def test_discovery_naming_another_issuer_is_refused(provider: OidcProvider) -> None:
    keys = KeySet(provider.issuer + "/", clock=Clock())  # the document says the issuer without "/"
    try:
        with pytest.raises(Unauthenticated):
            await keys.key("rs-1")
    finally:
        await keys.aclose()


async def test_a_token_from_each_algorithm_verifies(provider: OidcProvider, tmp_path: Path) -> None:
    settings = OidcIssuerSettings(issuer=provider.issuer, audience=AUDIENCE, orgs="*")
    verifier = TokenVerifier(TokenService({TEST_KID: TEST_SECRET}), [OidcIssuer(settings)])
    try:
        for client in CLIENTS:
            credential = await verifier.verify(await provider.token(client.client_id, "memory.read"))
            assert credential.principal.ref == f"service:{client.client_id}"
            assert credential.permissions == {"memory.read"}
    finally:
        await verifier.aclose()


class _Hostile(BaseHTTPRequestHandler):
    """Key-set endpoints that misbehave: a redirect to the real set, a set too large to be one,
    and a set of keys Engram must not use (an HMAC secret, a short RSA key, an unknown curve)."""

    real_jwks = ""
    weak_keys: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.real_jwks)
            self.end_headers()
            return
        body = (
            json.dumps({"keys": [{"kty": "RSA", "kid": "pad", "n": "A" * 300_000, "e": "AQAB"}]})
            if self.path == "/huge"
            else json.dumps({"keys": self.weak_keys})
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def hostile(provider: OidcProvider) -> Iterator[str]:
    short = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505 (the point)
    _Hostile.real_jwks = f"{provider.issuer}/jwks"
    _Hostile.weak_keys = [
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0", "alg": "HS256"},
        {**json.loads(RSAAlgorithm.to_jwk(short.public_key())), "kid": "short-rsa"},
        {
            **json.loads(ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP384R1()).public_key())),
            "kid": "p384",
        },
        {**provider.key("RS256").private_jwk(), "kid": "declared-es256", "alg": "ES256"},
        {**provider.key("ES256").private_jwk(), "kid": "encryption", "use": "enc"},
    ]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/redirect", "/huge"])
async def test_redirects_and_oversized_sets_are_not_followed(hostile: str, path: str) -> None:
    keys = KeySet("https://idp.example", jwks_url=f"{hostile}{path}", clock=Clock())
    try:
        with pytest.raises(Unauthenticated):
            await keys.key("rs-1")
        assert keys.kids == frozenset()
    finally:
        await keys.aclose()


async def test_keys_engram_must_not_use_are_never_loaded(hostile: str) -> None:
    """An HMAC secret, an RSA key under 2048 bits, a P-384 key, a key whose declared algorithm is
    not its own and an encryption key: none is kept, and a private part is never loaded."""
    keys = KeySet("https://idp.example", jwks_url=f"{hostile}/weak", clock=Clock())
    try:
        await keys.refresh()
        assert keys.kids == frozenset()
        for kid in ("hmac", "short-rsa", "p384", "declared-es256", "encryption"):
            with pytest.raises(Unauthenticated):
                await keys.key(kid)
    finally:
        await keys.aclose()


def test_a_published_private_key_is_loaded_as_its_public_half(provider: OidcProvider) -> None:
    (loaded,) = parse_keys({"keys": [provider.key("ES256").private_jwk()]}).values()
    assert not hasattr(loaded.key, "private_numbers")
