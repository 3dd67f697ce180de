"""What the README and the decision records state as fact agrees with the code: the settings'
defaults they quote, the configuration reference and the README's settings table (generated from
the settings class), every ``ENGRAM_*`` variable they or the code name, the lifetime of a minted
token, and no passage said twice (a stale copy left by an edit)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from typer.main import get_command

from contracts.operations import JETSTREAMS as STREAMS
from services import config_reference
from services.cli.main import app
from shared.runtime.settings import EngramSettings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RECORDS = ROOT / "docs" / "adr"
#: A setting's name with its value right after it: "`ENGRAM_ACK_WAIT_S` (default 5: …)",
#: "(`ENGRAM_PAGE_TOKEN_TTL_S`, 1 h)", "`ENGRAM_RESULT_CACHE_S` = 30 s" — a bare number, or one with
#: a unit of time, is the setting's default.
_QUOTED_DEFAULT = re.compile(
    r"`ENGRAM_([A-Z0-9_]+)`(?: \(|, | = )(?:default )?(-?\d+(?:\.\d+)?)"
    r"(?: ?(s|h|days?)(?=[\s:;,).])|(?=[:;,)]))"
)
_UNIT_S = {None: 1, "": 1, "s": 1, "h": 3600, "day": 86400, "days": 86400}
#: An ``ENGRAM_*`` variable named in code or docs (``ENGRAM_NATS_NKEY_<USER>`` stops at the ``<``).
_VARIABLE = re.compile(r"\bENGRAM_[A-Z0-9_]*[A-Z0-9]\b")
#: Read by the test suite only (its own servers and data), not a deployment's configuration.
_TEST_ONLY = ("ENGRAM_TEST_", "ENGRAM_EVAL_", "ENGRAM_SECURITY_", "ENGRAM_CRASH_", "ENGRAM_CLUSTER_")


def _prose() -> str:
    """The README without its code blocks, lines joined (sentences wrap across lines)."""
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.DOTALL)
    return re.sub(r"\s+", " ", text)


#: Words in a row that make a passage (shorter runs repeat legitimately: command examples).
_RUN = 12


def _quoted_defaults() -> list[tuple[str, str, str, str]]:
    """``(file, setting, value, unit)`` for each default quoted in the README's prose and the records."""
    texts = {"README.md": _prose()}
    texts |= {f"docs/adr/{p.name}": re.sub(r"\s+", " ", p.read_text()) for p in sorted(RECORDS.glob("*.md"))}
    return [(name, *match) for name, text in texts.items() for match in _QUOTED_DEFAULT.findall(text)]


def test_quoted_setting_defaults_are_the_settings_defaults() -> None:
    """Every default the README or a decision record quotes for an ENGRAM_* setting is that
    setting's default (a record once said 10 s for ``ENGRAM_ACK_WAIT_S`` where the code said 5)."""
    quoted = _quoted_defaults()
    # The check would otherwise hold vacuously.
    assert ("docs/adr/0006-ack-wait-and-heartbeats.md", "ACK_WAIT_S", "5", "s") in quoted, quoted
    fields = EngramSettings.model_fields
    wrong = {
        f"{where}: ENGRAM_{name}": (f"{value} {unit}".strip(), fields[name.lower()].default)
        for where, name, value, unit in quoted
        if name.lower() not in fields or float(value) * _UNIT_S[unit] != float(fields[name.lower()].default)
    }
    assert wrong == {}, "quoted default: (quoted, actual)"


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    """docs/configuration.md is what ``python -m services.config_reference`` writes: every setting
    with its variable, default, bounds and description, the client variables and the deployment keys."""
    expected = config_reference.build_reference()
    assert config_reference.CONFIG_FILE.read_text(encoding="utf-8") == expected, (
        "run `python -m services.config_reference` (make schema)"
    )
    for name, field in EngramSettings.model_fields.items():
        assert f"| `{EngramSettings.variable(name)}` |" in expected, name
        assert field.description, f"EngramSettings.{name} has no description"


def test_the_readme_settings_table_is_generated_from_the_settings() -> None:
    """The README's settings table is the generated one: defaults and meanings cannot drift."""
    readme = README.read_text(encoding="utf-8")
    assert config_reference.readme_with_table(readme) == readme, (
        "run `python -m services.config_reference` (make schema)"
    )
    assert "| `ENGRAM_ACK_WAIT_S` | `5` |" in readme


def _named_variables() -> dict[str, set[str]]:
    """Every ENGRAM_* variable named in the production code, the README, the deployment files and
    the docs, with where."""
    places = [README, *(ROOT / "infra").rglob("*"), *(ROOT / "docs").rglob("*.md")]
    places += [p for top in ("contracts", "shared", "services") for p in (ROOT / top).rglob("*.py")]
    named: dict[str, set[str]] = {}
    for path in places:
        if path.is_file() and path.suffix not in {".png", ".tgz"}:
            for name in _VARIABLE.findall(path.read_text(encoding="utf-8", errors="replace")):
                named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return named


def test_every_named_variable_is_in_the_configuration_reference() -> None:
    """An ENGRAM_* variable that code or docs name is one the configuration reference documents (or
    a stream's name): no message tells an operator to set a variable nothing reads."""
    documented = set(_VARIABLE.findall(config_reference.CONFIG_FILE.read_text(encoding="utf-8")))
    streams = {stream.name for stream in STREAMS}
    unknown = {
        name: sorted(where)
        for name, where in _named_variables().items()
        if name not in documented | streams and not name.startswith(_TEST_ONLY)
    }
    assert unknown == {}


def test_the_mcp_recipe_states_the_minted_tokens_lifetime() -> None:
    """The README says a token from `engram token mint` expires after an hour (its default --ttl)
    and how to mint a longer one."""
    mint = get_command(app).commands["token"].commands["mint"]  # type: ignore[attr-defined]
    (ttl,) = [p for p in mint.params if p.name == "ttl"]
    assert ttl.default == 3600
    prose = _prose()
    assert "the token expires after an hour" in prose
    assert "`--ttl` sets its lifetime in seconds" in prose


def test_no_passage_is_said_twice() -> None:
    """No run of twelve words of the README's prose appears twice: two copies of a passage drift,
    and one goes stale (an edit once left a paragraph's old copy under its new one)."""
    words = _prose().split()
    runs = Counter(tuple(words[i : i + _RUN]) for i in range(len(words) - _RUN + 1))
    assert [" ".join(run) for run, count in runs.items() if count > 1] == []
