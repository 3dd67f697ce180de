"""``engram credentials org-*|agent-config-*|token-revoke``: what exists only through a running
deployment's admin API (docs/adr/0104-admin-api.md). Each prints its reply as one JSON object per
line. Registered on ``credentials_app`` when ``services.cli.main`` imports this module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

import typer

from services.cli.credentials import credentials_app
from services.cli.remote import CONNECTION, TOKEN, URL, Remote

__all__ = [
    "agent_config_create",
    "agent_config_list",
    "org_create",
    "org_disable",
    "org_list",
    "token_revoke",
]


def _remote(url: str, connection: Path | None, token: str) -> Remote:
    remote = Remote(url, connection, token)
    if not remote.given:
        raise typer.BadParameter("this works through a running deployment: give --url or --connection")
    return remote


def _echo(reply: Any) -> None:
    typer.echo(json.dumps(reply.model_dump(mode="json"), sort_keys=True))


@credentials_app.command("org-create")
def org_create(
    name: str = typer.Option(..., help="The organization's name."),
    org: UUID = typer.Option(None, help="Adopt this id (one its tokens already name); default: a new one."),
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Register an organization."""
    with _remote(url, connection, token).client() as client:
        _echo(client.admin_create_org(name, org_id=org))


@credentials_app.command("org-list")
def org_list(
    all_: bool = typer.Option(False, "--all", help="Disabled organizations too."),
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """The registered organizations, one per line."""
    with _remote(url, connection, token).client() as client:
        for found in client.admin_list_orgs(include_disabled=all_).organizations:
            _echo(found)


@credentials_app.command("org-disable")
def org_disable(
    org: UUID = typer.Option(..., help="The organization to disable."),
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Disable an organization: its tokens are refused at once and its platform clients revoked."""
    with _remote(url, connection, token).client() as client:
        _echo(client.admin_disable_org(org))


@credentials_app.command("agent-config-create")
def agent_config_create(
    org: UUID = typer.Option(..., help="Whose agent config."),
    agent_config: UUID = typer.Option(None, "--agent-config", help="Its id (default: a new one)."),
    config: str = typer.Option("{}", help="Memory config keys to set, as a JSON object."),
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Create an agent config of an organization."""
    try:
        patch = json.loads(config)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"--config is not JSON: {exc}") from exc
    with _remote(url, connection, token).client() as client:
        _echo(client.admin_create_agent_config(org, agent_config_id=agent_config, config=patch))


@credentials_app.command("agent-config-list")
def agent_config_list(
    org: UUID = typer.Option(..., help="Whose agent configs."),
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """An organization's agent configs, one per line."""
    with _remote(url, connection, token).client() as client:
        for found in client.admin_list_agent_configs(org).agent_configs:
            _echo(found)


@credentials_app.command("token-revoke")
def token_revoke(
    org: UUID = typer.Option(..., help="The token's organization."),
    token_id: str = typer.Option(..., "--token-id", help="The token's id (its jti)."),
    url: str = URL,
    connection: Path = CONNECTION,
    token: str = TOKEN,
) -> None:
    """Refuse a token from now on, before it expires."""
    with _remote(url, connection, token).client() as client:
        _echo(client.admin_revoke_token(org, token_id))
