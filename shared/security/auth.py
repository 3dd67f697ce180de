"""Signed bearer tokens (SPEC section 8): HS256 JWTs via PyJWT, with key ids for rotation.

A token names the organization, the principal, its permissions, optional agent config and
session restrictions, and an expiry. Tenancy is taken from the verified token, never from a
payload; :func:`act_as` decides whom a request may act for.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol
from uuid import UUID, uuid4

import jwt
from cachetools import TLRUCache

from contracts.common import Principal
from contracts.errors import Forbidden, Unauthenticated
from contracts.json_rules import check_storable

__all__ = [
    "ALL_PERMISSIONS",
    "KNOWN_PERMISSIONS",
    "OPERATOR",
    "TENANT_ADMIN",
    "Credential",
    "Issuer",
    "TokenService",
    "TokenVerifier",
    "act_as",
    "bearer_from_headers",
    "generate_secret",
]

READ: Final = "memory.read"
WRITE: Final = "memory.write"
ADMIN: Final = "memory.admin"
PURGE: Final = "memory.purge"
#: Every permission within one organization (what a tenant's token may hold).
ALL_PERMISSIONS: Final = frozenset({READ, WRITE, ADMIN, PURGE})
#: The deployment's operator: every organization's dead letters, including those of input that
#: named no verified organization (the system organization's), and the pipeline's lag. No
#: organization's right over another: only whoever runs the deployment mints it (``engram token
#: mint``; ``engram up``'s development token holds it). docs/adr/0082-operator-scoped-rejects.md.
OPERATOR: Final = "deployment.operator"
#: The administration of tenants (``engram.admin.*``: organizations, agent configs, platform clients,
#: tokens), deployment-wide like :data:`OPERATOR` and held by no organization's token over another:
#: the organization a token names does not bound it (docs/adr/0104-admin-api.md).
TENANT_ADMIN: Final = "tenant.admin"
#: The deployment's permissions, which no organization's client is given.
DEPLOYMENT_PERMISSIONS: Final = frozenset({OPERATOR, TENANT_ADMIN})
KNOWN_PERMISSIONS: Final = ALL_PERMISSIONS | DEPLOYMENT_PERMISSIONS
_ALGORITHM: Final = "HS256"
# Bearer tokens are short JWTs; anything much longer is garbage or an attack on the parser.
_MAX_TOKEN_CHARS: Final = 4096


def _presented(token: str | None) -> str:
    """``token``, unless there is none (``missing bearer token``) or it is longer than any token
    Engram accepts (``invalid token``, before any parsing)."""
    if not token:
        raise Unauthenticated("missing bearer token")
    if len(token) > _MAX_TOKEN_CHARS:
        raise Unauthenticated("invalid token")
    return token


@dataclass(frozen=True)
class Credential:
    """What a verified token proves about the caller."""

    org_id: UUID
    principal: Principal
    permissions: frozenset[str]
    agent_config_id: UUID | None = None
    session_id: str | None = None
    token_id: str = field(default="")

    def require(self, permission: str) -> None:
        if permission not in self.permissions:
            raise Forbidden(f"token lacks permission {permission!r}", {"permission": permission})

    @property
    def is_operator(self) -> bool:
        """``memory.admin`` held by anyone but an end user: admin is an operator's permission, and
        an end-user token carrying it is not trusted with other people's memory."""
        return ADMIN in self.permissions and self.principal.kind != "end_user"

    def require_operator(self) -> None:
        self.require(ADMIN)
        if self.principal.kind == "end_user":
            raise Forbidden("memory.admin is an operator permission; an end-user token cannot use it")

    @property
    def is_deployment_operator(self) -> bool:
        """:data:`OPERATOR` on a token that is not an end user's and is not restricted to an agent
        config or session (such a token is not trusted with the whole deployment)."""
        return (
            OPERATOR in self.permissions
            and self.principal.kind != "end_user"
            and self.agent_config_id is None
            and self.session_id is None
        )

    def require_deployment_operator(self, permission: str = OPERATOR) -> None:
        """``permission`` (:data:`OPERATOR` or :data:`TENANT_ADMIN`), on a token trusted with the
        whole deployment: not an end user's, not restricted to an agent config or session."""
        self.require(permission)
        if (
            self.principal.kind == "end_user"
            or self.agent_config_id is not None
            or self.session_id is not None
        ):
            raise Forbidden(
                f"{permission} counts only on a token that is not an end user's nor restricted to an "
                "agent config or session"
            )

    def require_agent_config(self, agent_config_id: UUID) -> None:
        if self.agent_config_id is not None and self.agent_config_id != agent_config_id:
            raise Forbidden("token is restricted to another agent config")

    def require_session(self, session_id: str | None) -> None:
        if self.session_id is not None and self.session_id != session_id:
            raise Forbidden("token is restricted to another session")


def generate_secret() -> str:
    return secrets.token_urlsafe(48)


class TokenService:
    """Mints and verifies tokens with ``kid → secret`` keys; the first key signs.

    A verified token is remembered until it expires: an agent sends the same token with every
    request, and decoding and checking a JWT costs more than a recall's own Python work (about
    0.1 ms). Only a token that passed every check is remembered, by its exact text, and its
    expiry is checked again on each use; the keys of a TokenService never change and tokens are
    not revocable before they expire, so a remembered answer is the answer a check would give.
    """

    def __init__(
        self,
        keys: Mapping[str, str],
        issuer: str = "engram",
        *,
        remember: int = 4096,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not keys:
            raise ValueError("TokenService needs at least one signing key (set ENGRAM_TOKEN_KEYS)")
        self._keys = dict(keys)
        self._signing_kid = next(iter(self._keys))
        self._issuer = issuer
        self._clock = clock
        # token → (credential, expiry): each entry lives until its own token's ``exp`` on the wall
        # clock, the least recently used going first when full.
        self._verified: TLRUCache[str, tuple[Credential, float], float] = TLRUCache(
            maxsize=remember, ttu=lambda _token, known, _now: known[1], timer=clock
        )

    def mint(
        self,
        *,
        org_id: UUID,
        principal: Principal,
        permissions: frozenset[str] | set[str],
        ttl_seconds: int = 3600,
        agent_config_id: UUID | None = None,
        session_id: str | None = None,
    ) -> str:
        unknown = set(permissions) - KNOWN_PERMISSIONS
        if unknown:
            raise ValueError(f"unknown permissions: {sorted(unknown)}")
        now = int(time.time())
        claims: dict[str, object] = {
            "iss": self._issuer,
            "iat": now,
            "exp": now + ttl_seconds,
            "jti": uuid4().hex,
            "org": str(org_id),
            "pk": principal.kind,
            "pid": principal.id,
            "perms": sorted(permissions),
        }
        if agent_config_id is not None:
            claims["acfg"] = str(agent_config_id)
        if session_id is not None:
            claims["sid"] = session_id
        return jwt.encode(
            claims, self._keys[self._signing_kid], algorithm=_ALGORITHM, headers={"kid": self._signing_kid}
        )

    def verify(self, token: str | None) -> Credential:
        """Check signature, issuer and expiry; any failure is ``UNAUTHENTICATED`` without detail
        an attacker could use to tell a wrong key from a wrong claim."""
        token = _presented(token)
        known = self._verified.get(token)
        if known is not None:
            return known[0]
        credential, expires = self.check(token)
        if self._clock() >= expires:  # PyJWT reads its own clock; the memory expires on this one
            raise Unauthenticated("token expired")
        self._verified[token] = (credential, expires)
        return credential

    @property
    def issuer(self) -> str:
        return self._issuer

    def check(self, token: str) -> tuple[Credential, float]:
        """What ``token`` proves and its ``exp``, checked now (nothing remembered)."""
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            secret = self._keys.get(kid) if isinstance(kid, str) else None
            if secret is None:
                raise Unauthenticated("invalid token")
            claims = jwt.decode(
                token,
                secret,
                algorithms=[_ALGORITHM],
                issuer=self._issuer,
                options={"require": ["exp", "iat", "iss", "org", "pk", "perms"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("token expired") from exc
        except jwt.PyJWTError as exc:
            raise Unauthenticated("invalid token") from exc
        try:
            # Claims reach queries and audit records: the text rule of every payload holds here too.
            check_storable(claims)
            session_id = claims.get("sid")
            if session_id is not None and not isinstance(session_id, str):
                raise TypeError("sid must be a string")
            principal = Principal(kind=claims["pk"], id=claims.get("pid"))
            raw_perms = claims["perms"]
            # A list of strings only: an object's keys ({"memory.admin": false}) grant nothing.
            if not isinstance(raw_perms, list) or not all(isinstance(p, str) for p in raw_perms):
                raise TypeError("perms must be a list of strings")
            perms = frozenset(raw_perms)
            acfg = claims.get("acfg")
            credential = Credential(
                org_id=UUID(str(claims["org"])),
                principal=principal,
                permissions=perms & KNOWN_PERMISSIONS,
                agent_config_id=UUID(str(acfg)) if acfg else None,
                session_id=session_id,
                token_id=str(claims.get("jti", "")),
            )
            return credential, float(claims["exp"])
        except (ValueError, TypeError, KeyError) as exc:
            raise Unauthenticated("invalid token claims") from exc


class Issuer(Protocol):
    """Another issuer's tokens (``shared.security.oidc.issuer.OidcIssuer``: an OpenID Connect issuer)."""

    @property
    def name(self) -> str:
        """The ``iss`` its tokens carry."""
        ...

    @property
    def epoch(self) -> int:
        """Grows when a key it verified with is withdrawn."""
        ...

    async def verify(self, token: str, header: Mapping[str, Any]) -> tuple[Credential, float]: ...

    async def aclose(self) -> None: ...


class Revocations:
    """What the admin API refused before it expired: token ids (``jti``) and disabled
    organizations. Sets in memory, checked on every token check (a lookup each); filled from
    Postgres at start and kept current by ``engram.admin.revoked`` (``shared.service.revocations``)."""

    def __init__(self) -> None:
        self._tokens: set[str] = set()
        self._orgs: set[UUID] = set()

    def revoke_token(self, token_id: str) -> None:
        self._tokens.add(token_id)

    def disable_org(self, org_id: UUID) -> None:
        self._orgs.add(org_id)

    def refuse(self, credential: Credential) -> None:
        """``UNAUTHENTICATED`` for a revoked token or a disabled organization's."""
        if credential.org_id in self._orgs:
            raise Unauthenticated("organization disabled")
        if credential.token_id and credential.token_id in self._tokens:
            raise Unauthenticated("token revoked")


class TokenVerifier:
    """The one way a token becomes a credential (docs/adr/0093-oidc-tokens.md): Engram's own
    tokens through :class:`TokenService`, an OpenID Connect issuer's through its :class:`Issuer`
    (``shared.security.oidc.issuer.OidcIssuer``), chosen by the token's unverified ``iss`` — which
    only picks who checks it, never a key.

    A verified token is remembered until it expires (0042), tagged with its issuer's key epoch:
    when the issuer's key set drops a key, what was remembered under the older epoch is checked
    again (and refused if its key is gone).
    """

    def __init__(
        self,
        own: TokenService,
        issuers: Sequence[Issuer] = (),
        *,
        remember: int = 4096,
        clock: Callable[[], float] = time.time,
        revocations: Revocations | None = None,
    ) -> None:
        self.own = own
        #: Tokens revoked and organizations disabled (the admin API's): refused on every check,
        #: remembered or not.
        self.revocations = revocations or Revocations()
        self._issuers = {issuer.name: issuer for issuer in issuers}
        self._clock = clock
        # token → (credential, expiry, issuer or None for Engram's own, that issuer's epoch)
        self._verified: TLRUCache[str, tuple[Credential, float, Issuer | None, int], float] = TLRUCache(
            maxsize=remember, ttu=lambda _token, known, _now: known[1], timer=clock
        )

    @classmethod
    def of(cls, tokens: TokenService | TokenVerifier) -> TokenVerifier:
        """A verifier for ``tokens`` (Engram's own tokens only, when given a TokenService)."""
        return tokens if isinstance(tokens, TokenVerifier) else cls(tokens)

    @property
    def issuers(self) -> list[Issuer]:
        return list(self._issuers.values())

    async def verify(self, token: str | None) -> Credential:
        """What ``token`` proves, or ``UNAUTHENTICATED`` (with the same terse messages whoever
        issued it)."""
        return (await self.check(token))[0]

    async def check(self, token: str | None) -> tuple[Credential, float]:
        """:meth:`verify`, with the token's expiry (what a console session may last)."""
        token = _presented(token)
        known = self._verified.get(token)
        if known is not None:
            credential, expires, issuer, epoch = known
            if issuer is None or issuer.epoch == epoch:
                self.revocations.refuse(credential)
                return credential, expires
            del self._verified[token]
        issuer, header = self._route(token)
        if issuer is None:
            credential, expires = self.own.check(token)
            epoch = 0
        else:
            epoch = issuer.epoch  # before the check: a rotation during it is not missed
            credential, expires = await issuer.verify(token, header)
        if self._clock() >= expires:  # PyJWT reads its own clock; the memory expires on this one
            raise Unauthenticated("token expired")
        self.revocations.refuse(credential)
        self._verified[token] = (credential, expires, issuer, epoch)
        return credential, expires

    def _route(self, token: str) -> tuple[Issuer | None, dict[str, Any]]:
        """The issuer whose token this claims to be (None: Engram's own), and its header."""
        if not self._issuers:
            return None, {}
        try:
            unverified = jwt.decode_complete(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise Unauthenticated("invalid token") from exc
        payload = unverified["payload"]
        iss = payload.get("iss") if isinstance(payload, dict) else None
        issuer = self._issuers.get(iss) if isinstance(iss, str) else None
        return issuer, dict(unverified["header"])

    async def aclose(self) -> None:
        for issuer in self._issuers.values():
            await issuer.aclose()


def bearer_from_headers(headers: Mapping[str, str] | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` NATS header, if any."""
    if not headers:
        return None
    value = headers.get("Authorization") or headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def act_as(credential: Credential, requested: Principal | None) -> Principal:
    """Whom a request acts for: a service token may name anyone in its organization (and acts
    for the shared pool when it names no one); every other token acts only for itself."""
    if credential.principal.kind == "service":
        return requested if requested is not None else Principal(kind="none")
    if requested is not None and requested != credential.principal:
        raise Forbidden("this token may not act on behalf of another principal")
    return credential.principal
