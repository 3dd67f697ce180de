"""How the ``engram`` command prints replies (kept apart from argument parsing), and ``console``:
rich's console for stdout, made when a command first prints with it (importing rich costs a
command that prints nothing with it, ``engram --help`` included, time it need not spend)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from engram_client.contracts.recall import RecallReply
    from rich.console import Console

__all__ = ["console", "print_recall"]

#: Formats whose results carry only id, text and score (and type, for compact): what the caller
#: wants from them is the rendered context, so that is what is printed.
_CONTEXT_FORMATS = {"compact", "narrative"}


class _FirstUse:
    """Stands in for a ``Console`` until an attribute is asked for; then it is the console."""

    _console: Console | None = None

    def _real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console()
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    # Dunders are looked up on the type, not through __getattr__: rich's live displays (Progress)
    # enter the console as a context manager.
    def __enter__(self) -> Console:
        return self._real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._real().__exit__(*exc)


console = cast("Console", _FirstUse())


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_recall(console: Console, reply: RecallReply, fmt: str) -> None:
    """A recall reply: its summary line, then a table (text, full) or the context block."""
    from rich.table import Table
    from rich.text import Text

    title = f"{reply.strategy}: {reply.count} of {reply.matched_count} matches, {reply.tokens_used} tokens"
    if fmt in _CONTEXT_FORMATS:
        console.print(f"[bold]{title}[/]", highlight=False)
        console.print(reply.context, markup=False, highlight=False, soft_wrap=True)
    else:
        table = Table(title=title, expand=True)
        table.add_column("score", no_wrap=True)
        table.add_column("type", no_wrap=True)
        table.add_column("imp", no_wrap=True)
        table.add_column("memory", ratio=1, overflow="fold")
        for r in reply.results:
            row = (_number(r.score, ".3f"), r.memory_type or "-", _number(r.importance, ".2f"))
            table.add_row(*row, Text(r.text))  # memory text is data, never rich markup
        console.print(table)
    if reply.warnings:
        console.print(f"[yellow]warnings:[/] {', '.join(reply.warnings)}", highlight=False)
