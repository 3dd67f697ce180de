"""The layout is the architecture (STYLE 1, 17): services never import each other — what two of
them share lives in ``shared/`` or ``contracts/`` — and neither of those imports a service.
Read from the source's import statements (every one, also those inside functions)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

#: Composition roots: they assemble services into processes, so they import them. The modules
#: directly in ``services/`` (runtime, serve, reindex, asyncapi), the command line that starts
#: every process, and the gateway process, which hosts the MCP server's HTTP transport.
COMPOSITION_ROOTS = ("services/cli/", "services/gateway/server.py")


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute (``from services.x import y`` → ``services.x``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # ``from services import recall`` imports a service as well.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _service_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "services" or len(parts) < 2 or not (SERVICES / parts[1]).is_dir():
        return None
    return parts[1]


def _python_files(under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if ".venv" not in p.parts)


def test_services_never_import_each_other() -> None:
    crossings = []
    for path in _python_files(SERVICES):
        rel = path.relative_to(ROOT).as_posix()
        own = path.relative_to(SERVICES).parts[0]
        if len(path.relative_to(SERVICES).parts) == 1 or rel.startswith(COMPOSITION_ROOTS):
            continue  # a composition root (services/runtime.py, …)
        for module in _imported(path):
            other = _service_of(module)
            if other is not None and other != own:
                crossings.append(f"{rel} imports {module}")
    assert crossings == [], "services import each other; move what they share to shared/:\n" + "\n".join(
        crossings
    )


@pytest.mark.parametrize("layer", ["shared", "contracts"])
def test_shared_and_contracts_import_no_service(layer: str) -> None:
    offending = [
        f"{path.relative_to(ROOT).as_posix()} imports {module}"
        for path in _python_files(ROOT / layer)
        for module in _imported(path)
        if module == "services" or module.startswith("services.")
    ]
    assert offending == []


def test_contracts_stay_plain_wire_models() -> None:
    """``contracts/`` is what a platform installs to talk to Engram: nothing of the services' own
    infrastructure (``shared/``)."""
    offending = [
        f"{path.relative_to(ROOT).as_posix()} imports {module}"
        for path in _python_files(ROOT / "contracts")
        for module in _imported(path)
        if module == "shared" or module.startswith("shared.")
    ]
    assert offending == []


CLIENT = ROOT / "clients" / "python"
#: What the thin client may import besides the standard library: its declared dependencies.
CLIENT_DEPENDENCIES = {"engram_client", "nats", "nkeys", "httpx", "pydantic"}


def test_the_thin_client_imports_only_its_own_dependencies() -> None:
    """``clients/python`` (engram-client) is installed alone by agent runners: nothing of the
    server (``services``, ``shared``, ``contracts``), only the standard library and what its
    pyproject.toml declares."""
    declared = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {
        re.split(r"[<>=\[ ]", d)[0].replace("nats-py", "nats") for d in declared
    } == CLIENT_DEPENDENCIES - {"engram_client"}
    offending = [
        f"{path.relative_to(ROOT).as_posix()} imports {module}"
        for path in _python_files(CLIENT / "engram_client")
        for module in _imported(path)
        if module.split(".")[0] not in CLIENT_DEPENDENCIES | sys.stdlib_module_names
    ]
    assert offending == []


def test_the_scan_sees_a_crossing(tmp_path: Path) -> None:
    """The scan itself: a nested import of another service is found, an own one is not."""
    module = tmp_path / "m.py"
    module.write_text(
        "from services.recall.service import Recall\n"
        "def f():\n    import services.ingest.saves\n    from services import distill\n"
    )
    found = {m for m in _imported(module) if _service_of(m)}
    assert {_service_of(m) for m in found} == {"recall", "ingest", "distill"}
