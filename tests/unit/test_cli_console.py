"""The CLI's console is made on first use (start-up time); it must still serve everything rich's
own Console does for the commands, live displays included (``engram demo``, ``engram export``)."""

from __future__ import annotations

from rich.progress import Progress

from services.cli.output import console


def test_the_lazy_console_serves_a_live_display() -> None:
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("demo", total=2)
        progress.advance(task, 2)
    assert progress.finished
