"""The ``engram`` command's options read the same everywhere, and defaults come from the data dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from typer.testing import CliRunner

from contracts.connection import ConnectionInfo
from services.cli.main import app
from shared.embedded.stack import load_dev_identity
from shared.security.auth import TokenService


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


def _mint(data_dir: Path, org: UUID, name: str, *extra: str) -> dict[str, Any]:
    out = data_dir / f"{name}.json"
    args = ["credentials", "mint", "--org", str(org), "--name", name, "--out", str(out), *extra]
    result = CliRunner().invoke(app, [*args, "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    written: dict[str, Any] = json.loads(out.read_text())
    return written


def test_credentials_mint_writes_the_fields_of_connection_json(tmp_path: Path) -> None:
    """A minted client's file has every field connection.json gives a client, filled from the
    running engram up where it knows them: its NATS and HTTP URLs always, its development agent
    config only for its development organization (else --agent-config, or null)."""
    dev_org, dev_agent, other_agent = uuid4(), uuid4(), uuid4()
    running = {
        "nats_url": "nats://127.0.0.1:4999",
        "http_url": "http://127.0.0.1:8999",
        "org_id": str(dev_org),
        "agent_config_id": str(dev_agent),
        "token": "dev",
    }
    (tmp_path / "connection.json").write_text(json.dumps(running))
    client_fields = set(ConnectionInfo.model_fields)

    dev = _mint(tmp_path, dev_org, "dev-runner")
    assert client_fields <= set(dev), client_fields - set(dev)
    assert ConnectionInfo.model_validate(dev).model_dump(
        include={"nats_url", "http_url", "agent_config_id"}
    ) == {
        "nats_url": running["nats_url"],
        "http_url": running["http_url"],
        "agent_config_id": dev_agent,
    }
    other = _mint(tmp_path, uuid4(), "acme-runner")
    assert client_fields <= set(other)
    assert (other["http_url"], other["agent_config_id"]) == (running["http_url"], None)
    chosen = _mint(tmp_path, uuid4(), "beta-runner", "--agent-config", str(other_agent))
    assert chosen["agent_config_id"] == str(other_agent)
    elsewhere = _mint(tmp_path, dev_org, "far-runner", "--nats-url", "nats://elsewhere:4222")
    assert (elsewhere["nats_url"], elsewhere["http_url"], elsewhere["agent_config_id"]) == (
        "nats://elsewhere:4222",
        None,
        None,
    )
