"""``engram.memory.purge``, ``engram.memory.delete`` and ``engram.memory.prune`` (SPEC 7.1, 7.2).

Each runs :func:`shared.storage.erasure.erase` in one transaction (rows, lineage, recall history,
tombstone, ``memory.purged``, audit), then — after the commit, so nothing is dropped for an
erasure that rolled back — deletes the vectors and cached results it can reach in-process.
The embed service also deletes vectors on ``memory.purged``, which covers deployments where the
vector store is not reachable from here; the receipt says which happened. A purge's or delete's
tombstone also goes to the purge ledger before the commit, so a restore of an older backup erases
it again (``shared.storage.purge_ledger``).
"""

from __future__ import annotations

import logging
from uuid import UUID, uuid4

from contracts.governance import DeleteRequest, PruneReply, PruneRequest, PurgeReceipt, PurgeRequest
from services.governance_audit.views import load_entry
from shared.ports import VectorIndex
from shared.security.access import Caller, target_key
from shared.storage.cache import ResultCache
from shared.storage.db.engine import Database
from shared.storage.entries import EntryStore, in_scope, with_ids
from shared.storage.erasure import Erased, Tombstone, erase, prune_over_cap
from shared.storage.purge_ledger import PurgeLedger

__all__ = ["Erasures"]

log = logging.getLogger(__name__)


class Erasures:
    def __init__(
        self,
        db: Database,
        *,
        index: VectorIndex | None = None,
        results: ResultCache | None = None,
        ledger: PurgeLedger | None = None,
    ) -> None:
        self._db = db
        self._index = index
        self._results = results
        self._ledger = ledger

    async def _keep(self, erased: Erased, recall_history_of: str | None) -> None:
        """Append the erasure's tombstones to the ledger, inside its transaction (before commit)."""
        if self._ledger is not None:
            await self._ledger.record(erased.tombstones, recall_history_of=recall_history_of)

    async def purge(self, caller: Caller, request: PurgeRequest) -> PurgeReceipt:
        key = target_key(request.actor_ref)
        caller.require("purge", key)
        if caller.session_only is not None:
            caller.credential.require_session(request.session_id)
        agent_config_id = request.agent_config_id
        async with self._db.transaction() as session:
            erased = await erase(
                session,
                org_id=caller.org_id,
                where=in_scope(caller.org_id, agent_config_id, (key,), session_id=request.session_id),
                reason="purge",
                requested_by=caller.ref,
                actor_ref=request.actor_ref,
                session_id=request.session_id,
                tombstones=[
                    Tombstone(owner_key=key, agent_config_id=agent_config_id, session_id=request.session_id)
                ],
                recall_history_of=request.actor_ref,
                agent_config_id=agent_config_id,
                audit_details=caller.via,
            )
            await self._keep(erased, request.actor_ref)
        return await self._receipt(caller.org_id, erased, request.actor_ref, request.session_id)

    async def delete(self, caller: Caller, request: DeleteRequest) -> PurgeReceipt:
        async with self._db.transaction() as session:
            row = await load_entry(
                EntryStore(session), caller, request.entry_id, request.agent_config_id, for_update=True
            )
            caller.require("write", row.owner_key)
            erased = await erase(
                session,
                org_id=caller.org_id,
                where=with_ids([request.entry_id]),
                reason="delete",
                requested_by=caller.ref,
                # The same text, derived again from input older than this delete, stays deleted.
                tombstones=[
                    Tombstone(
                        owner_key=row.owner_key,
                        agent_config_id=request.agent_config_id,
                        fingerprints=(row.fingerprint,),
                    )
                ],
                audit_kind="memory.deleted",
                agent_config_id=request.agent_config_id,
                audit_details=caller.via,
            )
            await self._keep(erased, None)
        return await self._receipt(caller.org_id, erased, None, None)

    async def prune(self, caller: Caller, request: PruneRequest) -> PruneReply:
        async with self._db.transaction() as session:
            erased, remaining = await prune_over_cap(
                session,
                org_id=caller.org_id,
                agent_config_id=request.agent_config_id,
                max_entries=request.max_entries,
                requested_by=caller.ref,
                audit_details=caller.via,
            )
        await self.after_commit(caller.org_id, erased)
        return PruneReply(deleted=len(erased.ids), remaining=remaining)

    async def after_commit(self, org_id: UUID, erased: Erased) -> tuple[int, bool, int]:
        vectors, deferred = 0, self._index is None
        if erased.ids and self._index is not None:
            try:
                await self._index.delete(erased.ids)
                vectors = len(erased.ids)
            except Exception:  # the embed service deletes them on memory.purged anyway
                log.warning("vector delete deferred to the embed service", exc_info=True)
                deferred = True
        cached = 0
        if self._results is not None and erased.agent_config_ids:
            cached = await self._results.invalidate(org_id, erased.agent_config_ids)
        return vectors, deferred, cached

    async def _receipt(
        self, org_id: UUID, erased: Erased, actor_ref: str | None, session_id: str | None
    ) -> PurgeReceipt:
        vectors, deferred, cached = await self.after_commit(org_id, erased)
        return PurgeReceipt(
            purge_id=uuid4(),
            actor_ref=actor_ref,
            session_id=session_id,
            agent_config_ids=erased.agent_config_ids,
            entries=len(erased.ids),
            observations=erased.observations,
            derived=erased.derived,
            recall_records=erased.recall_records,
            vectors=vectors,
            vectors_deferred=deferred,
            cache_entries=cached,
            entry_ids=erased.ids,
        )
