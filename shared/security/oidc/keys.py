"""An OpenID Connect issuer's signing keys, fetched without blocking the event loop
(docs/adr/0093-oidc-tokens.md, "Keys").

Not PyJWT's ``PyJWKClient``: it fetches with blocking ``urllib`` and has no refresh policy. Here a
known ``kid`` never waits (a stale set is refetched in the background); an unknown ``kid`` waits
for one fetch shared by every request that needs it, at most once per ``refresh_min_s``; while the
issuer is down the cached keys keep working and unknown ones are refused (fail closed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import httpx
import jwt
from jwt.algorithms import RSAAlgorithm

from contracts.errors import Unauthenticated

__all__ = ["ALGORITHMS", "KeySet", "KeySetError", "parse_keys"]

log = logging.getLogger(__name__)

#: The algorithms an issuer's keys may sign with, by what the key is.
ALGORITHMS: Final = frozenset({"RS256", "ES256", "EdDSA"})
_MAX_BYTES: Final = 256 * 1024
_MIN_RSA_BITS: Final = 2048
# The private members of a JWK: a published key never needs them, and they are never loaded.
_PRIVATE: Final = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})


class KeySetError(Exception):
    """A key set or discovery document could not be fetched or read."""


def _algorithm(jwk: Mapping[str, Any]) -> str | None:
    """The one algorithm this JWK may verify, or None when Engram does not use it."""
    kty, crv, alg = jwk.get("kty"), jwk.get("crv"), jwk.get("alg")
    natural = {"RSA": "RS256", "EC": "ES256" if crv == "P-256" else None}.get(str(kty))
    if kty == "OKP":
        natural = "EdDSA" if crv == "Ed25519" else None
    if natural is None or (alg is not None and alg != natural):
        return None
    return natural


def parse_keys(document: Any) -> dict[str, jwt.PyJWK]:
    """``kid → key`` of a JWKS document's usable signature keys; the rest are skipped."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise KeySetError("not a JWK set")
    keys: dict[str, jwt.PyJWK] = {}
    for raw in document["keys"]:
        if not isinstance(raw, dict):
            continue
        kid = raw.get("kid")
        algorithm = _algorithm(raw)
        if not isinstance(kid, str) or not kid or algorithm is None or raw.get("use", "sig") != "sig":
            continue
        public = {k: v for k, v in raw.items() if k not in _PRIVATE}
        try:
            key = jwt.PyJWK(public, algorithm=algorithm)
            if algorithm == "RS256" and RSAAlgorithm.from_jwk(public).key_size < _MIN_RSA_BITS:
                continue
        except (jwt.PyJWTError, ValueError, TypeError, KeyError):
            log.warning("OIDC key %r skipped: not a usable %s key", kid, algorithm)
            continue
        keys[kid] = key
    return keys


class KeySet:
    """The keys of one issuer. ``epoch`` grows whenever a fetched set drops a ``kid``: what was
    verified under an older epoch is verified again."""

    def __init__(
        self,
        issuer: str,
        *,
        jwks_url: str = "",
        keys_ttl_s: float = 300.0,
        refresh_min_s: float = 10.0,
        fetch_timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._issuer = issuer
        self._jwks_url = jwks_url
        self._ttl = keys_ttl_s
        self._refresh_min = refresh_min_s
        self._clock = clock
        # No redirects: a key set is where the issuer says it is, not where a response points.
        self._http = httpx.AsyncClient(timeout=fetch_timeout_s, follow_redirects=False)
        self._keys: dict[str, jwt.PyJWK] = {}
        self.epoch = 0
        #: When the set is next refetched in the background (None: never fetched).
        self._stale_at: float | None = None
        #: When an unknown kid last caused a fetch (None: none has yet; the first load is free).
        self._forced_at: float | None = None
        self._attempted = False
        self._fetch: asyncio.Task[None] | None = None

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    async def key(self, kid: str) -> jwt.PyJWK:
        """The key ``kid`` names, or ``UNAUTHENTICATED``."""
        now = self._clock()
        known = self._keys.get(kid)
        if known is not None:
            if self._stale_at is not None and now >= self._stale_at and self._fetch is None:
                self._start_fetch()  # in the background: this request does not wait
            return known
        if self._fetch is None:
            if self._forced_at is not None and now - self._forced_at < self._refresh_min:
                raise Unauthenticated("invalid token")
            # The first load does not count against the rate, so a rotation right after start-up is seen.
            if self._attempted:
                self._forced_at = now
            self._start_fetch()
        fetch = self._fetch
        assert fetch is not None
        # shield: one caller giving up does not cancel the fetch the others wait for.
        await asyncio.shield(fetch)
        known = self._keys.get(kid)
        if known is None:
            raise Unauthenticated("invalid token")
        return known

    async def refresh(self) -> None:
        """Fetch the set now (joining a fetch under way), as a stale set is in the background;
        failures are logged and leave the known keys as they were."""
        if self._fetch is None:
            self._start_fetch()
        fetch = self._fetch
        assert fetch is not None
        await asyncio.shield(fetch)

    async def aclose(self) -> None:
        if self._fetch is not None:
            self._fetch.cancel()
        await self._http.aclose()

    def _start_fetch(self) -> None:
        self._attempted = True
        self._fetch = asyncio.get_running_loop().create_task(self._load(), name=f"oidc-keys {self._issuer}")

    async def _load(self) -> None:
        try:
            keys = parse_keys(await self._get_json(await self._keys_url()))
        except (KeySetError, httpx.HTTPError) as exc:
            # Fail closed for unknown keys, keep the known ones; try again no sooner than the rate allows.
            log.warning("OIDC keys of %s could not be fetched: %s", self._issuer, exc)
            self._stale_at = self._clock() + self._refresh_min
            return
        finally:
            self._fetch = None
        if set(self._keys) - set(keys):
            self.epoch += 1
        self._keys = keys
        self._stale_at = self._clock() + self._ttl

    async def _keys_url(self) -> str:
        if self._jwks_url:
            return self._jwks_url
        document = await self._get_json(f"{self._issuer.rstrip('/')}/.well-known/openid-configuration")
        if not isinstance(document, dict) or document.get("issuer") != self._issuer:
            raise KeySetError("the discovery document names another issuer")
        url = document.get("jwks_uri")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise KeySetError("the discovery document has no jwks_uri")
        self._jwks_url = url
        return url

    async def _get_json(self, url: str) -> Any:
        async with self._http.stream("GET", url, headers={"Accept": "application/json"}) as response:
            if response.status_code != 200:
                raise KeySetError(f"{url} answered {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > _MAX_BYTES:
                    raise KeySetError(f"{url} sent more than {_MAX_BYTES} bytes")
        try:
            return json.loads(bytes(body))
        except ValueError as exc:
            raise KeySetError(f"{url} sent no JSON") from exc
