"""What the README states as fact agrees with the code: the settings' defaults it quotes, the
lifetime it gives a minted token, and no passage said twice (a stale copy left by an edit)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from typer.main import get_command

from services.cli.main import app
from shared.settings import EngramSettings

README = Path(__file__).resolve().parents[2] / "README.md"
#: "`ENGRAM_ACK_WAIT_S` (default 5: …)" or "(5: …)": a number right after a setting's name is its default.
_QUOTED_DEFAULT = re.compile(r"`ENGRAM_([A-Z0-9_]+)` \((?:default )?(-?\d+(?:\.\d+)?)\s*[:;,)]")


def _prose() -> str:
    """The README without its code blocks, lines joined (sentences wrap across lines)."""
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.DOTALL)
    return re.sub(r"\s+", " ", text)


#: Words in a row that make a passage (shorter runs repeat legitimately: command examples).
_RUN = 12


def test_quoted_setting_defaults_are_the_settings_defaults() -> None:
    """Every default the README quotes for an ENGRAM_* setting is that setting's default."""
    quoted = _QUOTED_DEFAULT.findall(_prose())
    assert ("ACK_WAIT_S", "5") in quoted, quoted  # the check would otherwise hold vacuously
    fields = EngramSettings.model_fields
    wrong = {
        f"ENGRAM_{name}": (value, fields[name.lower()].default)
        for name, value in quoted
        if name.lower() not in fields or float(value) != float(fields[name.lower()].default)
    }
    assert wrong == {}, "README default: (quoted, actual)"


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
