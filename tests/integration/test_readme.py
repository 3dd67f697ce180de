"""The README's code runs as written (STYLE habit 13: examples are tests)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import select, text

from shared.runtime.settings import EngramSettings
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import AuditRecord
from tests.platform import eventually
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def python_block(containing: str) -> str:
    """The README's one Python snippet that mentions ``containing``."""
    (block,) = [b for b in _python_blocks() if containing in b]
    return block


async def test_readme_platform_snippet_publishes_and_saves(
    engram: Infra,
    settings: EngramSettings,
    nats_proc: SecuredNatsServer,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
    tmp_path: Path,
) -> None:
    """The README's raw nats-py snippet, given a connection file like ``engram up``'s (a platform
    client's NATS identity on an authenticated server), publishes a session that is distilled
    and saves with wait."""
    first_hour, block = python_block("async def first_hour"), python_block("async def publish_one")
    namespace: dict[str, Any] = {}
    exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 (our own README)
    exec(compile(first_hour, str(README), "exec"), namespace)  # noqa: S102
    connection = tmp_path / "connection.json"
    connection.write_text(
        json.dumps(
            {
                "nats_url": settings.nats_url,
                "nats_nkey_seed": nats_proc.client.seed,
                "nats_inbox_prefix": nats_proc.client.inbox_prefix,
                "token": service_token,
                "org_id": str(org),
                "agent_config_id": str(agent),
            }
        )
    )
    reply = await namespace["publish_one"](str(connection))
    assert (reply["status"], reply["saved"], reply["skipped"], reply["reinforced"]) == (200, 1, 0, 0)

    async def distilled() -> bool:
        async with db.read() as s:
            found = await s.execute(
                select(AuditRecord).where(AuditRecord.org_id == org, AuditRecord.kind == "distill.completed")  # type: ignore[arg-type]
            )
            return found.first() is not None

    await eventually(distilled, what="the README's session distilled")

    # The first-hour snippet: recall, feedback, pin, list, for the same owner.
    async def indexed() -> bool:
        async with db.read() as s:
            found = await s.execute(
                text(
                    "SELECT count(*) FROM memory_entries WHERE org_id = :o AND embedding_status <> 'indexed'"
                ),
                {"o": org},
            )
            return found.scalar_one() == 0

    await eventually(indexed, what="every entry embedded")
    seen = await namespace["first_hour"](str(connection))
    assert seen["recalled"]
    assert len(seen["pinned"]) == 1


def _http_block() -> str:
    """The bash block of the README's "HTTP API" section (the one that starts from engram up's
    connection file; the identity-provider section has curl commands of its own)."""
    (block,) = [
        b
        for b in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
        if "/v1/" in b and ".engram/connection.json" in b and "/v1/webhooks" not in b
    ]
    return block


async def test_readme_curl_examples_run_against_the_gateway(
    gateway: str, org: UUID, agent: UUID, service_token: str, tmp_path: Path
) -> None:
    """The README's HTTP section, run by bash with curl and jq as written, from a directory whose
    .engram/connection.json is like engram up's: every command succeeds (curl --fail-with-body
    exits non-zero on an error status), the session is accepted, the memory is saved, listed,
    exported and deleted."""
    (tmp_path / ".engram").mkdir()
    (tmp_path / ".engram" / "connection.json").write_text(
        json.dumps(
            {"http_url": gateway, "token": service_token, "org_id": str(org), "agent_config_id": str(agent)}
        )
    )
    done = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        _http_block(),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(done.communicate(), 120)
    assert done.returncode == 0, err.decode()
    printed = out.decode()
    assert '"status":202' in printed.replace(" ", "")  # the session
    assert '"saved":1' in printed  # the save, waited for
    assert printed.count("Alice prefers store credit to card refunds.") >= 3  # recall, list, export
    receipt = json.loads(printed.strip().splitlines()[-1])
    assert receipt["entries"] == 1  # the delete


def _connection_file(path: Path, **fields: Any) -> str:
    path.write_text(json.dumps({k: str(v) if isinstance(v, UUID) else v for k, v in fields.items()}))
    return str(path)


async def test_readme_python_client_submits_saves_and_recalls(
    engram: Infra,
    settings: EngramSettings,
    nats_proc: SecuredNatsServer,
    org: UUID,
    agent: UUID,
    service_token: str,
    tmp_path: Path,
) -> None:
    """The README's thin-client snippet (engram_client over NATS, as the connection file's nkey
    identity): the session is accepted once, the save waited for, and recall answers a context."""
    namespace: dict[str, Any] = {}
    exec(compile(python_block("async def publish_with_client"), str(README), "exec"), namespace)  # noqa: S102
    connection = _connection_file(
        tmp_path / "connection.json",
        nats_url=settings.nats_url,
        nats_nkey_seed=nats_proc.client.seed,
        nats_inbox_prefix=nats_proc.client.inbox_prefix,
        token=service_token,
        org_id=org,
        agent_config_id=agent,
    )
    seen = await namespace["publish_with_client"](connection)
    assert seen["duplicate"] is False
    assert (seen["saved"]["status"], seen["saved"]["saved"]) == (200, 1)
    assert "Alice prefers store credit to card refunds." in (seen["context"] or "")


async def test_readme_python_client_over_http(
    gateway: str, org: UUID, agent: UUID, service_token: str, tmp_path: Path
) -> None:
    """The README's blocking HTTP snippet (SyncEngramClient, transport="http"): a memory saved for
    Alice is listed and exported, deleted, and then NOT_FOUND as a typed error."""
    from engram_client import SyncEngramClient

    namespace: dict[str, Any] = {}
    exec(compile(python_block("def list_export_forget"), str(README), "exec"), namespace)  # noqa: S102
    connection = _connection_file(
        tmp_path / "connection.json",
        nats_url="nats://unused:4222",
        http_url=gateway,
        token=service_token,
        org_id=org,
        agent_config_id=agent,
    )
    text = f"Alice keeps her receipts in a shoebox ({uuid4().hex[:8]})."

    def run() -> dict[str, Any]:
        with SyncEngramClient.connect_http(gateway, service_token) as engram:
            engram.save(
                agent,
                [{"text": text, "importance": 0.9}],
                principal={"kind": "end_user", "id": "alice"},
                wait=True,
            )
        result: dict[str, Any] = namespace["list_export_forget"](connection)
        return result

    # Blocking code, off this test's event loop (the gateway under test runs on it).
    seen = await asyncio.to_thread(run)
    assert text in seen["listed"]
    assert text in seen["exported"]
    assert seen["deleted"] == 1
