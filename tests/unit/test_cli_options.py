"""The ``engram`` command's options read the same everywhere, and defaults come from the data dir."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import uuid4

import pytest
from typer.testing import CliRunner

from services.cli.main import app
from shared.auth import TokenService
from shared.embedded.stack import load_dev_identity


@pytest.fixture(autouse=True)
def _no_deployment_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_TOKEN_KEYS", raising=False)


def test_token_mint_takes_the_org_from_connection_json(tmp_path: Path) -> None:
    org = uuid4()
    (tmp_path / "connection.json").write_text(json.dumps({"nats_url": "nats://x", "org_id": str(org)}))
    identity = load_dev_identity(tmp_path)  # the development signing key `engram up` generates
    result = CliRunner().invoke(
        app, ["token", "mint", "--kind", "end_user", "--id", "alice", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    credential = TokenService({identity.kid: identity.secret}).verify(result.stdout.strip())
    assert credential.org_id == org


def test_token_mint_without_an_org_anywhere_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["token", "mint", "--kind", "none", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "--org" in result.output


@pytest.mark.parametrize("command", [["recall"], ["export"], ["purge"], ["config", "get"], ["config", "set"]])
def test_every_command_naming_an_agent_config_calls_it_agent_config(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--agent-config" in result.stdout
