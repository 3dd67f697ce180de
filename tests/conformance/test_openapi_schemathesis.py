"""Schemathesis — a conformance suite written by others — against a live gateway and the OpenAPI
document it serves (``contracts/openapi.json``): every operation, all of Schemathesis's checks,
its examples, coverage and fuzzing phases, bounded per operation. Three callers: a service token
of the organization, no token at all, and another organization's token. 0 failures each
(docs/adr/0096-request-bounds.md; docs/adr/0097-schemathesis-conformance.md says which checks
run and why each setting is what it is).

Schemathesis runs as its own process (its CLI, as a CI job would run it): the gateway lives on
this test's event loop, so a synchronous client in the same thread would wait on itself."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from uuid import uuid4

import pytest

from contracts.common import Principal
from services.gateway.openapi import OPENAPI_FILE
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TENANT_ADMIN, TokenService

pytestmark = pytest.mark.integration

#: Test cases per operation in the fuzzing phase (the coverage phase's deterministic cases come on
#: top); CONFORMANCE_EXAMPLES raises it for a longer local run.
MAX_EXAMPLES = int(os.environ.get("CONFORMANCE_EXAMPLES", "5"))
#: One seed per run, printed, so a failure found in CI replays with the same cases.
SEED = int(os.environ.get("CONFORMANCE_SEED", "20261203"))
_ST = Path(sys.executable).with_name("st")
_ROOT = Path(__file__).resolve().parents[2]
_HOOKS = "tests.conformance.schemathesis_hooks"
_CONFIG = Path(__file__).with_name("schemathesis.toml")
_WAIT_S = 60.0


@pytest.fixture(scope="module")
def settings(settings: EngramSettings) -> EngramSettings:
    """The gateway waits for a reply as long as Schemathesis waits for the gateway: on a loaded
    machine a save with ``wait`` may take longer than the default 10 s, and a 503 for that would
    be the machine's speed, not a conformance failure."""
    return settings.model_copy(update={"http_request_timeout_s": _WAIT_S})


async def _schemathesis(
    gateway: str, tmp: Path, phases: str, *headers: str, only: str | None = None
) -> tuple[int, str]:
    """Run ``st run`` against ``gateway`` (``only``: the paths matching this regex); its exit
    status and its report."""
    args = [
        "--config-file",
        str(_CONFIG),
        "run",
        str(OPENAPI_FILE),
        "--url",
        gateway,
        "--checks",
        "all",
        "--phases",
        phases,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        str(_WAIT_S * 2),
        # A bound, not a speed claim: how fast a loaded CI machine answers is no conformance.
        "--max-response-time",
        str(_WAIT_S * 2),
        # U+0000 is refused in all text (docs/adr/0014-text-no-store-can-keep.md), which the
        # document does not repeat on every string; NUL is tested by the hostile-text tests.
        "--generation-allow-x00",
        "false",
        "--generation-database",
        "none",
        # A stream that ends only when the token expires (docs/adr/0102-tenant-feeds.md): its
        # refusals and its events are tested in tests/integration/test_tenant_feeds.py.
        "--exclude-path",
        "/v1/events",
        "--no-color",
        "--report-dir",
        str(tmp),
    ]
    for header in headers:
        args += ["--header", header]
    if only is not None:
        args += ["--include-path-regex", only]
    process = await asyncio.create_subprocess_exec(
        str(_ST),
        *args,
        cwd=tmp,
        env={**os.environ, "SCHEMATHESIS_HOOKS": _HOOKS, "PYTHONPATH": str(_ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode(errors="replace")


def _token(tokens: TokenService, permissions: frozenset[str] | set[str] = ALL_PERMISSIONS) -> str:
    return tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="runner"), permissions=permissions
    )


#: The coverage phase (every boundary and every rule of the document, deterministically) takes
#: minutes on a loaded machine; it runs for the callers whose requests reach the services' rules
#: with a token of their own organization and without a token (answered at the gateway), and
#: fuzzing runs for all three.
_PHASES = {
    "service token": "examples,coverage,fuzzing",
    "no token": "examples,coverage,fuzzing",
    "another organization's token": "examples,fuzzing",
    # The admin routes, with a token that may use them (the others answer it 403 anyway).
    "the operator's token": "examples,coverage,fuzzing",
}


@pytest.mark.parametrize("caller", list(_PHASES))
async def test_schemathesis_finds_nothing(
    gateway: str, tokens: TokenService, service_token: str, caller: str, tmp_path: Path
) -> None:
    """All checks, every operation, 0 failures: for the organization's own service token, for a
    caller without a token (every operation 401, the envelope as documented), and for another
    organization's token (whatever ids the run makes up are never the first organization's)."""
    headers = {
        "service token": [f"Authorization: Bearer {service_token}"],
        "no token": [],
        "another organization's token": [f"Authorization: Bearer {_token(tokens)}"],
        "the operator's token": [f"Authorization: Bearer {_token(tokens, {TENANT_ADMIN})}"],
    }[caller]
    only = "^/v1/admin/" if caller == "the operator's token" else None
    status, report = await _schemathesis(gateway, tmp_path, _PHASES[caller], *headers, only=only)
    # Its failures, each line cut short (a generated body can be megabytes).
    failures = "\n".join(line[:300] for line in report[report.find("FAILURES") :].splitlines())
    assert status == 0, f"Schemathesis (seed {SEED}) as {caller}:\n{failures[:30_000]}"
