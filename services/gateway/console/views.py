"""The console's pages. Each handler reads its form, calls one or two operations of the table with
the session's token (``calls.call``) and renders a template; errors are the service's own, shown on
the page. Sign-in and sign-out live in ``signin.py``."""

from __future__ import annotations

import json
import typing
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from contracts import operations as ops
from contracts.common import SYSTEM_ORG
from contracts.config import MemoryConfig
from contracts.errors import EngramError, InvalidRequest, Unauthenticated
from contracts.governance import LIFECYCLES
from contracts.json_rules import decode_json
from contracts.recall import Strategy
from services.gateway.bridge import Bridge
from services.gateway.console.calls import call
from services.gateway.console.sessions import ConsoleSession, SessionStore
from services.gateway.console.web import COOKIE, PREFIX, check_csrf, form_fields, render

__all__ = ["Views"]

Page = Callable[[Request, ConsoleSession], Awaitable[Response]]
MANAGE_OPS = ("pin", "unpin", "disable", "enable", "mark_incorrect")
_STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)
#: Audit records read per page (the operation filters by kind; actor and time are filtered here).
_AUDIT_PAGE = 500


def _blank_none(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


def _principal(ref: str | None) -> dict[str, Any] | None:
    """``end_user:alice`` → the request's ``principal`` (service tokens act on someone's behalf)."""
    if not ref:
        return None
    kind, _, ident = ref.partition(":")
    return {"kind": kind, "id": ident or None}


class _TokenRefused(Exception):
    """The services no longer accept the session's token (expired, or its key retired)."""


class Views:
    def __init__(self, bridge: Bridge, store: SessionStore) -> None:
        self._bridge = bridge
        self._store = store

    def page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` for a signed-in session; else the sign-in page. A token the services no
        longer accept (expired, revoked key) ends the session."""

        async def endpoint(request: Request) -> Response:
            session = self._store.get(request.cookies.get(COOKIE))
            if session is None:
                return RedirectResponse(f"{PREFIX}/signin", status_code=303)
            try:
                return await handler(request, session)
            except _TokenRefused:
                self._store.close(session.id)
                return RedirectResponse(f"{PREFIX}/signin?expired=1", status_code=303)
            except EngramError as exc:  # a refused form (CSRF) or a bad parameter
                return render("done.html", exc.status, session=session, error=exc)

        return endpoint

    async def _call(self, session: ConsoleSession, op: Any, fields: dict[str, Any]) -> Any:
        try:
            return await call(self._bridge, op, fields, session.authorization)
        except Unauthenticated as exc:  # past the handlers' own error display: the session ends
            raise _TokenRefused from exc

    async def _shown(
        self, session: ConsoleSession, op: Any, fields: dict[str, Any]
    ) -> tuple[Any, EngramError | None]:
        """The operation's reply, or the service's error for the page to show in its place."""
        try:
            return await self._call(session, op, fields), None
        except EngramError as exc:
            return None, exc

    # -- memories ---------------------------------------------------------------------------

    def _list_filters(self, request: Request) -> dict[str, Any]:
        q = request.query_params
        types = [t.strip() for t in (q.get("memory_type") or "").split(",") if t.strip()]
        return {
            "actor_ref": _blank_none(q.get("owner")),
            "lifecycle": [v for v in q.getlist("lifecycle") if v] or None,
            "layer": _blank_none(q.get("layer")),
            "memory_types": types or None,
            "min_importance": _blank_none(q.get("min_importance")),
            "session_id": _blank_none(q.get("session_id")),
        }

    async def memories(self, request: Request, session: ConsoleSession) -> Response:
        filters = self._list_filters(request)
        page, error = await self._shown(
            session,
            ops.MEMORY_LIST,
            {
                "agent_config_id": session.agent_config_id,
                **filters,
                "page_size": 50,
                "page_token": _blank_none(request.query_params.get("page_token")),
            },
        )
        return render(
            "memories.html",
            session=session,
            active="memories",
            page=page,
            error=error,
            q=request.query_params,
            lifecycles=LIFECYCLES,
            strategies=_STRATEGIES,
            next_query=self._next_query(request, page),
        )

    @staticmethod
    def _next_query(request: Request, page: Any) -> str | None:
        if page is None or not page.next_page_token:
            return None
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "page_token"]
        return urlencode([*params, ("page_token", page.next_page_token)])

    async def recall(self, request: Request, session: ConsoleSession) -> Response:
        q = request.query_params
        reply, error = await self._shown(
            session,
            ops.RECALL,
            {
                "agent_config_id": session.agent_config_id,
                "principal": _principal(_blank_none(q.get("as"))),
                "cue": _blank_none(q.get("cue")),
                "strategy": _blank_none(q.get("strategy")),
                "token_budget": _blank_none(q.get("token_budget")),
                "session_id": _blank_none(q.get("session_id")),
            },
        )
        return render(
            "recall.html",
            session=session,
            active="recall",
            reply=reply,
            error=error,
            q=q,
            strategies=_STRATEGIES,
        )

    async def entry(self, request: Request, session: ConsoleSession, **extra: Any) -> Response:
        entry_id = request.path_params["entry_id"]
        error = extra.pop("error", None)
        done = request.query_params.get("done")
        if done in (*MANAGE_OPS, "edit") and error is None:
            extra.setdefault("notice", f"Done: {done.replace('_', ' ')}")
        got, failed = await self._shown(
            session,
            ops.MEMORY_GET,
            {"agent_config_id": session.agent_config_id, "entry_id": entry_id, "history": True},
        )
        error = error or failed
        return render(
            "entry.html",
            status_code=error.status if error is not None and got is None else 200,
            session=session,
            active="memories",
            got=got,
            error=error,
            manage_ops=MANAGE_OPS,
            metadata=json.dumps(got.entry.metadata, indent=2, ensure_ascii=False) if got else "",
            **extra,
        )

    async def manage(self, request: Request, session: ConsoleSession) -> Response:
        form = await form_fields(request)
        check_csrf(request, form.get("csrf"), session.csrf)
        entry_id = request.path_params["entry_id"]
        op = form.get("op") or ""
        fields: dict[str, Any] = {"agent_config_id": session.agent_config_id, "entry_id": entry_id, "op": op}
        if op == "edit":
            fields["text"] = form.get("text")
        try:
            reply = await self._call(session, ops.MEMORY_MANAGE, fields)
        except EngramError as exc:
            return await self.entry(request, session, error=exc)
        if reply.entry is None:  # mark_incorrect took it below the reliability floor: deleted
            return render(
                "done.html",
                session=session,
                active="memories",
                notice=f"{op}: the entry fell below the reliability floor and was deleted",
            )
        # An edit may make a new version (per type policy): show the entry as it is now.
        return RedirectResponse(f"{PREFIX}/memories/{reply.entry.id}?done={op}", status_code=303)

    async def delete(self, request: Request, session: ConsoleSession) -> Response:
        form = await form_fields(request)
        check_csrf(request, form.get("csrf"), session.csrf)
        try:
            receipt = await self._call(
                session,
                ops.MEMORY_DELETE,
                {"agent_config_id": session.agent_config_id, "entry_id": request.path_params["entry_id"]},
            )
        except EngramError as exc:
            return await self.entry(request, session, error=exc)
        return render(
            "receipt.html", session=session, active="memories", receipt=receipt, what="Deleted entry"
        )

    # -- purge ------------------------------------------------------------------------------

    async def purge_form(self, request: Request, session: ConsoleSession) -> Response:
        return render("purge.html", session=session, active="purge", q=request.query_params)

    async def purge(self, request: Request, session: ConsoleSession) -> Response:
        form = await form_fields(request)
        check_csrf(request, form.get("csrf"), session.csrf)
        owner = form.get("owner") or ""
        session_id = _blank_none(form.get("session_id"))
        expected = owner if session_id is None else f"{owner}/{session_id}"
        try:
            if not owner or form.get("confirm") != expected:
                raise InvalidRequest(f"type {expected or 'the owner'} exactly to confirm the purge")
            everywhere = form.get("scope") == "all"
            receipt = await self._call(
                session,
                ops.MEMORY_PURGE,
                {
                    "agent_config_id": None if everywhere else session.agent_config_id,
                    "actor_ref": owner,
                    "session_id": session_id,
                },
            )
        except EngramError as exc:
            return render("purge.html", exc.status, session=session, active="purge", q=form, error=exc)
        return render("receipt.html", session=session, active="purge", receipt=receipt, what="Purged")

    # -- audit ------------------------------------------------------------------------------

    async def audit(self, request: Request, session: ConsoleSession) -> Response:
        q = request.query_params
        # "actor": who acted, or whose memory was acted on (a purge's actor_scope).
        kind, actor = _blank_none(q.get("kind")), _blank_none(q.get("actor"))
        error: EngramError | None = None
        records: list[dict[str, Any]] = []
        verify = None
        try:
            since = _time(q.get("since"))
            until = _time(q.get("until"))
            reply = await self._call(
                session,
                ops.AUDIT_QUERY,
                {"kind": kind, "after_seq": _blank_none(q.get("after_seq")) or 0, "limit": _AUDIT_PAGE},
            )
            records = [
                r
                for r in reply.records
                if (
                    actor is None
                    or actor in (r.get("actor_ref"), (r.get("details") or {}).get("actor_scope"))
                )
                and (since is None or _time(r.get("occurred_at")) >= since)  # type: ignore[operator]
                and (until is None or _time(r.get("occurred_at")) <= until)  # type: ignore[operator]
            ]
            records.reverse()  # newest first
            verify = await self._call(session, ops.AUDIT_VERIFY, {})
            next_after = reply.next_after_seq
        except EngramError as exc:
            error, next_after = exc, None
        return render(
            "audit.html",
            session=session,
            active="audit",
            records=records,
            verify=verify,
            error=error,
            q=q,
            next_after=next_after,
        )

    # -- config -----------------------------------------------------------------------------

    async def config(self, request: Request, session: ConsoleSession, **extra: Any) -> Response:
        error = extra.pop("error", None)
        reply, failed = await self._shown(
            session, ops.CONFIG_GET, {"agent_config_id": session.agent_config_id}
        )
        error = error or failed
        return render(
            "config.html",
            session=session,
            active="config",
            fields=_config_fields(reply.config.model_dump(mode="json")) if reply else [],
            version=reply.version if reply else None,
            error=error,
            **extra,
        )

    async def config_put(self, request: Request, session: ConsoleSession) -> Response:
        form = await form_fields(request)
        check_csrf(request, form.get("csrf"), session.csrf)
        config: dict[str, Any] = {}
        try:
            for name, field in MemoryConfig.model_fields.items():
                raw = form.get(name)
                if raw is None:
                    continue
                if field.annotation is bool:
                    config[name] = raw == "true"
                elif field.annotation is int or field.annotation is float:
                    # A number box sends text; the operation takes JSON numbers only (strict).
                    config[name] = _number(name, raw, int if field.annotation is int else float)
                elif _choices(field.annotation) or field.annotation is str:
                    config[name] = raw
                else:
                    try:
                        config[name] = decode_json(raw)
                    except InvalidRequest as exc:
                        raise InvalidRequest(f"{name}: {exc.message}", exc.details) from exc
            await self._call(
                session, ops.CONFIG_PUT, {"agent_config_id": session.agent_config_id, "config": config}
            )
        except EngramError as exc:
            return await self.config(request, session, error=exc)
        return await self.config(request, session, notice="Saved: a new config version")

    # -- what no operation exposes ----------------------------------------------------------

    async def dead_letters(self, request: Request, session: ConsoleSession) -> Response:
        """The dead letters the token may see (newest first, by source: its organization's, or every
        one for the deployment's operator) and the pipeline's lag (the operator's); each shows the
        service's error on its own if the token may not read it."""
        q = request.query_params
        letters, error = await self._shown(
            session,
            ops.OPS_DEAD_LETTERS,
            {"source": _blank_none(q.get("source")), "before_seq": _blank_none(q.get("before_seq"))},
        )
        lag, lag_error = await self._shown(session, ops.OPS_LAG, {})
        return render(
            "dead_letters.html",
            session=session,
            active="dead_letters",
            letters=letters,
            lag=lag,
            error=error,
            lag_error=lag_error,
            q=q,
            system_org=str(SYSTEM_ORG),
        )


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise InvalidRequest(f"not a date and time: {str(value)[:40]!r}") from exc
    return parsed if parsed.tzinfo else parsed.astimezone()


def _number(name: str, raw: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(raw.strip())
    except ValueError as exc:
        raise InvalidRequest(f"{name}: not a number", {"loc": [name]}) from exc


def _choices(annotation: Any) -> tuple[str, ...]:
    return tuple(typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Literal else ()


def _config_fields(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The config as form fields: a select for a choice or a flag, a number box for a number, a
    JSON box for a nested section."""
    fields = []
    for name, field in MemoryConfig.model_fields.items():
        value = config.get(name)
        choices = _choices(field.annotation)
        if field.annotation is bool:
            widget, shown, choices = "select", "true" if value else "false", ("true", "false")
        elif choices:
            widget, shown = "select", str(value)
        elif field.annotation in (int, float):
            widget, shown = "number", str(value)
        else:
            widget, shown = "json", json.dumps(value, indent=2)
        fields.append(
            {"name": name, "widget": widget, "value": shown, "choices": choices, "help": field.description}
        )
    return fields
