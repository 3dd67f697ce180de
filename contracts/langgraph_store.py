"""``EngramStore``: LangGraph's ``BaseStore`` over Engram (``pip install 'engram[langgraph]'``).

    engram = await EngramClient.connect(info.nats_url, token, **info.nats_options())
    store = EngramStore(engram, agent_config_id)
    graph = builder.compile(store=store)

How items map onto Engram (docs/adr/0068-langgraph-store.md):

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
  ``offset`` and ``limit`` apply after the namespace prefix, as LangGraph's own stores do. A filter
  value no stored value can equal (text holding U+0000 or a lone surrogate, which Engram never
  stores) matches nothing, and is never sent.
- **TTL** (``ttl`` minutes on put, ``refresh_ttl`` on get and search, ``TTLConfig`` defaults) is
  the entry's own expiry (``expires_at``, set and renewed with ``manage change_retention``, by
  Engram's clock); an expired item is never returned, even before Engram's retention sweeper
  erases it (docs/adr/0069-langgraph-store-ttl.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
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
    TTLConfig,
    validate_op_namespace,
)

# LangGraph's own matching rules (segment-wise prefix/suffix with "*", JSONB-like filters), so
# EngramStore answers exactly as InMemoryStore does; langgraph is pinned to 1.2.x for these.
from langgraph.store.memory import _compare_values, _does_match

from contracts.client import EngramClient
from contracts.common import Principal
from contracts.errors import InvalidRequest, NotFound, WritePolicyDenied
from contracts.governance import EntryView
from contracts.json_rules import check_storable
from contracts.requests import MAX_ENTRY_CHARS, SaveEntry, SaveOutcome

__all__ = ["MAX_TTL_MINUTES", "MEMORY_TYPE", "EngramStore", "item_entry"]

#: The memory type of every entry the store writes; its listing reads only these.
MEMORY_TYPE = "langgraph"
_META = "langgraph"
#: The longest TTL a put may give, in minutes (a thousand years: any expiry Engram can date).
MAX_TTL_MINUTES = 1000 * 365 * 24 * 60
#: What a quarantined item's value reads as (Engram never hands out quarantined memory as data).
WITHHELD: dict[str, Any] = {"engram_withheld": "quarantined as a possible prompt injection"}


class _Stored:
    """One item as Engram holds it: the entry id, the item, its TTL in minutes (None: none) and
    when Engram expires it."""

    __slots__ = ("entry_id", "expires_at", "item", "ttl")

    def __init__(
        self, entry_id: UUID, item: Item, ttl: float | None = None, expires_at: datetime | None = None
    ) -> None:
        self.entry_id = entry_id
        self.item = item
        self.ttl = ttl
        self.expires_at = expires_at

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


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
            item = Item(value=WITHHELD, key=key, namespace=namespace, created_at=at, updated_at=at)
            return _Stored(entry.id, item, expires_at=entry.expires_at)
        return None
    namespace_, key_, value = meta.get("namespace"), meta.get("key"), meta.get("value")
    if not isinstance(namespace_, list) or not isinstance(key_, str) or not isinstance(value, dict):
        return None
    created, ttl = meta.get("created_at"), meta.get("ttl")
    item = Item(
        value=WITHHELD if entry.quarantined else value,
        key=key_,
        namespace=tuple(str(s) for s in namespace_),
        created_at=datetime.fromisoformat(created) if isinstance(created, str) else entry.created_at,
        updated_at=entry.created_at,
    )
    return _Stored(entry.id, item, float(ttl) if isinstance(ttl, int | float) else None, entry.expires_at)


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
    ttl: float | None = None,
) -> SaveEntry:
    """The entry an item is stored as (what ``put`` saves; bulk loaders may save these directly).
    ``ttl`` is recorded for reads that renew it; the entry's expiry itself is Engram's to set."""
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
    if ttl is not None:
        meta["ttl"] = ttl
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


def _items(stored: list[_Stored]) -> list[_Stored]:
    """The items ``stored`` holds: each key's newest entry, unless that one has expired (an older
    entry is a value the key no longer has, so it never stands in)."""
    now = datetime.now(UTC)
    return [versions[0] for versions in _current(stored).values() if not versions[0].expired(now)]


def _storable(value: Any) -> bool:
    """Whether Engram could store ``value``; a read asking for what it could not store finds
    nothing, so it is not sent (Engram refuses such text in any request)."""
    try:
        check_storable(value)
    except InvalidRequest:
        return False
    return True


def _check(op: Op) -> None:
    """What every op of a batch must pass before any of them runs."""
    validate_op_namespace(op)
    if isinstance(op, PutOp) and op.ttl is not None and not (0 < op.ttl <= MAX_TTL_MINUTES):
        raise ValueError(f"ttl is in minutes, above 0 and at most {MAX_TTL_MINUTES} (got {op.ttl!r})")


def _ttl_seconds(ttl: float) -> int:
    """A TTL in minutes as Engram's lifetime in whole seconds (at least one)."""
    return max(1, math.ceil(ttl * 60))


class EngramStore(BaseStore):
    """LangGraph's ``BaseStore`` over Engram's memory of one owner in one agent config."""

    supports_ttl = True

    def __init__(
        self,
        client: EngramClient,
        agent_config_id: UUID,
        *,
        principal: Principal | None = None,
        owner_segment: int | None = None,
        owner_kind: Literal["end_user", "actor"] = "end_user",
        importance: float = 0.5,
        ttl: TTLConfig | None = None,
    ) -> None:
        """Whom each item belongs to, for a service token: ``owner_segment=i`` makes label ``i``
        of every namespace the owner's id (``("users", "alice", …)`` with ``owner_segment=1`` is
        ``end_user:alice``'s memory), else ``principal`` (or the shared pool without one). Other
        tokens always act for themselves, whatever these say.

        ``ttl``: LangGraph's TTL defaults (``default_ttl`` minutes for puts that give none,
        ``refresh_on_read``); Engram's retention sweeper does the sweeping, so
        ``sweep_interval_minutes`` is not used.

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
        self.ttl_config = ttl
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # -- BaseStore ---------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """For synchronous nodes, which LangGraph runs in worker threads: the work runs on the
        client's event loop. Called on that loop's own thread it would deadlock, so it raises
        ``asyncio.InvalidStateError``, as LangGraph's own async stores do."""
        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("EngramStore.batch needs the client's event loop running; use abatch")
        if _running_here(loop):
            raise asyncio.InvalidStateError(
                "EngramStore's synchronous API was called on its event loop's thread, which it "
                "would block for good; await the asynchronous one there (aget, aput, asearch, abatch)"
            )
        return asyncio.run_coroutine_threadsafe(self.abatch(ops), loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Each op in order, each reading only what it needs (so a write is seen by the next op);
        none runs unless every one is valid."""
        self._loop = self._loop or asyncio.get_running_loop()
        ops = list(ops)
        for op in ops:
            _check(op)
        owners = [self._owner_of_op(op) for op in ops]
        results: list[Result] = []
        for op, owner in zip(ops, owners, strict=True):
            if isinstance(op, GetOp):
                results.append(await self._get(op, owner))
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

    async def start_ttl_sweeper(self, sweep_interval_minutes: int | None = None) -> None:
        """Does nothing: Engram's governance service erases expired entries itself (its retention
        sweeper), and reads never return an expired item meanwhile. For code written against
        LangGraph's async stores, which start a sweeper of their own."""

    # The signature of LangGraph's async stores' method, timeout included.
    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Does nothing (see ``start_ttl_sweeper``); True, as there is nothing left to stop."""
        return True

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
        """The owner's entries whose stored metadata contains ``contains`` (Engram filters them),
        every version, expired ones too."""
        stored: list[_Stored] = []
        metadata = {_META: contains} if contains else None
        if metadata is not None and not _storable(metadata):
            return stored
        token: str | None = None
        while True:
            fields = self._scoped(
                owner,
                memory_types=[MEMORY_TYPE],
                lifecycle=["active"],
                metadata=metadata,
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
        """The entries holding ``namespace``/``key``, newest first, expired ones too."""
        found = await self._read(owner, {"path": _path(namespace), "key": key}, namespace, key)
        return _current(found).get((namespace, key), [])

    async def _get(self, op: GetOp, owner: dict[str, Any] | None) -> Item | None:
        namespace = tuple(op.namespace)
        found = _items(await self._versions(owner, namespace, op.key))
        if not found:
            return None
        if op.refresh_ttl:
            await self._refresh(owner, found)
        return found[0].item

    async def _put(self, op: PutOp, owner: dict[str, Any] | None) -> None:
        namespace = tuple(op.namespace)
        old = await self._versions(owner, namespace, op.key)
        if op.value is None:
            await self._delete(owner, [o.entry_id for o in old])
            return
        value, ttl = dict(op.value), op.ttl
        live = _items(old)
        created = live[0].item.created_at if live else None
        keep = await self._save(owner, namespace, op.key, value, created, ttl)
        folded = next((o for o in old if o.entry_id == keep), None)
        if folded is not None and (folded not in live or (folded.item.value, folded.ttl) != (value, ttl)):
            # Engram folded the new text into an entry that is not this item (another value equal
            # once normalized, another TTL, or expired): erase the key and save it anew.
            await self._delete(owner, [o.entry_id for o in old])
            old = []
            keep = await self._save(owner, namespace, op.key, value, created, ttl)
        if ttl is not None:
            try:
                await self._expire(owner, keep, ttl)
            except Exception:
                # The put fails as a whole: a new entry without its expiry would outlive the TTL
                # (the key's older entries are still there, so the item keeps its last value).
                if keep not in {o.entry_id for o in old}:
                    with contextlib.suppress(Exception):
                        await self._delete(owner, [keep])
                raise
        await self._delete(owner, [o.entry_id for o in old if o.entry_id != keep])

    async def _expire(self, owner: dict[str, Any] | None, entry_id: UUID, ttl: float) -> None:
        """The entry expires ``ttl`` minutes from now, by Engram's clock."""
        with contextlib.suppress(NotFound):  # a concurrent put or delete took it: nothing to renew
            await self._client.manage(
                self._agent,
                entry_id,
                "change_retention",
                **self._scoped(owner, ttl_seconds=_ttl_seconds(ttl)),
            )

    async def _refresh(self, owner: dict[str, Any] | None, read: list[_Stored]) -> None:
        """Renew the TTL of the items a get or search returns (LangGraph's ``refresh_ttl``)."""
        await asyncio.gather(*(self._expire(owner, s.entry_id, s.ttl) for s in read if s.ttl is not None))

    async def _save(
        self,
        owner: dict[str, Any] | None,
        namespace: tuple[str, ...],
        key: str,
        value: dict[str, Any],
        created: datetime | None,
        ttl: float | None,
    ) -> UUID:
        entry = item_entry(namespace, key, value, importance=self._importance, created=created, ttl=ttl)
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
        current = _items(await self._read(owner, contains))
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
                    # Every matching item is ranked, near-duplicate values too: a store, not a context.
                    collapse_similar=False,
                ),
            )
            for r in reply.results:
                scores.setdefault(r.id, r.score)
            # Ranked matches first, best first; the rest keep their order (newest first).
            matching.sort(key=lambda s: -scores.get(s.entry_id, float("-inf")))
        page = matching[op.offset : op.offset + op.limit]
        if op.refresh_ttl:
            await self._refresh(owner, page)
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
        read = await self._read(owner, {"prefixes": [_path(fixed)]} if fixed else {})
        found = {s.item.namespace for s in _items(read)}
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
