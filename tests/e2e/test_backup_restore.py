"""The restore drill (issue 25 §1, decision record 0085), on `engram up` as a user runs it, with the
README's runbook commands: seed, back up, change and purge, restore the older backup into a fresh
data dir → the fixed cue set gets the backup's answers, the audit chain verifies, and the owner
purged after the backup is erased again before the restored deployment answers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID

import nats
import pytest

from contracts.connection import ConnectionInfo
from tests.engram_up import ENGRAM, EngramUp, clean_env, cli, fault_row, stack_dir
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="process checks read /proc"),
]

README = Path(__file__).resolve().parents[2] / "README.md"
#: Fast and deterministic: the drill is about what comes back, not about semantics.
ENV = {"ENGRAM_EMBEDDER": "hashing-384"}
OWNERS = ("alice", "bob", "carol")
#: The fixed cue set: every owner asked with each cue, semantic and the default strategy.
CUES = ("deploy to staging failed", "quota exceeded in region", "")


def runbook() -> dict[str, str]:
    """The README's backup runbook: its `engram backup` and `engram restore` lines, by command."""
    blocks = [
        b
        for b in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL)
        if 'engram backup "$BACKUP"' in b
    ]
    assert len(blocks) == 1, "the README has one backup runbook"
    lines = [line.strip() for line in blocks[0].splitlines() if line.strip().startswith("engram ")]
    return {line.split()[1]: line for line in lines}


def run_line(line: str, **variables: Path) -> subprocess.CompletedProcess[str]:
    """A runbook line, run by bash as written, with the installed `engram` first on PATH."""
    env = {
        **clean_env(),
        **ENV,
        **{k: str(v) for k, v in variables.items()},
        "PATH": f"{ENGRAM.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        ["bash", "-euc", line], capture_output=True, text=True, timeout=600, env=env, check=False
    )


async def _answers(nc: Any, info: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Each owner's recall for each cue: the (id, text) list, in order."""
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


async def _connect(info: dict[str, Any]) -> Any:
    return await nats.connect(info["nats_url"], **ConnectionInfo.model_validate(info).nats_options())


async def _seed(nc: Any, info: dict[str, Any], owner: str) -> None:
    """Two sessions of ``owner``, recallable before this returns."""
    org, agent = UUID(info["org_id"]), UUID(info["agent_config_id"])
    for task, error in (
        ("Deploy to staging", "quota exceeded in region eu-1"),
        ("Rotate the keys", "deploy to staging failed: vault sealed"),
    ):
        trace = [{"tool": "deploy", "input": {"who": owner}, "error": f"{error} ({owner})"}]
        payload = session_payload(
            org, agent, principal={"kind": "end_user", "id": owner}, task=task, tool_trace=trace
        )
        await publish_session(nc, payload, info["token"])

    async def recallable() -> bool:
        asked = {"agent_config_id": info["agent_config_id"], "principal": {"kind": "end_user", "id": owner}}
        reply = await request(nc, "engram.recall", asked, info["token"], timeout=30)
        return len(reply.get("results") or []) >= 2

    await eventually(recallable, timeout=90, interval=0.3, what=f"{owner}'s sessions recallable")


async def test_restore_drill_keeps_answers_and_erases_what_was_purged_after_the_backup() -> None:
    commands = runbook()
    assert {"backup", "restore"} <= set(commands), commands
    with stack_dir() as scratch:
        data, backup, new = scratch / "data", scratch / "backup-1", scratch / "restored"

        # 1. Seed three owners, stop.
        with EngramUp(data, scratch / "seed.log", env=ENV) as up:
            info = await up.connection()
            nc = await _connect(info)
            try:
                for owner in OWNERS:
                    await _seed(nc, info, owner)
            finally:
                await nc.close()
            assert await up.stop() == 0

        # 2. Back up, as the README says (refused while the stack runs: tested below).
        done = run_line(commands["backup"], DATA=data, BACKUP=backup)
        assert done.returncode == 0, done.stderr
        manifest = json.loads((backup / "manifest.json").read_text())
        assert {"postgres.dump", "dev-identity.json", "credentials/nats-clients.json"} <= set(
            manifest["files"]
        )
        assert any(name.startswith("vectors/") for name in manifest["files"]), manifest["files"]
        assert any(name.startswith("nats/jetstream/") for name in manifest["files"]), manifest["files"]
        assert not any("purge-ledger" in name for name in manifest["files"])

        # 3. Change: the backup's answers first (the same state as the backup), then a new owner
        #    and bob purged.
        with EngramUp(data, scratch / "change.log", env=ENV) as up:
            info = await up.connection()
            refused = run_line(commands["backup"], DATA=data, BACKUP=scratch / "while-running")
            assert refused.returncode == 1, refused.stderr
            assert "UNAVAILABLE" in refused.stderr, refused.stderr
            nc = await _connect(info)
            try:
                before = await _answers(nc, info)
                assert all(before[f"{o}/default"] for o in OWNERS), before
                await _seed(nc, info, "dave")
            finally:
                await nc.close()
            purged = await asyncio.to_thread(
                cli, "purge", "--actor", "end_user:bob", "--yes", "--data-dir", str(data)
            )
            assert json.loads(purged.stdout)["entries"] >= 2, purged.stdout
            assert await up.stop() == 0
        ledger = [json.loads(line) for line in (data / "purge-ledger.jsonl").read_text().splitlines()]
        assert [r["owner_key"] for r in ledger] == ["end_user:bob"]
        assert "text" not in json.dumps(ledger)

        # 4. A restore without any ledger is refused, never silent.
        bare = subprocess.run(
            [str(ENGRAM), "restore", str(backup), "--data-dir", str(scratch / "no-ledger")],
            capture_output=True, text=True, timeout=600, env={**clean_env(), **ENV}, check=False,
        )  # fmt: skip
        assert bare.returncode == 1, bare.stderr
        assert "INVALID_REQUEST" in bare.stderr, bare.stderr
        assert "--ledger" in bare.stderr, bare.stderr  # says what to do

        # 5. Restore the older backup into a fresh data dir, with the ledger that outlived it.
        done = run_line(commands["restore"], DATA=data, BACKUP=backup, NEW=new)
        assert done.returncode == 0, done.stderr
        assert "1 erasures made after the backup applied again" in done.stdout, done.stdout

        # 6. The restored deployment's first answers: the backup's, except bob, who stays erased.
        with EngramUp(new, scratch / "restored.log", env=ENV) as up:
            info = await up.connection()
            nc = await _connect(info)
            try:
                after = await _answers(nc, info)
                dave = await request(
                    nc,
                    "engram.recall",
                    {
                        "agent_config_id": info["agent_config_id"],
                        "principal": {"kind": "end_user", "id": "dave"},
                    },
                    info["token"],
                )
            finally:
                await nc.close()
            bobs = {i for key, answer in before.items() if key.startswith("bob/") for i, _ in answer}
            row = fault_row("restore", before, after, bobs)
            assert row == {"answers": len(before), "lost": 0, "duplicated": 0, "resurrected": 0}
            for key, answer in before.items():
                if key.startswith("bob/"):
                    assert answer, key  # bob had memory in the backup…
                    assert after[key] == [], (key, after[key])  # …erased again before any answer
                else:
                    assert after[key] == answer, key
            assert dave["results"] == []  # written after the backup: a restore is the backup's state
            verified = await asyncio.to_thread(cli, "audit", "verify", "--data-dir", str(new))
            assert "audit chain verified" in verified.stdout, verified.stdout
            tail = await asyncio.to_thread(
                cli, "audit", "tail", "--from-start", "--kind", "memory.purged", "--limit", "1",
                "--data-dir", str(new),
            )  # fmt: skip
            assert "purge-ledger" in tail.stdout, tail.stdout
            assert await up.stop() == 0
        # The restored data dir carries the ledger on: a later restore needs it too.
        assert (new / "purge-ledger.jsonl").read_text() == (data / "purge-ledger.jsonl").read_text()
