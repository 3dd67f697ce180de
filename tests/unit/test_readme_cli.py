"""Every ``engram`` command line in the README names a command that exists, with options it takes
(the commands that need a running stack run in tests/e2e and tests/integration/test_cli.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from services.cli.main import app

README = Path(__file__).resolve().parents[2] / "README.md"


def _command_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL):
        for line in block.splitlines():
            if line.startswith(".venv/bin/engram "):
                lines.append(line.split("#", 1)[0].strip())
    inline = re.findall(r"`(?:\.venv/bin/)?(engram [^`]+)`", README.read_text())
    return lines + [f".venv/bin/{cmd}" for cmd in inline if "…" not in cmd and "<" not in cmd]


@pytest.mark.parametrize("line", _command_lines())
def test_readme_engram_command_exists_with_its_options(line: str) -> None:
    # "a | b" alternatives in the README: check each.
    for variant in line.removeprefix(".venv/bin/").split(" | "):
        words = shlex.split(variant.replace("[", " ").replace("]", " "))
        if words[0] == "engram":
            words = words[1:]
        command = get_command(app)
        for word in words:
            sub = (
                getattr(command, "commands", {}).get(word.split("|")[0]) if not word.startswith("-") else None
            )
            if sub is None:
                break
            command = sub
        assert not isinstance(command, typer.core.TyperGroup), f"{variant!r} names no command"
        accepted = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        accepted |= {"--help", "--debug"}
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in accepted, f"{variant!r}: {word} is not an option of it"
