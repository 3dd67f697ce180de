"""What the deployment checks share: the environment variables the code reads, compose-style
``${VAR}`` interpolation, and a generated set of deployment secrets."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from typer.testing import CliRunner

from services.cli.main import app
from services.runtime import SERVICES
from shared.runtime.settings import EngramSettings
from shared.security.nats_auth.permissions import GATEWAY

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
#: Every variable Engram reads: ENGRAM_ + a settings field.
SETTINGS_ENV = {EngramSettings.variable(name) for name in EngramSettings.model_fields}
#: What `engram serve` cannot run without on an authenticated cluster.
REQUIRED_ENV = {
    "ENGRAM_NATS_URL",
    "ENGRAM_NATS_NKEY_SEED",
    "ENGRAM_DATABASE_URL",
    "ENGRAM_TOKEN_KEYS",
    "ENGRAM_STREAM_REPLICAS",
    "ENGRAM_HEALTH_PORT",
}
#: Services whose replicas share vectors: Qdrant Edge is one process only, so they need a server.
NEED_VECTOR_SERVER = {"embed", "recall"}
#: What the HTTP gateway cannot run without: NATS and its identity, where to listen, and the token
#: keys that verify its callers' bearer tokens.
GATEWAY_ENV = {
    "ENGRAM_NATS_URL",
    "ENGRAM_NATS_NKEY_SEED",
    "ENGRAM_HTTP_HOST",
    "ENGRAM_HTTP_PORT",
    "ENGRAM_TOKEN_KEYS",
}
#: What a deployment runs as its own processes: every service, and the HTTP gateway.
DEPLOYED = {*SERVICES, GATEWAY}
_REFERENCE = re.compile(r"\$\{([A-Z0-9_]+)(?:(:?[-?])([^}]*))?\}")


def deployment_env(tmp: Path) -> dict[str, str]:
    """``engram credentials deployment-env``'s output, as the README has operators make it."""
    out = tmp / ".env"
    result = CliRunner().invoke(app, ["credentials", "deployment-env", "--out", str(out)])
    assert result.exit_code == 0, result.output
    pairs = [line.split("=", 1) for line in out.read_text().splitlines() if line and not line.startswith("#")]
    return {k: v for k, v in pairs}


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``; a required variable the
    environment lacks is an error, as ``docker compose`` makes it."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        value = env.get(name)
        if op and op.endswith("?") and not value:
            raise AssertionError(f"${{{name}}} is required and the deployment env lacks it ({arg})")
        if value is None or (op == ":-" and not value):
            return arg if op and op.endswith("-") else ""
        return value

    return _REFERENCE.sub(one, text)


def referenced(text: str) -> set[str]:
    return {m.group(1) for m in _REFERENCE.finditer(text)}


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname, f"{url} names no host"
    assert parts.port, f"{url} names no port"
    return parts.hostname, parts.port
