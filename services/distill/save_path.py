"""The one save path (SPEC 4.3): every writer — distill, elective saves, observations — ends here.

Per entry: importance floor → type policy → write policy (PII, size, injection flag) →
normalize + fingerprint → erasure tombstones → the owner-scoped upsert and its ``memory.written``
events (:class:`shared.storage.entries.EntryStore`, the table's gateway). Then the ``max_entries``
prune, then the audit records of the outcome. The caller owns the transaction, so rows, outbox,
inbox and audit commit together.
A batch of writers goes through in one pass (:func:`save_batch`); one writer is a batch of one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy.ext.asyncio import AsyncSession

from contracts.common import Principal
from contracts.config import MemoryConfig
from shared.ports import SupersessionJudge
from shared.runtime.cooperative import TimeSlice
from shared.runtime.time import utcnow
from shared.security.tenancy import owner_key
from shared.storage import audit
from shared.storage.entries import DedupeKey, EntryStore, NewEntry, dedupe_key
from shared.storage.entries.supersession import Neighbour, NewText, neighbours, supersede
from shared.storage.erasure import erased_before, prune_over_cap
from shared.text.policy import (
    PolicyDecision,
    apply_metadata_policy,
    apply_write_policy,
    check_carried_fields,
    fingerprint,
)
from shared.text.supersession import could_update, eligible, judge_pair, maybe_related

__all__ = [
    "MIN_IMPORTANCE",
    "Draft",
    "SaveContext",
    "SaveItem",
    "SaveResult",
    "save_batch",
    "save_entries",
]

#: Entries below this importance are not worth remembering (SPEC 4.3: 0.09 skipped, 0.1 kept).
MIN_IMPORTANCE = 0.1


@dataclass(frozen=True)
class Draft:
    """An entry some writer wants stored; the save path decides what actually happens."""

    text: str
    importance: float
    memory_type: str
    layer: str = "memory"
    metadata: dict[str, Any] = field(default_factory=dict)
    confidence: float = 1.0
    #: when what it records happened, as the writer said (None: not said).
    occurred_at: datetime | None = None


@dataclass(frozen=True)
class SaveContext:
    org_id: UUID
    agent_config_id: UUID
    owner: Principal | None
    session_id: str | None
    source: str
    #: who caused the write, for the audit record (``actor_ref`` of the verified caller).
    requested_by: str
    source_agent: str | None = None
    #: where the text came from (event or request id), kept with quarantined entries for review.
    provenance: dict[str, Any] = field(default_factory=dict)
    #: the writer's trace context for the events it causes (None: the current span's).
    trace_headers: dict[str, str] | None = None
    #: when the input was produced (a session's end, a save's acceptance): an erasure at or
    #: after this time covers it, so a replay or a late delivery cannot re-create erased memory.
    observed_at: datetime | None = None


@dataclass
class SaveResult:
    saved: int = 0
    skipped: int = 0
    reinforced: int = 0
    ids: list[UUID] = field(default_factory=list)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    redactions: Counter[str] = field(default_factory=Counter)
    quarantined: list[UUID] = field(default_factory=list)
    #: Entries (occurrences) whose text had something redacted.
    redacted: int = 0
    pruned: list[UUID] = field(default_factory=list)
    #: Knowledge updates: (old, new, reason, by) for each older entry a saved one superseded.
    superseded: list[tuple[UUID, UUID, str, str]] = field(default_factory=list)


def _expires_at(config: MemoryConfig, draft: Draft, now: datetime) -> datetime | None:
    if draft.layer == "observation":
        return now + timedelta(days=config.observation_ttl_days)
    candidates = []
    if config.retention.ttl_seconds is not None:
        candidates.append(now + timedelta(seconds=config.retention.ttl_seconds))
    ttl_days = config.type_policy(draft.memory_type).ttl_days
    if ttl_days is not None:
        candidates.append(now + timedelta(days=ttl_days))
    return min(candidates) if candidates else None


@dataclass(frozen=True)
class SaveItem:
    """One writer's request to the save path: its drafts, context, config, and audit records of
    its own to commit with the outcome (e.g. ``distill.completed``)."""

    ctx: SaveContext
    drafts: list[Draft]
    config: MemoryConfig
    also_audit: Sequence[audit.AuditEntry] = ()


@dataclass(frozen=True)
class _Occurrence:
    """A draft the save path stores: which item it came from, and the policy's decision."""

    item: int
    decision: PolicyDecision


async def save_entries(
    session: AsyncSession,
    ctx: SaveContext,
    drafts: list[Draft],
    config: MemoryConfig,
    *,
    also_audit: Sequence[audit.AuditEntry] = (),
    judge: SupersessionJudge | None = None,
) -> SaveResult:
    """Run one writer's drafts through the save path inside the caller's transaction."""
    (result,) = await save_batch(session, [SaveItem(ctx, drafts, config, also_audit)], judge=judge)
    return result


async def save_batch(
    session: AsyncSession, items: Sequence[SaveItem], *, judge: SupersessionJudge | None = None
) -> list[SaveResult]:
    """Run many writers' drafts through the save path in the caller's transaction, with one
    upsert, one outbox insert and one audit append per organization for the whole batch.

    The outcome is exactly what saving the items one after another would give: the first
    occurrence of a text (per agent config and owner) is saved or reinforces the stored row, and
    each further occurrence reinforces it. Each stored or reinforced occurrence gets its own
    ``memory.written`` event. The chain locks come last, just before the caller commits.
    """
    now = utcnow()
    results = [SaveResult() for _ in items]
    new: list[NewEntry] = []
    occurrences: list[_Occurrence] = []
    tombstones = await _tombstones(session, items)
    # A batch of sessions is hundreds of drafts: let recall answer in between (shared/runtime/cooperative.py).
    slicer = TimeSlice()
    for index, item in enumerate(items):
        for draft in item.drafts:
            await slicer.turn()
            admitted = _admit(draft, item.config, results[index])
            if admitted is None:
                continue
            decision, draft = admitted
            row = _row_params(item, draft, decision, now)
            if tombstones and _erased(tombstones, item.ctx, dedupe_key(row)):
                results[index].skipped += 1
                results[index].skip_reasons["erased"] += 1
                continue
            new.append(NewEntry(row, item.ctx.trace_headers))
            occurrences.append(_Occurrence(index, decision))

    stored = await EntryStore(session).upsert(new)
    updates: list[tuple[int, NewText]] = []
    for occ, upserted, entry in zip(occurrences, stored, new, strict=True):
        result = results[occ.item]
        result.saved += upserted.saved
        result.reinforced += not upserted.saved
        result.ids.append(upserted.entry_id)
        result.redactions.update(occ.decision.redactions)
        result.redacted += bool(occ.decision.redactions)
        if occ.decision.quarantined:
            result.quarantined.append(upserted.entry_id)
        stored_row: Mapping[str, Any] = entry.row
        if (
            upserted.saved
            and items[occ.item].config.knowledge_updates
            and eligible(stored_row["memory_type"], stored_row["layer"], stored_row["quarantined"])
            and could_update(stored_row["text"], with_model=judge is not None)
        ):
            key = (
                upserted.entry_id,
                stored_row["org_id"],
                stored_row["agent_config_id"],
                stored_row["owner_key"],
            )
            updates.append((occ.item, NewText(*key, stored_row["text"], stored_row["created_at"])))
    await _supersede(session, updates, results, judge)

    # Prune each agent config that grew, once, with the cap its config sets.
    by_org_prunes: dict[UUID, list[audit.AuditEntry]] = {}
    grown = {(i.ctx.org_id, i.ctx.agent_config_id): i for i, r in zip(items, results, strict=True) if r.saved}
    for (org_id, agent_config_id), item in sorted(
        grown.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))
    ):
        erased, _ = await prune_over_cap(
            session,
            org_id=org_id,
            agent_config_id=agent_config_id,
            max_entries=item.config.retention.max_entries,
            requested_by="engram:max_entries",
            append_audit=False,  # with the batch's own records below: the chain lock comes last
        )
        pruned = erased.ids
        by_org_prunes.setdefault(org_id, []).extend(erased.audit)
        # The prune belongs to whichever item of that agent config saved; report it on the first.
        for i, r in zip(items, results, strict=True):
            if (i.ctx.org_id, i.ctx.agent_config_id) == (org_id, agent_config_id) and r.saved:
                r.pruned = pruned
                break

    by_org: dict[UUID, list[audit.AuditEntry]] = {}
    for item, result in zip(items, results, strict=True):
        own = _audit_entries(item.ctx, result) if item.drafts else []
        by_org.setdefault(item.ctx.org_id, []).extend([*own, *item.also_audit])
    for org_id, records in by_org_prunes.items():
        by_org.setdefault(org_id, []).extend(records)
    # Chain locks in a fixed order, so two batches spanning the same organizations never deadlock.
    for org_id in sorted(by_org, key=str):
        await audit.append(session, org_id, by_org[org_id])
    return results


#: Earlier entries of the same owner in one batch that a new entry is compared with.
_BATCH_MATES = 16


async def _supersede(
    session: AsyncSession,
    updates: list[tuple[int, NewText]],
    results: list[SaveResult],
    judge: SupersessionJudge | None,
) -> None:
    """Knowledge updates (docs/adr/0103-knowledge-updates.md): each saved entry against its
    owner's older current entries that share a word with it — the offline rules first; a pair they
    leave undecided but that looks related goes to the model judge, when one is configured."""
    if not updates:
        return
    found = await neighbours(session, [n for _, n in updates])
    # A batch holds many writers' saves (one transaction): an earlier entry of the same owner in the
    # batch is a candidate too, nearest first, as if it had been saved a moment before.
    earlier: dict[tuple[UUID, UUID, str], list[NewText]] = {}
    for index, new in updates:
        key = (new.org_id, new.agent_config_id, new.owner_key)
        mates = earlier.setdefault(key, [])
        in_batch = [Neighbour(m.id, m.text, m.created_at) for m in reversed(mates[-_BATCH_MATES:])]
        mates.append(new)
        for old in [*in_batch, *found.get(new.id, ())]:
            verdict = judge_pair(old.text, new.text)
            by, reason = "rules", verdict.reason
            if not verdict.supersedes and judge is not None and maybe_related(old.text, new.text):
                answer = await judge.supersedes(old.text, new.text)
                if answer is None:  # the model could not answer: the rules' "no" stands
                    continue
                if not answer:
                    continue
                by, reason = "model", "model"
            elif not verdict.supersedes:
                continue
            if await supersede(session, old.id, new.id, new.created_at):
                results[index].superseded.append((old.id, new.id, reason, by))


async def _tombstones(session: AsyncSession, items: Sequence[SaveItem]) -> list[Any]:
    """The erasures that could cover any item of the batch (one query per organization)."""
    since: dict[UUID, datetime] = {}
    owners: dict[UUID, set[str]] = {}
    for item in items:
        at = item.ctx.observed_at
        if at is None or not item.drafts:
            continue
        org = item.ctx.org_id
        since[org] = min(since.get(org, at), at)
        owners.setdefault(org, set()).add(owner_key(item.ctx.owner))
    found: list[Any] = []
    for org, at in since.items():
        found.extend((org, t) for t in await erased_before(session, org, owners[org], at))
    return found


def _erased(tombstones: list[Any], ctx: SaveContext, key: DedupeKey) -> bool:
    org_id, agent_config_id, owner, fp = key
    at = ctx.observed_at
    if at is None:
        return False
    for org, t in tombstones:
        if (
            org == org_id
            and t.owner_key == owner
            and t.erased_at >= at
            and (t.agent_config_id is None or t.agent_config_id == agent_config_id)
            and (t.session_id is None or t.session_id == ctx.session_id)
            and (t.fingerprints is None or fp in t.fingerprints)
        ):
            return True
    return False


def _admit(draft: Draft, config: MemoryConfig, result: SaveResult) -> tuple[PolicyDecision, Draft] | None:
    """The checks before anything is stored: the decision and the draft as it may be stored
    (metadata under the same PII handling as the text); None (and a counted reason) when skipped."""
    reason: str | None = None
    decision: PolicyDecision | None = None
    allowed_types = config.policy.memory_types_allowed
    if draft.importance < MIN_IMPORTANCE:
        reason = "low_importance"
    elif allowed_types is not None and draft.memory_type not in allowed_types:
        reason = "type_not_allowed"
    else:
        decision = apply_write_policy(draft.text, config.pii_handling)
        if decision.denied is not None:
            reason = f"policy:{decision.denied}"
        else:
            # The type and metadata are free-form and shown beside the text: an attack there
            # quarantines the entry like an attack in its text (checked before PII redaction, as
            # the text is, so a placeholder cannot break up an attack phrase).
            decision = check_carried_fields(decision, draft.memory_type, draft.metadata)
            metadata, kinds, denied = apply_metadata_policy(draft.metadata, config.pii_handling)
            if denied is not None:
                reason = f"policy:{denied}"
            elif kinds:
                draft = replace(draft, metadata=metadata)
                merged = tuple(sorted({*decision.redactions, *kinds}))
                decision = replace(decision, redactions=merged)
    if reason is not None or decision is None:
        result.skipped += 1
        result.skip_reasons[reason or "policy"] += 1
        return None
    return decision, draft


def _row_params(item: SaveItem, draft: Draft, decision: PolicyDecision, now: datetime) -> dict[str, Any]:
    ctx = item.ctx
    owner = ctx.owner if owner_key(ctx.owner) else None
    return {
        "id": uuid4(),
        "org_id": ctx.org_id,
        "agent_config_id": ctx.agent_config_id,
        "owner_key": owner_key(owner),
        "owner_kind": owner.kind if owner else None,
        "owner_id": owner.id if owner else None,
        "session_id": ctx.session_id,
        "text": decision.text,
        "fingerprint": fingerprint(decision.text),
        "importance": draft.importance,
        "reinforcement_count": 0,
        "memory_type": draft.memory_type,
        "layer": draft.layer,
        "source": ctx.source,
        "source_agent": ctx.source_agent,
        "confidence": draft.confidence,
        "reliability": 1.0,
        "lifecycle": "active",
        "pinned": False,
        "redaction": list(decision.redactions),
        "quarantined": decision.quarantined,
        "quarantine_reasons": list(decision.quarantine_reasons),
        "provenance": ctx.provenance if decision.quarantined else {},
        "expires_at": _expires_at(item.config, draft, now),
        "occurred_at": draft.occurred_at,
        "session_position": None,  # numbered by EntryStore.upsert (shared/storage/entries/store.py)
        "created_at": now,
        "updated_at": now,
        "last_accessed_at": None,
        "access_count": 0,
        "version": 1,
        "supersedes": None,
        "superseded_by": None,
        "valid_from": None,
        "valid_until": None,
        "derived_from": [],
        "embedding_status": "pending",
        "category": None,
        "confirmation": None,
        "sensitivity": None,
        "consent": None,
        "metadata": draft.metadata,
    }


def _audit_entries(ctx: SaveContext, result: SaveResult) -> list[audit.AuditEntry]:
    def entry(kind: str, ids: list[UUID], details: dict[str, Any]) -> audit.AuditEntry:
        return audit.AuditEntry(
            kind=kind,
            actor_ref=ctx.requested_by,
            agent_config_id=ctx.agent_config_id,
            session_id=ctx.session_id,
            entry_ids=ids,
            details=details,
        )

    entries = [
        entry(
            "memory.saved",
            result.ids,
            {
                "source": ctx.source,
                "owner": owner_key(ctx.owner) or None,
                "saved": result.saved,
                "reinforced": result.reinforced,
                "skipped": result.skipped,
                "skip_reasons": dict(result.skip_reasons),
                "redactions": dict(result.redactions),
                "quarantined": [str(i) for i in result.quarantined],
            },
        )
    ]
    entries += [
        entry(
            "memory.superseded",
            [old, new],
            {"reason": reason, "by": by, "owner": owner_key(ctx.owner) or None},
        )
        for old, new, reason, by in result.superseded
    ]
    denials = {k: v for k, v in result.skip_reasons.items() if k.startswith("policy:")}
    if denials:
        entries.append(entry("policy.denied", [], {"reasons": denials}))
    return entries
