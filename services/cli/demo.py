"""``engram demo``: publish the bundled sessions as a platform would, wait for Engram to process
them, then show what was distilled, reinforced, skipped, redacted and quarantined."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from contracts.client import EngramClient
from contracts.common import Principal
from contracts.errors import VectorUnavailable
from services.cli.demo_data import DEMO_AGENT_B, DEMO_ORG_B, DEMO_RECALL_HINTS, demo_sessions
from shared.embedded.stack import DevIdentity
from shared.security.auth import ALL_PERMISSIONS
from shared.storage.db.engine import Database
from shared.storage.entries import Entry, listing

__all__ = ["DemoReport", "run_demo"]


@dataclass
class DemoReport:
    published: int = 0
    distilled: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    saved: int = 0
    reinforced: int = 0
    redactions: Counter[str] = field(default_factory=Counter)
    quarantined: int = 0
    chain_ok: bool = False
    #: Owners of the development organization whose memory was purged (their lessons are gone
    #: for good: a re-run's sessions are refused as replays of erased events).
    purged: set[str] = field(default_factory=set)


async def run_demo(
    nats_url: str,
    database_url: str,
    identity: DevIdentity,
    console: Console,
    *,
    timeout_s: float = 60.0,
    nats_options: dict[str, Any] | None = None,
) -> DemoReport:
    """``nats_options``: the development client's NATS identity (``ConnectionInfo.nats_options()``)."""
    tokens = identity.tokens()
    orgs = {identity.org_id: identity.agent_config_id, DEMO_ORG_B: DEMO_AGENT_B}
    org_tokens = {
        org: tokens.mint(
            org_id=org,
            principal=Principal(kind="service", id="demo-platform"),
            permissions=ALL_PERMISSIONS,
            ttl_seconds=3600,
        )
        for org in orgs
    }
    sessions = demo_sessions(
        identity.org_id, identity.agent_config_id, DEMO_ORG_B, DEMO_AGENT_B, now=datetime.now(UTC)
    )
    report = DemoReport(published=len(sessions))
    clients = {
        org: await EngramClient.connect(nats_url, token, **(nats_options or {}))
        for org, token in org_tokens.items()
    }
    try:
        # Keep raw tool activity as observations too: that is where the demo's e-mails, card
        # numbers and injection attempts sit, so redaction and quarantine have something to show.
        for org, agent in orgs.items():
            await clients[org].put_config(agent, {"keep_observations": True})
        with Progress(console=console, transient=False) as progress:
            task = progress.add_task("publishing session.ended", total=len(sessions))
            for payload in sessions:
                await clients[UUID(payload["org_id"])].publish_session(payload)
                progress.advance(task)
            wait = progress.add_task("distilling", total=len(sessions))
            done = await _wait_for_distill(clients, sessions, progress, wait, timeout_s)
        for org, client in clients.items():
            records = await _all_audit(client)
            ours = {s["event_id"] for s in sessions if UUID(s["org_id"]) == org} & done.get(org, set())
            _tally(report, records, ours)
            if org == identity.org_id:
                report.purged = _purged_owners(records)
            verdict = await client.audit_verify()
            report.chain_ok = verdict.ok if org == identity.org_id else report.chain_ok and verdict.ok
        await _show(console, database_url, orgs, {s["session_id"] for s in sessions}, report)
        await _recall_some(console, clients[identity.org_id], identity.agent_config_id, report.purged)
    finally:
        for client in clients.values():
            await client.close()
    return report


async def _recall_some(
    console: Console, client: EngramClient, agent: UUID, purged: set[str], timeout_s: float = 15.0
) -> None:
    """End as an agent runner would begin: ask what to remember before a few new tasks."""
    loop = asyncio.get_running_loop()
    for ref, cue in DEMO_RECALL_HINTS[:3]:
        if ref in purged:  # nothing will come back: do not wait for it
            console.print(f"recall for {ref}: {cue!r} — (purged)", highlight=False)
            continue
        principal = Principal.parse_ref(ref).model_dump()
        deadline = loop.time() + timeout_s
        while True:  # vectors are written asynchronously: give the embed service a moment
            try:
                reply = await client.recall(agent, principal=principal, strategy="hybrid", cue=cue, top_k=3)
            except VectorUnavailable:
                reply = await client.recall(agent, principal=principal, strategy="pack", cue=cue, top_k=3)
            if reply.count or loop.time() > deadline:
                break
            await asyncio.sleep(0.3)
        table = Table(title=f"recall for {ref}: {cue!r} ({reply.strategy})", expand=True)
        table.add_column("score", no_wrap=True)
        table.add_column("memory", ratio=1, overflow="fold")
        for result in reply.results:
            table.add_row(f"{result.score:.3f}", Text(result.text))  # data, never rich markup
        console.print(table)


async def _all_audit(client: EngramClient) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await client.audit_query(after_seq=after, limit=1000)
        records += page.records
        if page.next_after_seq is None:
            return records
        after = page.next_after_seq


async def _wait_for_distill(
    clients: dict[UUID, EngramClient],
    sessions: list[dict[str, Any]],
    progress: Progress,
    task: Any,
    timeout_s: float,
) -> dict[UUID, set[str]]:
    """Poll the audit log until every published session has a distill outcome."""
    wanted = {(UUID(s["org_id"]), s["event_id"]) for s in sessions}
    seen: dict[UUID, set[str]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        for org, client in clients.items():
            for record in await _all_audit(client):
                if record["kind"] in {"distill.completed", "distill.skipped"}:
                    seen.setdefault(org, set()).add(str(record["details"].get("event_id")))
        count = sum(1 for org, ev in wanted if ev in seen.get(org, set()))
        progress.update(task, completed=count)
        if count >= len(wanted):
            break
        await asyncio.sleep(0.3)
    return seen


def _purged_owners(records: list[dict[str, Any]]) -> set[str]:
    """Owners whose whole memory a purge erased (``engram purge --actor X`` without a session)."""
    return {
        str(r["details"].get("actor_scope"))
        for r in records
        if r["kind"] == "memory.purged"
        and r["details"].get("reason") == "purge"
        and r["details"].get("actor_scope")
        and not r["details"].get("session_scope")
    }


def _tally(report: DemoReport, records: list[dict[str, Any]], events: set[str]) -> None:
    """Count the outcomes of this run's sessions only (``events``): the organization's audit log
    also holds other clients' sessions."""
    for record in records:
        details = record["details"]
        if str(details.get("event_id")) not in events:
            continue
        if record["kind"] == "distill.completed":
            report.distilled += 1
        elif record["kind"] == "distill.skipped":
            report.skipped[str(details.get("reason"))] += 1


async def _stored(database_url: str, orgs: dict[UUID, UUID], session_ids: set[str]) -> list[Entry]:
    """What the demo's sessions left (not what other clients saved in these organizations)."""
    db = Database(database_url, pool_size=1)
    try:
        async with db.read() as session:
            return await listing.of_sessions(session, orgs, session_ids)
    finally:
        await db.close()


def _lessons_table(lessons: list[Entry]) -> Table:
    """Each lesson as stored, and what redaction replaced in it in a column of its own: appended to
    the text, the kinds read as a stray placeholder that is not in the memory. Stored text is
    printed as :class:`Text`: memory text is data, never rich markup (``[bold]`` stays as written)."""
    table = Table(title="Lessons Engram distilled (read from Postgres)", expand=True)
    table.add_column("owner", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("imp", no_wrap=True)
    table.add_column("x", no_wrap=True, header_style="bold", justify="right")
    table.add_column("lesson", ratio=1, overflow="fold")
    table.add_column("redacted", no_wrap=True)
    for row in lessons:
        table.add_row(
            Text(row.owner_key or "(shared)"),
            Text(row.memory_type),
            f"{row.importance:.2f}",
            str(row.reinforcement_count + 1),
            Text("[quarantined: not shown]" if row.quarantined else row.text),
            ",".join(row.redaction),
        )
    return table


def _observations_table(observations: list[Entry]) -> Table:
    """The observations the write policy redacted or quarantined, stored text as :class:`Text`."""
    flagged = [r for r in observations if r.quarantined or r.redaction]
    title = f"Observations kept: {len(observations)}; the ones the write policy touched"
    obs = Table(title=title, expand=True)
    obs.add_column("owner", no_wrap=True)
    obs.add_column("policy", no_wrap=True)
    obs.add_column("stored text", ratio=1, overflow="fold")
    for row in flagged:
        policy = ",".join([*(["QUARANTINED"] if row.quarantined else []), *row.redaction])
        obs.add_row(
            Text(row.owner_key or "(shared)"),
            policy,
            Text("[quarantined: never rendered into a prompt]" if row.quarantined else row.text),
        )
    return obs


async def _show(
    console: Console, database_url: str, orgs: dict[UUID, UUID], session_ids: set[str], report: DemoReport
) -> None:
    rows = await _stored(database_url, orgs, session_ids)
    lessons = [r for r in rows if r.layer == "memory"]
    observations = [r for r in rows if r.layer == "observation"]
    report.saved = len(lessons)
    report.reinforced = sum(r.reinforcement_count for r in lessons)
    report.redactions = Counter(kind for r in rows for kind in r.redaction)
    report.quarantined = sum(1 for r in rows if r.quarantined)

    console.print(_lessons_table(lessons))
    if observations:
        console.print(_observations_table(observations))
    summary = Table(title="Demo summary", show_header=False)
    summary.add_row("sessions published", str(report.published))
    summary.add_row("distilled", str(report.distilled))
    summary.add_row("skipped by the gate", ", ".join(f"{k}: {v}" for k, v in report.skipped.items()) or "0")
    summary.add_row("lessons saved", str(report.saved))
    summary.add_row("reinforced (same lesson again)", str(report.reinforced))
    summary.add_row("observations kept", str(len(observations)))
    summary.add_row("redacted", ", ".join(f"{k}: {v}" for k, v in sorted(report.redactions.items())) or "0")
    summary.add_row("quarantined (injection)", str(report.quarantined))
    if report.purged:
        summary.add_row("purged owners (their lessons are gone)", ", ".join(sorted(report.purged)))
    summary.add_row("audit chain", "verified" if report.chain_ok else "BROKEN")
    console.print(summary)
