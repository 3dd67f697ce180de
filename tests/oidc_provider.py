"""A real OpenID provider for the OIDC tests: ``oidc-provider`` (npm, installed into tests/oidc by
``make install``) started by ``tests/oidc/provider.mjs`` on a free loopback port.

The tests make the provider's signing keys (RS256, ES256, EdDSA) themselves, so an attacker test
can also sign with the real key a token that breaks one other rule; the provider itself issues
the honest tokens (client-credentials grant, the resource indicator as audience)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

__all__ = ["AUDIENCE", "Client", "OidcProvider", "SigningKey", "new_key", "running_provider"]

PROVIDER_DIR = Path(__file__).parent / "oidc"
AUDIENCE = "https://engram.test"
_START_S = 60.0


@dataclass(frozen=True)
class SigningKey:
    kid: str
    alg: str
    private: PrivateKeyTypes

    def private_jwk(self) -> dict[str, Any]:
        algorithm: Any = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[self.alg]
        jwk: dict[str, Any] = json.loads(algorithm.to_jwk(self.private))
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.private.public_key().public_bytes(  # type: ignore[union-attr]
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid, **header})  # type: ignore[arg-type]


def new_key(alg: str, kid: str) -> SigningKey:
    private: PrivateKeyTypes
    if alg == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        private = ed25519.Ed25519PrivateKey.generate()
    return SigningKey(kid, alg, private)


@dataclass(frozen=True)
class Client:
    client_id: str
    org_id: UUID
    alg: str
    principal_kind: str | None = None

    @property
    def secret(self) -> str:
        return f"{self.client_id}-secret-for-tests-only-0123456789"


@dataclass
class OidcProvider:
    issuer: str
    keys: list[SigningKey]
    clients: dict[str, Client]
    http: httpx.AsyncClient
    _process: asyncio.subprocess.Process = field(repr=False)

    def key(self, alg: str) -> SigningKey:
        return next(k for k in self.keys if k.alg == alg)

    async def token(
        self, client_id: str, scope: str = "memory.read memory.write", resource: str = AUDIENCE
    ) -> str:
        """An access token the provider issues to ``client_id`` (client-credentials grant)."""
        client = self.clients[client_id]
        reply = await self.http.post(
            f"{self.issuer}/token",
            auth=(client.client_id, client.secret),
            data={"grant_type": "client_credentials", "resource": resource, "scope": scope},
        )
        reply.raise_for_status()
        return str(reply.json()["access_token"])

    async def publish(self, keys: list[SigningKey]) -> None:
        """The IdP's operator publishes ``keys`` (the first of each algorithm signs from now on)."""
        reply = await self.http.post(
            f"{self.issuer}/_test/keys", json={"keys": [k.private_jwk() for k in keys]}
        )
        reply.raise_for_status()
        self.keys = list(keys)

    async def set_down(self, down: bool) -> None:
        (await self.http.post(f"{self.issuer}/_test/down", json={"down": down})).raise_for_status()

    async def fetches(self) -> int:
        """How many times the key set was fetched."""
        return int((await self.http.get(f"{self.issuer}/_test/fetches")).json()["fetches"])

    def claims(self, org: UUID, **extra: Any) -> dict[str, Any]:
        """Claims an honest access token of this provider would carry (for hand-signed tokens)."""
        import time

        now = int(time.time())
        return {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": "runner",
            "iat": now,
            "exp": now + 600,
            "jti": f"jti-{now}",
            "org_id": str(org),
            "scope": "memory.read memory.write",
            **extra,
        }


def provider_available() -> bool:
    return shutil.which("node") is not None and (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir()


@asynccontextmanager
async def running_provider(workdir: Path, clients: list[Client]) -> AsyncIterator[OidcProvider]:
    """The provider on a free port with fresh RS256, ES256 and EdDSA keys, until the block ends."""
    if not provider_available():
        pytest.skip("the OpenID provider is not installed (node and `make install`: tests/oidc)")
    keys = [new_key("RS256", "rs-1"), new_key("ES256", "es-1"), new_key("EdDSA", "ed-1")]
    config = workdir / "provider.json"
    config.write_text(
        json.dumps(
            {
                "port": 0,
                "keys": {"keys": [k.private_jwk() for k in keys]},
                "clients": [
                    {
                        "client_id": c.client_id,
                        "client_secret": c.secret,
                        "org_id": str(c.org_id),
                        "alg": c.alg,
                        **({"principal_kind": c.principal_kind} if c.principal_kind else {}),
                    }
                    for c in clients
                ],
            }
        )
    )
    process = await asyncio.create_subprocess_exec(
        "node",
        str(PROVIDER_DIR / "provider.mjs"),
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), _START_S)
        if not line:
            raise RuntimeError("the OpenID provider exited while starting")
        issuer = json.loads(line)["issuer"]
        async with httpx.AsyncClient(timeout=30.0) as http:
            yield OidcProvider(issuer, keys, {c.client_id: c for c in clients}, http, process)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
