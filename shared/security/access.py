"""Who may do what (SPEC 3, 7.3, 8), decided in one place for every request-reply operation.

:func:`authorize` runs on the edge (``shared.service.edge``) before any handler: it turns a verified
token and a parsed request into the :class:`Caller` the handler acts as.

1. The token holds the operation's permission (``contracts.operations``); ``memory.admin`` counts
   only on an operator's token, never an end user's, and not when acting for an end user.
2. The token's restrictions bound the request: an agent config or session the request names must
   be the token's (``FORBIDDEN`` otherwise); one it leaves out is the token's.
3. Whom the request acts for: a service token names the principal (``principal``; the shared
   pool when it names none); any other token acts only for itself (:func:`shared.security.auth.act_as`).
4. The agent config the request names belongs to the caller's organization, where the
   operation says so (``Operation.agent_config``): ``FORBIDDEN`` if it is another's, and for a
   ``known`` one ``NOT_FOUND`` if the organization never configured nor wrote to it (on a first
   page: a page token was issued for a known one, and refusing a bad one is the token's check). Handlers
   that read the memory config anyway (recall, feedback, config) make the same check there.

What depends on the data — whose entry it is — handlers ask the caller (:meth:`Caller.may`,
:meth:`Caller.require`, :meth:`Caller.require_sees`). Owners are compared by owner key
(``""`` = shared pool, :mod:`shared.security.tenancy`):

| action on an owner's memory | own (same owner key) | another owner                       |
|-----------------------------|----------------------|-------------------------------------|
| read (list, get, export)    | ``memory.read``      | + ``memory.admin`` (*)              |
| write (manage, delete)      | ``memory.write``     | + ``memory.admin``                  |
| purge                       | ``memory.purge``     | + ``memory.admin``                  |

(*) an actor reads the shared pool with ``memory.read`` alone, as recall shows it.

End users never act on another owner's memory, whatever their token says: ``memory.admin`` is
an operator's permission, and an end-user token carrying it is refused rather than trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar
from uuid import UUID

from pydantic import BaseModel

from contracts.common import Principal
from contracts.errors import Forbidden, InvalidRequest, NotFound
from contracts.operations import Operation
from shared.security.auth import ADMIN, DEPLOYMENT_PERMISSIONS, PURGE, READ, WRITE, Credential, act_as
from shared.security.tenancy import SHARED_POOL, owner_key

__all__ = ["Action", "AgentConfigs", "Caller", "authorize", "target_key"]

Action = Literal["read", "write", "purge"]
_PERMISSION = {"read": READ, "write": WRITE, "purge": PURGE}
M = TypeVar("M", bound=BaseModel)


class _Owned(Protocol):
    """An entry as far as visibility goes."""

    @property
    def owner_key(self) -> str: ...
    @property
    def session_id(self) -> str | None: ...


E = TypeVar("E", bound=_Owned)


class AgentConfigs(Protocol):
    """Which organization an agent config belongs to (``shared.storage.config_store.AgentConfigOwners``)."""

    async def check(self, org_id: UUID, agent_config_id: UUID, *, known: bool) -> None:
        """``FORBIDDEN`` when the agent config is another organization's; with ``known``,
        ``NOT_FOUND`` when ``org_id`` never configured nor wrote to it."""


def target_key(actor_ref: str) -> str:
    """The owner key an ``actor_ref`` names (``"none"`` → the shared pool)."""
    try:
        principal = Principal.parse_ref(actor_ref)
    except ValueError as exc:
        raise InvalidRequest("actor_ref must be 'end_user:<id>', 'actor:<id>' or 'none'") from exc
    if principal.kind == "service":
        raise InvalidRequest("a service owns no memory")
    return owner_key(principal)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the verified token (``credential``) and whom the request acts for
    (``principal``: the token's own principal, or the one a service token names)."""

    credential: Credential
    principal: Principal

    @property
    def ref(self) -> str:
        return self.principal.ref

    @property
    def own_key(self) -> str:
        return owner_key(self.principal)

    @property
    def org_id(self) -> UUID:
        return self.credential.org_id

    def may(self, action: Action, key: str) -> bool:
        """Whether this caller may do ``action`` on the memory of owner ``key`` (no raise)."""
        perms = self.credential.permissions
        if _PERMISSION[action] not in perms:
            return False
        if key == self.own_key:
            return True
        if action == "read" and self.principal.kind == "actor" and key == SHARED_POOL:
            return True
        return self.is_admin

    @property
    def via(self) -> dict[str, str]:
        """For audit details: the token's own principal when it acts for someone else, so a
        record says both for whom and by whom (a service acting for ``end_user:alice``)."""
        token = self.credential.principal
        return {"via": token.ref} if token != self.principal else {}

    @property
    def is_admin(self) -> bool:
        """``memory.admin``, on a token that acts for anyone but an end user (see module doc)."""
        return self.credential.is_operator and self.principal.kind != "end_user"

    def require_admin(self) -> None:
        self.credential.require_operator()
        if self.principal.kind == "end_user":
            raise Forbidden("memory.admin is an operator permission; not when acting for an end user")

    def require_unrestricted(self, what: str) -> None:
        """For operations about the whole organization or deployment (dead letters, lag, the
        audit chain): a token restricted to an agent config or session would learn about the rest."""
        if self.credential.agent_config_id is not None or self.credential.session_id is not None:
            raise Forbidden(f"{what} needs a token not restricted to an agent config or session")

    def require_sees(self, row: E | None) -> E:
        """``row`` (an entry with ``owner_key`` and ``session_id``, or None) if this caller may
        read it; else ``NOT_FOUND``, exactly as for a missing entry — ids of other people's memory
        are never confirmed."""
        if (
            row is None
            or not self.may("read", row.owner_key)
            or (self.session_only is not None and row.session_id != self.session_only)
        ):
            raise NotFound("no such entry")
        return row

    def require(self, action: Action, key: str) -> None:
        self.credential.require(_PERMISSION[action])
        if not self.may(action, key):
            raise Forbidden(
                "this caller may not act on another owner's memory", {"needs": ADMIN, "action": action}
            )

    def agent_config(self, requested: UUID | None) -> UUID | None:
        """The agent config a request may touch: the requested one (if the token allows it), the
        token's own restriction when none is requested, else None (all of the organization's)."""
        if requested is not None:
            self.credential.require_agent_config(requested)
            return requested
        return self.credential.agent_config_id

    @property
    def session_only(self) -> str | None:
        """A session-restricted token sees and changes only that session's entries."""
        return self.credential.session_id


async def authorize(
    credential: Credential, op: Operation[Any, Any], request: M, agent_configs: AgentConfigs | None = None
) -> tuple[Caller, M]:
    """The caller ``request`` to ``op`` acts as, and the request within the token's restrictions
    (what it left out filled in from them); ``FORBIDDEN`` when the token does not allow it. See
    the module docstring for the rules; ``agent_configs`` answers rule 4 (an edge serving an
    operation that needs it has one: ``shared.service.edge.Edge.serve``)."""
    permission = op.permission
    credential.require(permission)
    fill: dict[str, Any] = {}
    fields = type(request).model_fields
    # The token's restrictions: a request that names another is refused, one that names none
    # is given the token's.
    restrictions = (
        ("agent_config_id", credential.agent_config_id, credential.require_agent_config),
        ("session_id", credential.session_id, credential.require_session),
    )
    for field, restricted_to, require in restrictions:
        if field not in fields:
            continue
        named = getattr(request, field, None)
        if named is not None:
            require(named)
        elif restricted_to is not None:
            fill[field] = restricted_to
    caller = Caller(credential, act_as(credential, getattr(request, "principal", None)))
    if permission == ADMIN:
        caller.require_admin()
    elif permission in DEPLOYMENT_PERMISSIONS:
        credential.require_deployment_operator(permission)
    # Rare (a restricted token leaving its restriction out): the common path copies nothing.
    if fill:
        request = request.model_copy(update=fill)
    if op.agent_config is not None:
        agent_config_id = getattr(request, "agent_config_id", None)
        if agent_config_id is not None:  # None: every agent config of the organization (export, purge)
            if agent_configs is None:
                raise RuntimeError(f"{op.name}: nothing to check the agent config's organization with")
            # A later page's token was issued for a known one: what it says is its own to refuse.
            first_page = getattr(request, "page_token", None) is None
            known = op.agent_config == "known" and first_page
            await agent_configs.check(credential.org_id, agent_config_id, known=known)
    return caller, request
