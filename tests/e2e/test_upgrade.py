"""An upgrade in place (issue 25 §2, decision record 0086): `engram up` of a previous release writes
through NATS (a session, an elective save, a config change) and HTTP (a save, a purge), stops; the
current code starts on the same data dir, migrates it, and answers the same: every memory, the
config, the erasure, the audit chain — and writes on."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import nats
import pytest

from contracts.config import MemoryConfig
from contracts.connection import ConnectionInfo
from tests.engram_up import EngramUp, fault_row, stack_dir
from tests.platform import eventually, publish_session, request, session_payload
from tests.support.previous_release import PREVIOUS, checkout, previous_command

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="process checks read /proc"),
]

ENV = {"ENGRAM_EMBEDDER": "hashing-384"}
OWNERS = ("alice", "bob", "carol")
CUES = ("deploy to staging failed", "")


def _checkout(revision: str, into: Path) -> Path:
    tree = checkout(revision, into)
    if isinstance(tree, str):
        pytest.skip(tree)
    return tree


def _previous_engram(tree: Path) -> list[str]:
    return previous_command(tree)


async def _answers(nc: Any, info: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for owner in OWNERS:
        for cue in CUES:
            asked: dict[str, Any] = {
                "agent_config_id": info["agent_config_id"],
                "principal": {"kind": "end_user", "id": owner},
            }
            if cue:
                asked.update(cue=cue, strategy="semantic")
            reply = await request(nc, "engram.recall", asked, info["token"], timeout=30)
            assert "error" not in reply, reply
            out[f"{owner}/{cue or 'default'}"] = [(r["id"], r["text"]) for r in reply["results"]]
    return out


async def _write_everything(nc: Any, info: dict[str, Any]) -> list[str]:
    """Through NATS and HTTP, as platforms write: sessions, saves, a config change, a purge."""
    org, agent, token = UUID(info["org_id"]), UUID(info["agent_config_id"]), info["token"]
    for owner in OWNERS:
        trace = [{"tool": "deploy", "input": {"who": owner}, "error": f"deploy to staging failed ({owner})"}]
        payload = session_payload(org, agent, principal={"kind": "end_user", "id": owner}, tool_trace=trace)
        await publish_session(nc, payload, token)
    saved = await request(
        nc,
        "engram.memory.save",
        {
            "agent_config_id": str(agent),
            "principal": {"kind": "end_user", "id": "alice"},
            "entries": [{"text": "Alice prefers store credit to card refunds."}],
            "wait": True,
        },
        token,
    )
    assert saved.get("status") == 200, saved
    changed = await request(
        nc,
        "engram.config.put",
        {"agent_config_id": str(agent), "config": {"retention": {"max_entries": 500}}},
        token,
    )
    assert "error" not in changed, changed
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=info["http_url"], timeout=30, headers=auth) as http:
        over_http = await http.post(
            "/v1/memories",
            json={
                "agent_config_id": str(agent),
                "principal": {"kind": "end_user", "id": "carol"},
                "content": "Carol deploys on Fridays only.",
                "wait": True,
            },
        )
        assert over_http.status_code == 200, over_http.text

    async def distilled() -> bool:
        answers = await _answers(nc, info)
        return all(len(answers[f"{o}/default"]) >= (2 if o != "bob" else 1) for o in OWNERS)

    await eventually(distilled, timeout=90, interval=0.3, what="every owner's memory recallable")
    # dave is purged: his memory must stay erased across the upgrade.
    dave = session_payload(org, agent, principal={"kind": "end_user", "id": "dave"})
    await publish_session(nc, dave, token)

    async def dave_recallable() -> bool:
        asked = {"agent_config_id": str(agent), "principal": {"kind": "end_user", "id": "dave"}}
        return bool((await request(nc, "engram.recall", asked, token))["results"])

    await eventually(dave_recallable, timeout=90, interval=0.3, what="dave's memory recallable")
    purged = await request(
        nc, "engram.memory.purge", {"agent_config_id": str(agent), "actor_ref": "end_user:dave"}, token
    )
    assert purged["entries"] >= 1, purged
    return [str(i) for i in purged["entry_ids"]]


async def test_the_current_code_starts_on_data_the_previous_release_wrote() -> None:
    with stack_dir() as scratch, tempfile.TemporaryDirectory(prefix="engram-previous-") as tmp:
        tree = _checkout(PREVIOUS, Path(tmp))
        data = scratch / "data"
        old = EngramUp(data, scratch / "previous.log", env=ENV)
        old.args = [*_previous_engram(tree), *old.args[1:]]
        with old as up:
            info = await up.connection()
            nc = await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())
            try:
                dave_ids = await _write_everything(nc, info)
                before = await _answers(nc, info)
                config = await request(
                    nc, "engram.config.get", {"agent_config_id": info["agent_config_id"]}, info["token"]
                )
            finally:
                await nc.close()
            assert await up.stop() == 0
        # It really ran the previous release's code: it kept a purge ledger if and only if that
        # release had one (the pinned one predates 0100).
        assert (data / "purge-ledger.jsonl").exists() == any((tree / "shared").glob("**/purge_ledger.py"))

        with EngramUp(data, scratch / "current.log", env=ENV) as up:
            info = await up.connection()
            nc = await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())
            try:
                after = await _answers(nc, info)
                assert after == before
                again = await request(
                    nc, "engram.config.get", {"agent_config_id": info["agent_config_id"]}, info["token"]
                )
                # What the previous release stored is kept; a setting this release added shows
                # its default (knowledge_updates, record 0103).
                kept = {k: v for k, v in again["config"].items() if k in config["config"]}
                assert kept == config["config"]
                added = {k: v for k, v in again["config"].items() if k not in config["config"]}
                defaults = MemoryConfig().model_dump(mode="json")
                assert added == {k: defaults[k] for k in added}
                assert again["version"] == config["version"]
                dave = await request(
                    nc,
                    "engram.recall",
                    {
                        "agent_config_id": info["agent_config_id"],
                        "principal": {"kind": "end_user", "id": "dave"},
                    },
                    info["token"],
                )
                assert dave["results"] == []  # erased before the upgrade, erased after it
                erased = {"dave/default": [(r["id"], r["text"]) for r in dave["results"]]}
                row = fault_row("upgrade", before, {**after, **erased}, set(dave_ids))
                assert row == {"answers": len(before), "lost": 0, "duplicated": 0, "resurrected": 0}
                verdict = await request(nc, "engram.audit.verify", {}, info["token"], timeout=60)
                assert verdict["ok"] is True, verdict
                # ... and the upgraded deployment writes on.
                payload = session_payload(
                    UUID(info["org_id"]),
                    UUID(info["agent_config_id"]),
                    principal={"kind": "end_user", "id": "erin"},
                )
                await publish_session(nc, payload, info["token"])

                async def erin() -> bool:
                    asked = {
                        "agent_config_id": info["agent_config_id"],
                        "principal": {"kind": "end_user", "id": "erin"},
                    }
                    return bool((await request(nc, "engram.recall", asked, info["token"]))["results"])

                await eventually(erin, timeout=90, interval=0.3, what="a session written after the upgrade")
            finally:
                await nc.close()
            assert await up.stop() == 0
