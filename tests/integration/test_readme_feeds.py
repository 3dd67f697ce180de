"""The README's "Feeds" part runs as written (STYLE habit 13): its bash block with curl and jq
against the gateway (a webhook registered, the feed read as Server-Sent Events and resumed with
Last-Event-ID, the webhooks listed, a replay), and its Python receiver verifying a real delivery."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from shared.runtime.settings import EngramSettings
from tests.integration.test_readme import README, python_block
from tests.platform import eventually, save_over_http
from tests.support.webhook_receiver import Receiver, webhook_receiver

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def settings(settings: EngramSettings) -> EngramSettings:
    """The README's receiver runs on this machine: private addresses allowed, as it says."""
    return settings.model_copy(update={"webhook_allow_private_networks": True})


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as r:
        yield r


def _feeds_block() -> str:
    (block,) = [
        b for b in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL) if "/v1/events" in b
    ]
    return block


async def test_readme_feed_commands_run_against_the_gateway(
    gateway: str,
    http: httpx.AsyncClient,
    org: UUID,
    agent: UUID,
    service_token: str,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    """Every command of the block succeeds; the events read are the organization's, in order,
    none twice across the resume; the webhook it registered gets the next write, and the README's
    receiver verifies it with the secret the block saved."""
    first = await save_over_http(http, service_token, agent, "Alice prefers store credit to card refunds.")
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
        _feeds_block(),
        cwd=tmp_path,
        env={**os.environ, "RECEIVER_URL": receiver.url("/readme")},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(done.communicate(), 120)
    assert done.returncode == 0, err.decode()
    *_, listed, replayed = _json_values(out.decode())
    assert len(listed["webhooks"]) == 1
    assert replayed["replayed"] == 0  # nothing was dead-lettered

    text = (tmp_path / "events.txt").read_text()
    ids = [int(i) for i in re.findall(r"^id: (\d+)$", text, flags=re.MULTILINE)]
    assert ids == sorted(set(ids)), ids  # in order, none twice across the resume
    data = [json.loads(d) for d in re.findall(r"^data: (.*)$", text, flags=re.MULTILINE)]
    assert {d["org_id"] for d in data} == {str(org)}
    assert first in {d.get("entry_id") for d in data}
    assert "store credit" not in text

    secret = (tmp_path / "webhook-secret").read_text().strip()
    receiver.endpoints["/readme"].secret = secret
    later = await save_over_http(http, service_token, agent, "Alice asked for e-mail receipts.")
    endpoint = receiver.endpoints["/readme"]
    await eventually(
        lambda: any(e["data"].get("entry_id") == later for e in endpoint.received),
        what=lambda: f"deliveries: {[e['type'] for e in endpoint.received]}",
    )
    namespace: dict[str, Any] = {}
    exec(compile(python_block("def receive"), str(README), "exec"), namespace)  # noqa: S102 (our README)
    delivered = next(e for e in endpoint.received if e["data"].get("entry_id") == later)
    event = namespace["receive"](secret, delivered["_body"], delivered["_headers"])
    assert event["type"] == "memory.written"
    assert {e["type"] for e in endpoint.received} <= {"memory.written", "memory.purged"}


def _json_values(text: str) -> list[Any]:
    """The JSON values curl printed one after another (no newline between them)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values
