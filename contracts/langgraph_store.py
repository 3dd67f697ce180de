"""``EngramStore``: LangGraph's ``BaseStore`` over Engram (``pip install 'engram[langgraph]'``).

    engram = await EngramClient.connect(info.nats_url, token, **info.nats_options())
    store = EngramStore(engram, agent_config_id)
    graph = builder.compile(store=store)

How items map onto Engram (docs/decisions.md, "LangGraph store"):

- **Who**: the token. An end user's token stores into that user's memory. A service token acts for
  the owner a namespace names (``owner_segment``: ``("users", "alice", …)`` → ``end_user:alice``),
  or for ``principal``, or for the shared pool. Two organizations never meet: tenancy is the
  token's, as for every Engram request.
- **Where**: an item is one memory entry of type ``langgraph``. Its namespace, key and value live
  in the entry's metadata (``{"langgraph": {"namespace": [...], "path": "a.b", "prefixes": ["a",
  "a.b"], "key": ..., "value": {...}}}``); its text is ``"<ns>/<key>: <value as JSON>"`` so recall
  can search it. Namespaces are compared as tuples of whole segments — ``("users", "al")`` is never
  a prefix of ``("users", "alice")``: labels hold no period, so ``path`` and ``prefixes`` (the
  namespace's own prefixes, joined) name exactly the namespaces they are.
- **Reads are filtered by Engram**: a get asks ``memory.list`` for the entries whose metadata holds
  the key's ``path`` and ``key``, a search for its prefix (and string-valued ``filter`` keys), so
  their cost follows the namespace, not the store (Postgres's GIN index on metadata).
- **Put** saves the new entry and then deletes the key's older entries (no moment without the item);
  ``value=None`` deletes them. Every write passes Engram's write policy (PII handling applies to
  the value too; a value read as a prompt injection is quarantined: a get answers it withheld, a
  search leaves it out — Engram withholds a quarantined entry's metadata, so its key is not known).
- **Search** with a ``query`` ranks by Engram's hybrid recall (BM25 + vectors); ``filter``,
  ``offset`` and ``limit`` apply after the namespace prefix, as LangGraph's own stores do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from datetime import datetime
from itertools import takewhile
from typing import Any, Literal
from uuid import UUID

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

# LangGraph's own matching rules (segment-wise prefix/suffix with "*", JSONB-like filters), so
# EngramStore answers exactly as InMemoryStore does; langgraph is pinned to 1.2.x for these.
from langgraph.store.memory import _compare_values, _does_match

from contracts.client import EngramClient
from contracts.common import Principal
from contracts.errors import NotFound, WritePolicyDenied
from contracts.governance import EntryView
from contracts.requests import MAX_ENTRY_CHARS, SaveEntry, SaveOutcome

__all__ = ["MEMORY_TYPE", "EngramStore", "item_entry"]

#: The memory type of every entry the store writes; its listing reads only these.
MEMORY_TYPE = "langgraph"
_META = "langgraph"
#: What a quarantined item's value reads as (Engram never hands out quarantined memory as data).
WITHHELD: dict[str, Any] = {"engram_withheld": "quarantined as a possible prompt injection"}


class _Stored:
    """One item as Engram holds it: the entry id, and the item."""

    __slots__ = ("entry_id", "item")

    def __init__(self, entry_id: UUID, item: Item) -> None:
        self.entry_id = entry_id
        self.item = item


def _stored(
    entry: EntryView, namespace: tuple[str, ...] | None = None, key: str | None = None
) -> _Stored | None:
    """The item ``entry`` holds. A quarantined entry's value is withheld; if Engram withheld its
    metadata too (a caller without ``memory.admin``), it is the item at ``namespace``/``key`` when
    the read asked for exactly that, else nothing the store can place."""
    meta = entry.metadata.get(_META)
    if not isinstance(meta, dict):
        if entry.quarantined and namespace is not None and key is not None:
            at = entry.created_at
            return _Stored(
                entry.id, Item(value=WITHHELD, key=key, namespace=namespace, created_at=at, updated_at=at)
            )
        return None
    namespace_, key_, value = meta.get("namespace"), meta.get("key"), meta.get("value")
    if not isinstance(namespace_, list) or not isinstance(key_, str) or not isinstance(value, dict):
        return None
    created = meta.get("created_at")
    item = Item(
        value=WITHHELD if entry.quarantined else value,
        key=key_,
        namespace=tuple(str(s) for s in namespace_),
        created_at=datetime.fromisoformat(created) if isinstance(created, str) else entry.created_at,
        updated_at=entry.created_at,
    )
    return _Stored(entry.id, item)


def _path(namespace: tuple[str, ...]) -> str:
    """A namespace as one string: labels never hold a period (LangGraph checks every op)."""
    return ".".join(namespace)


def item_entry(
    namespace: tuple[str, ...],
    key: str,
    value: dict[str, Any],
    *,
    importance: float = 0.5,
    created: datetime | None = None,
) -> SaveEntry:
    """The entry an item is stored as (what ``put`` saves; bulk loaders may save these directly)."""
    meta: dict[str, Any] = {
        "namespace": list(namespace),
        # What reads filter on (exact namespace; whole-segment prefixes), as JSON containment.
        "path": _path(namespace),
        "prefixes": [_path(namespace[:i]) for i in range(1, len(namespace) + 1)],
        "key": key,
        "value": value,
    }
    if created is not None:
        meta["created_at"] = created.isoformat()
    return SaveEntry(
        text=_text(namespace, key, value),
        importance=importance,
        memory_type=MEMORY_TYPE,
        metadata={_META: meta},
    )


def _text(namespace: tuple[str, ...], key: str, value: dict[str, Any]) -> str:
    text = f"{'/'.join(namespace)}/{key}: {json.dumps(value, sort_keys=True, ensure_ascii=False)}"
    return text[:MAX_ENTRY_CHARS]


def _current(stored: list[_Stored]) -> dict[tuple[tuple[str, ...], str], list[_Stored]]:
    """``(namespace, key) → its entries, newest first`` (concurrent puts may leave two a moment)."""
    by_key: dict[tuple[tuple[str, ...], str], list[_Stored]] = {}
    for s in sorted(stored, key=lambda s: (s.item.updated_at, str(s.entry_id)), reverse=True):
        by_key.setdefault((s.item.namespace, s.item.key), []).append(s)
    return by_key


class EngramStore(BaseStore):
    """LangGraph's ``BaseStore`` over Engram's memory of one owner in one agent config."""

    supports_ttl = False

    def __init__(
        self,
        client: EngramClient,
        agent_config_id: UUID,
        *,
        principal: Principal | None = None,
        owner_segment: int | None = None,
        owner_kind: Literal["end_user", "actor"] = "end_user",
        importance: float = 0.5,
    ) -> None:
        """Whom each item belongs to, for a service token: ``owner_segment=i`` makes label ``i``
        of every namespace the owner's id (``("users", "alice", …)`` with ``owner_segment=1`` is
        ``end_user:alice``'s memory), else ``principal`` (or the shared pool without one). Other
        tokens always act for themselves, whatever these say.

        Build it inside the event loop the client is connected on: synchronous ``batch`` hands
        its work to that loop."""
        if owner_segment is not None and (principal is not None or owner_segment < 0):
            raise ValueError("give principal or a non-negative owner_segment, not both")
        self._client = client
        self._agent = agent_config_id
        self._principal = principal.model_dump() if principal is not None else None
        self._owner_segment = owner_segment
        self._owner_kind = owner_kind
        self._importance = importance
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # -- BaseStore ---------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """For synchronous nodes, which LangGraph runs in worker threads: the work runs on the
        client's event loop. Called on that loop's own thread it would deadlock, so it refuses."""
        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("EngramStore.batch needs the client's event loop running; use abatch")
        if _running_here(loop):
            raise RuntimeError("EngramStore.batch called on the event loop's thread; use abatch")
        return asyncio.run_coroutine_threadsafe(self.abatch(ops), loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Each op in order, each reading only what it needs (so a write is seen by the next op)."""
        self._loop = self._loop or asyncio.get_running_loop()
        results: list[Result] = []
        for op in ops:
            validate_op_namespace(op)
            owner = self._owner_of_op(op)
            if isinstance(op, GetOp):
                versions = await self._versions(owner, tuple(op.namespace), op.key)
                results.append(versions[0].item if versions else None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op, owner))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._namespaces(op, owner))
            elif isinstance(op, PutOp):
                await self._put(op, owner)
                results.append(None)
            else:
                raise TypeError(f"unknown store operation {type(op).__name__}")
        return results

    # -- whose memory ------------------------------------------------------------------------
    def _owner_of_op(self, op: Op) -> dict[str, Any] | None:
        """The principal an op acts for (None: whoever the token is)."""
        if self._owner_segment is None:
            return self._principal
        if isinstance(op, GetOp | PutOp):
            path: tuple[str, ...] = tuple(op.namespace)
        elif isinstance(op, SearchOp):
            path = tuple(op.namespace_prefix)
        else:
            prefixes = [c.path for c in op.match_conditions or () if c.match_type == "prefix"]
            path = max(prefixes, key=len, default=())
        seg = self._owner_segment
        if len(path) <= seg or path[seg] == "*":
            raise InvalidNamespaceError(
                f"this store keeps each owner's memory apart by namespace label {seg}: "
                f"name the owner there (got {path!r})"
            )
        try:
            return Principal(kind=self._owner_kind, id=path[seg]).model_dump()
        except ValueError as exc:
            raise InvalidNamespaceError(f"{path[seg]!r} is not an owner id") from exc

    @staticmethod
    def _scoped(owner: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
        return {**fields, "principal": owner} if owner else fields

    # -- operations --------------------------------------------------------------------------
    async def _read(
        self,
        owner: dict[str, Any] | None,
        contains: dict[str, Any],
        namespace: tuple[str, ...] | None = None,
        key: str | None = None,
    ) -> list[_Stored]:
        """The owner's items whose stored metadata contains ``contains`` (Engram filters them)."""
        stored: list[_Stored] = []
        token: str | None = None
        while True:
            fields = self._scoped(
                owner,
                memory_types=[MEMORY_TYPE],
                lifecycle=["active"],
                metadata={_META: contains} if contains else None,
                page_size=100,
                page_token=token,
            )
            try:
                page = await self._client.list_entries(self._agent, **fields)
            except NotFound:
                # An agent config nothing was ever saved to (nor configured) holds no items.
                return stored
            stored += [s for e in page.entries if (s := _stored(e, namespace, key)) is not None]
            token = page.next_page_token
            if token is None:
                return stored

    async def _versions(
        self, owner: dict[str, Any] | None, namespace: tuple[str, ...], key: str
    ) -> list[_Stored]:
        """The entries holding ``namespace``/``key``, newest first."""
        found = await self._read(owner, {"path": _path(namespace), "key": key}, namespace, key)
        return _current(found).get((namespace, key), [])

    async def _put(self, op: PutOp, owner: dict[str, Any] | None) -> None:
        namespace = tuple(op.namespace)
        old = await self._versions(owner, namespace, op.key)
        keep: UUID | None = None
        if op.value is not None:
            value = dict(op.value)
            created = old[-1].item.created_at if old else None
            keep = await self._save(owner, namespace, op.key, value, created)
            folded = next((o for o in old if o.entry_id == keep), None)
            if folded is not None and folded.item.value != value:
                # Engram folded the new text into an entry holding another value (the texts are
                # equal once normalized): to store this value, erase the key and save again.
                await self._delete(owner, [o.entry_id for o in old])
                await self._save(owner, namespace, op.key, value, created)
                return
        await self._delete(owner, [o.entry_id for o in old if o.entry_id != keep])

    async def _save(
        self,
        owner: dict[str, Any] | None,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        created: datetime | None,
    ) -> UUID:
        entry = item_entry(namespace, key, value, importance=self._importance, created=created)
        outcome = await self._client.save(self._agent, [entry], principal=owner, wait=True)
        ids = outcome.ids if isinstance(outcome, SaveOutcome) else []
        if not ids:
            raise WritePolicyDenied(
                f"Engram's write policy did not store {key!r} in {namespace!r}",
                {"namespace": list(namespace), "key": key},
            )
        return UUID(str(ids[0]))

    async def _delete(self, owner: dict[str, Any] | None, entry_ids: list[UUID]) -> None:
        for entry_id in entry_ids:
            with contextlib.suppress(NotFound):  # a concurrent put or delete took it first
                await self._client.delete(self._agent, entry_id, **self._scoped(owner))

    async def _search(self, op: SearchOp, owner: dict[str, Any] | None) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        contains: dict[str, Any] = {"prefixes": [_path(prefix)]} if prefix else {}
        # String equality is the same in JSON containment and in LangGraph's filter; other values
        # (numbers vs booleans, operators, nested objects) are left to the exact check below.
        equal = {k: v for k, v in (op.filter or {}).items() if isinstance(v, str)}
        if equal:
            contains["value"] = equal
        current = [versions[0] for versions in _current(await self._read(owner, contains)).values()]
        matching = [
            s
            for s in sorted(current, key=lambda s: s.item.updated_at, reverse=True)
            if s.item.namespace[: len(prefix)] == prefix
            and all(_compare_values(s.item.value.get(k), v) for k, v in (op.filter or {}).items())
        ]
        scores: dict[UUID, float] = {}
        if op.query and matching:
            reply = await self._client.recall(
                self._agent,
                **self._scoped(
                    owner,
                    cue=op.query,
                    strategy="hybrid",
                    format="compact",
                    top_k=1000,
                    token_budget=1_000_000,
                    filters={"memory_types": [MEMORY_TYPE]},
                ),
            )
            for r in reply.results:
                scores.setdefault(r.id, r.score)
            # Ranked matches first, best first; the rest keep their order (newest first).
            matching.sort(key=lambda s: -scores.get(s.entry_id, float("-inf")))
        page = matching[op.offset : op.offset + op.limit]
        return [
            SearchItem(
                namespace=s.item.namespace,
                key=s.item.key,
                value=s.item.value,
                created_at=s.item.created_at,
                updated_at=s.item.updated_at,
                score=scores.get(s.entry_id),
            )
            for s in page
        ]

    async def _namespaces(self, op: ListNamespacesOp, owner: dict[str, Any] | None) -> list[tuple[str, ...]]:
        # The longest prefix condition's labels before any wildcard narrow the read.
        prefixes: list[tuple[str, ...]] = [
            tuple(c.path) for c in op.match_conditions or () if c.match_type == "prefix"
        ]
        longest = max(prefixes, key=len) if prefixes else ()
        fixed = tuple(takewhile(lambda label: label != "*", longest))
        found = {
            s.item.namespace for s in await self._read(owner, {"prefixes": [_path(fixed)]} if fixed else {})
        }
        if op.match_conditions:
            found = {ns for ns in found if all(_does_match(c, ns) for c in op.match_conditions)}
        if op.max_depth is not None:
            found = {ns[: op.max_depth] for ns in found}
        return sorted(found)[op.offset : op.offset + op.limit]


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
