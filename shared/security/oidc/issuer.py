"""One OpenID Connect issuer's tokens: the token rules and the claim mapping of
docs/adr/0093-oidc-tokens.md ("Claims", "Token rules")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from uuid import UUID

import jwt

from contracts.common import Principal
from contracts.errors import Unauthenticated
from contracts.json_rules import check_storable
from shared.runtime.settings import OidcIssuerSettings
from shared.security.auth import ALL_PERMISSIONS, Credential
from shared.security.oidc.keys import ALGORITHMS, KeySet

__all__ = ["OidcIssuer"]

#: Header fields by which a token brings or points at its own key (or makes up its own rules):
#: a legitimate access token has none of them, so such a token is refused, not half-read.
_FORBIDDEN_HEADERS: Final = frozenset({"jwk", "jku", "x5u", "x5c", "crit"})


class OidcIssuer:
    """Verifies the tokens of one configured issuer with that issuer's own keys."""

    def __init__(self, settings: OidcIssuerSettings, keys: KeySet | None = None) -> None:
        self.settings = settings
        self.keys = keys or KeySet(
            settings.issuer,
            jwks_url=settings.jwks_url,
            keys_ttl_s=settings.keys_ttl_s,
            refresh_min_s=settings.refresh_min_s,
            fetch_timeout_s=settings.fetch_timeout_s,
        )

    @property
    def name(self) -> str:
        return self.settings.issuer

    @property
    def epoch(self) -> int:
        return self.keys.epoch

    async def aclose(self) -> None:
        await self.keys.aclose()

    async def verify(self, token: str, header: Mapping[str, Any]) -> tuple[Credential, float]:
        """The credential ``token`` proves and its expiry, or ``UNAUTHENTICATED``. ``header`` is
        the token's unverified header: it may refuse a token, never choose a key."""
        kid, alg = header.get("kid"), header.get("alg")
        if _FORBIDDEN_HEADERS & set(header) or not isinstance(kid, str) or alg not in ALGORITHMS:
            raise Unauthenticated("invalid token")
        key = await self.keys.key(kid)
        if alg != key.algorithm_name:  # the key's algorithm only (no HS256 keyed with an RSA key)
            raise Unauthenticated("invalid token")
        s = self.settings
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm_name],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("token expired") from exc
        except jwt.PyJWTError as exc:
            raise Unauthenticated("invalid token") from exc
        credential = self._credential(claims)
        if not s.may_name(credential.org_id):
            raise Unauthenticated(
                "token names an organization its issuer may not speak for", {"issuer": s.issuer}
            )
        return credential, float(claims["exp"])

    def _credential(self, claims: Mapping[str, Any]) -> Credential:
        """The claim mapping: a claim Engram reads in a shape it cannot take makes the token
        invalid, never a default."""
        s = self.settings
        try:
            org = claims[s.org_claim]
            kind = claims.get(s.principal_kind_claim, "service")
            ident = claims.get(s.principal_claim)
            perms = claims.get(s.permissions_claim)
            if perms is None and s.permissions_claim == "scope":
                perms = claims.get("scp")
            agent = claims.get(s.agent_config_claim)
            jti = claims.get("jti", "")
            for value in (org, kind, ident, agent, jti):
                if value is not None and not isinstance(value, str):
                    raise TypeError("a claim Engram reads is not text")
            # Claims reach queries and audit records: the text rule of every payload holds here too.
            check_storable([org, kind, ident, agent, jti, perms])
            principal = Principal(kind=kind, id=None if kind == "none" else ident)
            return Credential(
                org_id=UUID(org),
                principal=principal,
                # Only an organization's permissions: the deployment operator's is never an issuer's to give.
                permissions=_permissions(perms) & ALL_PERMISSIONS,
                agent_config_id=UUID(agent) if agent is not None else None,
                token_id=jti,
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise Unauthenticated("invalid token claims") from exc


def _permissions(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(p, str) for p in value):
        return frozenset(value)
    raise TypeError("permissions must be space-separated text or a list of strings")
