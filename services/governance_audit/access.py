"""Who may inspect, change or erase whose memory (SPEC 3 and 7.3), decided in one place.

The caller is whom the token acts for (:func:`shared.auth.act_as`: a service token names the
principal, any other token is itself). Owners are compared by owner key (``""`` = shared pool).

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
from typing import Any, Literal
from uuid import UUID

from contracts.common import Principal
from contracts.errors import Forbidden, InvalidRequest, NotFound
from shared.auth import ADMIN, PURGE, READ, WRITE, Credential, act_as
from shared.tenancy import SHARED_POOL, owner_key

__all__ = ["Action", "Caller", "resolve_caller", "target_key"]

Action = Literal["read", "write", "purge"]
_PERMISSION = {"read": READ, "write": WRITE, "purge": PURGE}


def target_key(actor_ref: str) -> str:
    """The owner key an ``actor_ref`` names (``"none"`` → the shared pool)."""
    try:
        principal = Principal.parse_ref(actor_ref)
    except ValueError as exc:
        raise InvalidRequest("actor_ref must be 'end_user:<id>', 'actor:<id>' or 'none'") from exc
    if principal.kind == "service":
        raise InvalidRequest("a service owns no memory")
    return owner_key(principal)


@dataclass(frozen=True)
class Caller:
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

    def require_sees(self, row: Any) -> Any:
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


def resolve_caller(credential: Credential, requested: Principal | None) -> Caller:
    return Caller(credential, act_as(credential, requested))
