"""The ``engram`` command against running services, driven as a user types it: every recall format
and strategy prints, and a failure reads as one ``CODE: message`` line (traceback only with
``--debug``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from typer.testing import CliRunner, Result

from contracts.common import SYSTEM_ORG
from services.cli.main import app
from shared.embedded.nats_server import NatsServerProcess
from shared.service.infra import Infra
from tests.engram_up import ENGRAM, clean_env
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration

FORMATS = ("text", "full", "compact", "narrative")
STRATEGIES = ("last_k", "importance", "full", "pack", "semantic", "hybrid")
TEXTS = (
    "Refund order A-1042 was declined by the card processor; offer store credit instead.",
    "Alice prefers store credit to card refunds.",
)


@pytest.fixture
def data_dir(
    tmp_path: Path, nats_proc: NatsServerProcess, org: UUID, agent: UUID, service_token: str
) -> Path:
    """What `engram up` leaves for the CLI: connection.json with the development client's NATS
    identity (a platform client that may also read the audit and dead-letter streams)."""
    identity = nats_proc.identities.dev_client()  # type: ignore[attr-defined]
    assert identity is not None
    info = {
        "nats_url": nats_proc.url,
        "nats_nkey_seed": identity.seed,
        "nats_inbox_prefix": identity.inbox_prefix,
        "token": service_token,
        "org_id": str(org),
        "agent_config_id": str(agent),
    }
    (tmp_path / "connection.json").write_text(json.dumps(info))
    return tmp_path


@pytest.fixture
def operator_dir(tmp_path: Path, nats_proc: NatsServerProcess, org: UUID, service_token: str) -> Path:
    """connection.json with `engram up`'s development client, which may read the audit stream."""
    identity = nats_proc.identities.dev_client()  # type: ignore[attr-defined]
    info = {
        "nats_url": nats_proc.url,
        "nats_nkey_seed": identity.seed,
        "nats_inbox_prefix": identity.inbox_prefix,
        "token": service_token,
        "org_id": str(org),
    }
    (tmp_path / "connection.json").write_text(json.dumps(info))
    return tmp_path


async def engram_cli(*args: str) -> Result:
    """Run ``engram ARGS`` in a thread (the command runs its own event loop)."""
    runner = CliRunner()
    return await asyncio.to_thread(lambda: runner.invoke(app, list(args)))


async def _seed(nc: Client, token: str, agent: UUID) -> None:
    body: dict[str, Any] = {
        "agent_config_id": str(agent),
        "wait": True,
        "principal": {"kind": "end_user", "id": "alice"},
        "entries": [{"text": t, "importance": 0.7, "memory_type": "fact"} for t in TEXTS],
    }
    assert (await request(nc, "engram.memory.save", body, token))["status"] == 200

    async def indexed() -> bool:
        reply = await request(
            nc,
            "engram.recall",
            {
                "agent_config_id": str(agent),
                "principal": {"kind": "end_user", "id": "alice"},
                "strategy": "semantic",
                "cue": "refund declined",
            },
            token,
        )
        return reply.get("count") == len(TEXTS)

    await eventually(indexed, timeout=60, what="both entries indexed")


async def test_recall_prints_every_format_of_every_strategy(
    engram: Infra, nc: Client, service_token: str, agent: UUID, data_dir: Path
) -> None:
    """The README's example (narrative, hybrid, a budget) crashed formatting ``importance``, which
    compact and narrative leave out; those two print the context block instead."""
    await _seed(nc, service_token, agent)
    for strategy in STRATEGIES:
        for fmt in FORMATS:
            result = await engram_cli(
                "recall",
                "refund declined",
                "--as",
                "end_user:alice",
                "--strategy",
                strategy,
                "--format",
                fmt,
                "--token-budget",
                "900",
                "--data-dir",
                str(data_dir),
            )
            where = f"{strategy}/{fmt}: {result.output}"
            assert result.exit_code == 0, where
            assert f"{strategy}: 2 of 2 matches" in result.stdout, where
            if fmt in ("compact", "narrative"):
                assert "<engram-memory>" in result.stdout, where
            # Both memories are printed, whichever way the text wraps.
            flat = " ".join(result.stdout.split()).replace("│", "")
            assert "store credit" in flat, where


async def test_recall_takes_agent_config_like_every_other_command(
    engram: Infra, nc: Client, service_token: str, agent: UUID, data_dir: Path
) -> None:
    await _seed(nc, service_token, agent)
    for flag in ("--agent-config", "--agent"):  # --agent: the old spelling still works
        result = await engram_cli(
            "recall", "--as", "end_user:alice", flag, str(agent), "--data-dir", str(data_dir)
        )
        assert result.exit_code == 0, result.output
        assert "2 of 2 matches" in result.stdout


async def test_a_wire_error_is_one_line_with_its_details_and_no_traceback(
    engram: Infra, data_dir: Path
) -> None:
    result = await engram_cli("config", "set", "retention.max_entries=-5", "--data-dir", str(data_dir))
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("INVALID_REQUEST: "), result.stderr
    assert "loc: retention.max_entries" in lines[1], result.stderr
    assert "Traceback" not in result.output


async def test_debug_shows_the_traceback(engram: Infra, data_dir: Path) -> None:
    from contracts.errors import InvalidRequest

    result = await engram_cli(
        "--debug", "config", "set", "retention.max_entries=-5", "--data-dir", str(data_dir)
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, InvalidRequest)  # re-raised, so Python prints the traceback


async def test_a_request_the_client_refuses_reads_as_invalid_request(engram: Infra, data_dir: Path) -> None:
    result = await engram_cli("recall", "--top-k", "0", "--data-dir", str(data_dir))
    assert result.exit_code == 1
    assert result.stderr.startswith("INVALID_REQUEST: "), result.stderr
    assert "loc: top_k" in result.stderr
    assert "Traceback" not in result.output


async def test_unreachable_nats_reads_as_unavailable(data_dir: Path) -> None:
    result = await engram_cli(
        "recall", "--nats-url", "nats://127.0.0.1:9", "--token", "t", "--data-dir", str(data_dir)
    )
    assert result.exit_code == 1
    assert result.stderr.startswith("UNAVAILABLE: cannot reach NATS"), result.stderr


async def test_a_usage_mistake_stays_a_usage_error() -> None:
    result = await engram_cli("serve", "no-such-service")
    assert result.exit_code == 2
    assert "unknown service no-such-service" in result.output


async def test_audit_tail_prints_whole_records(
    engram: Infra, nc: Client, operator_dir: Path, org: UUID, agent: UUID, service_token: str
) -> None:
    """engram audit tail prints each record whole: a rejected session's record keeps its full
    reason and details, however long (they used to be cut at 160 characters)."""
    bad = session_payload(uuid4(), agent)  # another organization's session: refused, parsed
    await publish_session(nc, bad, service_token)
    records: list[dict[str, Any]] = []

    async def audited() -> bool:
        page = await request(nc, "engram.audit.query", {"kind": "session.rejected"}, service_token)
        records[:] = page.get("records") or []
        return bool(records)

    await eventually(audited, what="the session.rejected audit record")
    details = json.dumps(records[0]["details"], sort_keys=True, ensure_ascii=False)
    assert len(details) > 200, details  # the line used to keep 160 characters of them
    result = await engram_cli(
        "audit", "tail", "--from-start", "--kind", "session.rejected", "--limit", "1",
        "--data-dir", str(operator_dir),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert details in result.stdout, result.stdout


async def _system_rejections(observer_nc: Client) -> int:
    """How many ``session.rejected`` records of the system chain ENGRAM_AUDIT holds."""
    sub = await observer_nc.jetstream().pull_subscribe(
        "engram.audit.session.rejected",
        stream="ENGRAM_AUDIT",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    try:
        left, count = (await sub.consumer_info()).num_pending or 0, 0
        while left:
            batch = await sub.fetch(min(left, 256), timeout=5)
            left -= len(batch)
            count += sum(json.loads(m.data)["org_id"] == str(SYSTEM_ORG) for m in batch)
        return count
    finally:
        await sub.unsubscribe()


async def test_audit_tail_shows_a_tokenless_sessions_rejection(
    engram: Infra, nc: Client, observer_nc: Client, org: UUID, agent: UUID, data_dir: Path
) -> None:
    """README step 3: a session without a token is dead-lettered and its ``session.rejected``
    record — the system chain's, since no token named an organization — is in `engram audit
    tail`, marked ``system``, beside the data dir's organization's records."""
    before = await _system_rejections(observer_nc)
    await publish_session(nc, session_payload(org, agent), None)
    seen = before

    async def recorded() -> bool:
        nonlocal seen
        seen = await _system_rejections(observer_nc)
        return seen > before

    await eventually(recorded, what="the tokenless session's session.rejected record on ENGRAM_AUDIT")
    args = ["audit", "tail", "--from-start", "--kind", "session.rejected", "--limit", str(seen)]
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [str(ENGRAM), *args, "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"engram audit tail never showed {seen} system records: {exc.stdout!r}") from exc
    lines = [line for line in done.stdout.splitlines() if "session.rejected" in line]
    assert done.returncode == 0, done.stderr
    assert len(lines) == seen
    assert all(" system #" in line for line in lines), lines
