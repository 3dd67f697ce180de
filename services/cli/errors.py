"""How the ``engram`` command reports a failure: ``CODE: message`` and the wire ``details`` on at
most two lines of stderr, exit status 1; the traceback only with ``engram --debug``.

Every command fails through here (``ErrorReportingGroup`` wraps the whole command tree), so a
wire error, a request the client refuses to send, an unreachable NATS and a bug all read the same
way. Usage mistakes stay click's (exit status 2, with the usage line)."""

from __future__ import annotations

import json
from typing import Any

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

__all__ = ["DEBUG_HELP", "ErrorReportingGroup", "describe"]

DEBUG_HELP = "Show the full traceback when a command fails."
_DETAILS_WIDTH = 200


def _details_line(details: dict[str, Any]) -> str:
    """The details in one line: validation errors as ``loc: a.b (why)``, anything else as k=v."""
    parts: list[str] = []
    for err in details.get("errors") or []:
        if isinstance(err, dict):
            parts.append(f"loc: {err.get('loc') or '(body)'} ({err.get('msg')})")
    parts.extend(
        f"{key}={json.dumps(value, default=str) if not isinstance(value, str) else value}"
        for key, value in details.items()
        if key != "errors"
    )
    line = "; ".join(parts)
    return line if len(line) <= _DETAILS_WIDTH else line[: _DETAILS_WIDTH - 1] + "…"


def describe(exc: BaseException) -> tuple[str, str]:
    """The first line (``CODE: message``) and the details line ('' when there are none)."""
    # Imported on the way out only: a command that succeeds never pays for them.
    from engram_client.contracts.errors import EngramError, validation_details
    from nats.errors import Error as NatsError
    from nats.errors import NoRespondersError, NoServersError
    from nats.errors import TimeoutError as NatsTimeout
    from pydantic import ValidationError

    if isinstance(exc, EngramError):
        return f"{exc.code.value}: {exc.message}", _details_line(exc.details)
    if isinstance(exc, ValidationError):  # refused by the client before it was sent
        return f"INVALID_REQUEST: invalid {exc.title}", _details_line(validation_details(exc))
    if isinstance(exc, NoServersError | ConnectionRefusedError):
        return "UNAVAILABLE: cannot reach NATS (is `engram up` running? see --nats-url)", ""
    if isinstance(exc, NoRespondersError):
        return "UNAVAILABLE: no service answers this request (is every service running?)", ""
    if isinstance(exc, NatsTimeout | TimeoutError):
        return "UNAVAILABLE: no reply in time (the services may be busy or stopped)", ""
    if isinstance(exc, NatsError | OSError):
        return f"UNAVAILABLE: {type(exc).__name__}: {exc}", ""
    return f"INTERNAL: {type(exc).__name__}: {exc}", "run again with `engram --debug …` for the traceback"


class ErrorReportingGroup(TyperGroup):
    """The root command group: turns any exception a command raises into the two-line report."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (TyperException, typer.Exit, typer.Abort):  # usage errors, exits: click's own way
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            first, details = describe(exc)
            typer.echo(first, err=True)
            if details:
                typer.echo(f"  {details}", err=True)
            raise typer.Exit(1) from None
