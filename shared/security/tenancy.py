"""Tenancy of memory entries (SPEC 3, never relaxable): how an owner is keyed, and which owner
keys a caller may see. Every service that writes or reads entries keys owners through here.

An owner key is how an entry's owner is stored: ``""`` for the shared pool, ``"<kind>:<id>"``
for an end user or actor. Ids are used exactly as given — no case folding, trimming or unicode
normalization — because any normalization that merged two spellings would merge two users.
"""

from __future__ import annotations

from typing import Literal

from contracts.common import Principal
from contracts.errors import InvalidRequest, SessionRequired

__all__ = ["SHARED_POOL", "ConfigScope", "owner_key", "visible_owner_keys"]

#: The owner key of the shared pool (entries with ``owner = null``).
SHARED_POOL = ""

ConfigScope = Literal["workload", "actor", "session"]


def owner_key(principal: Principal | None) -> str:
    """The owner key of entries that ``principal`` owns: ``""`` (the shared pool) for ``None`` or
    ``none``, else ``"<kind>:<id>"``. An owner without an id (a model built without validation)
    is refused rather than keyed ``"<kind>:None"``, which would pool everyone without one."""
    if principal is None or principal.kind == "none":
        return SHARED_POOL
    if not _resolved(principal):
        raise InvalidRequest(f"a {principal.kind} owner needs an id")
    return f"{principal.kind}:{principal.id}"


def _resolved(principal: Principal) -> bool:
    # Principal validates ids, but a model built without validation must still fail closed.
    return principal.kind == "none" or (principal.id is not None and principal.id.strip() != "")


def visible_owner_keys(
    caller: Principal | None, scope: ConfigScope, session_id: str | None
) -> tuple[str, ...]:
    """The owner keys ``caller`` may see under the config ``scope`` (SPEC 3).

    - ``none`` → the shared pool; ``end_user`` → only its own key, never the shared pool;
      ``actor`` → its own key plus the shared pool.
    - ``scope="actor"`` or ``"session"`` → only the caller's own key (the shared pool for ``none``).
      ``"session"`` also needs ``session_id`` (:class:`SessionRequired` otherwise, checked before
      anything else because it is a malformed request); the SQL layer then keeps only entries of
      exactly that session.
    - A caller whose identity cannot be resolved (``None``, or a missing/blank id) → ``()``:
      no memory, not an error, and never the shared pool.
    - ``service`` never reaches here (the service resolves whom it acts for):
      :class:`InvalidRequest`, a ``ValueError``.
    """
    if scope == "session" and (session_id is None or not session_id.strip()):
        raise SessionRequired("this agent config's memory is session-scoped: recall needs a session_id")
    if caller is None or not _resolved(caller):
        return ()
    if caller.kind == "service":
        raise InvalidRequest("a service principal must name the principal it acts for")
    own = owner_key(caller)
    if caller.kind == "actor" and scope == "workload":
        return (own, SHARED_POOL)
    return (own,)
