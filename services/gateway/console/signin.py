"""Signing in and out: a pasted bearer token, or a one-time code from ``engram console``.

A token is tried once against the services (one ``memory.list``) before a session is opened, so a
mistyped or expired token is refused at the form, not on the next page. After sign-in the browser
holds only a session id; the token never appears in a URL or a page."""

from __future__ import annotations

import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from contracts import operations as ops
from contracts.errors import EngramError, InvalidRequest, Unauthenticated
from services.gateway.bridge import Bridge
from services.gateway.console.calls import call
from services.gateway.console.sessions import ABSOLUTE_S, CODE_S, SessionStore, TokenClaims
from services.gateway.console.web import (
    COOKIE,
    PRE_COOKIE,
    PREFIX,
    check_csrf,
    form_fields,
    render,
    set_cookie,
)
from services.gateway.payloads import decode_object, read_limited
from shared.security.auth import TokenVerifier

__all__ = ["SignIn"]

_MAX_TICKET_BYTES = 4096


class SignIn:
    def __init__(self, bridge: Bridge, store: SessionStore, tokens: TokenVerifier) -> None:
        self._bridge = bridge
        self._store = store
        self._tokens = tokens

    async def form(self, request: Request, error: EngramError | None = None, status: int = 200) -> Response:
        """The sign-in form with a fresh double-submit token (cookie + hidden field)."""
        token = secrets.token_urlsafe(32)
        notice = "Your session expired; sign in again." if request.query_params.get("expired") else None
        response = render("signin.html", status, csrf=token, error=error, notice=notice)
        set_cookie(request, response, PRE_COOKIE, token, max_age=3600)
        return response

    async def submit(self, request: Request) -> Response:
        try:
            form = await form_fields(request)
            check_csrf(request, form.get("csrf"), request.cookies.get(PRE_COOKIE))
            token = (form.get("token") or "").strip().removeprefix("Bearer ").strip()
            return await self._open(request, token, form.get("agent_config_id"))
        except EngramError as exc:
            return await self.form(request, exc, exc.status)

    async def redeem(self, request: Request) -> Response:
        """``GET /console/signin/code?code=…`` (the link ``engram console`` prints): the code is
        good once; the answer redirects to a URL without it."""
        redeemed = self._store.redeem_code(request.query_params.get("code", ""))
        if redeemed is None:
            error = Unauthenticated(
                "this sign-in link was used already or has expired; run `engram console` again"
            )
            return await self.form(request, error, 401)
        try:
            return await self._open(request, *redeemed)
        except EngramError as exc:
            return await self.form(request, exc, exc.status)

    async def ticket(self, request: Request) -> Response:
        """``POST /console/tickets`` with ``Authorization: Bearer <token>``: a one-time sign-in code
        for that token (what ``engram console`` asks for). Holding the token already, the caller
        gains nothing it did not have; the code only keeps the token out of the browser's URL."""
        value = request.headers.get("authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer":
            return _json_error(Unauthenticated("send Authorization: Bearer <token>"))
        try:
            await self._tokens.verify(token.strip())
        except Unauthenticated as exc:
            return _json_error(exc)
        try:
            body = await read_limited(
                request.stream(), request.headers.get("content-length"), _MAX_TICKET_BYTES
            )
            fields: dict[str, Any] = decode_object(body) if body.strip() else {}
        except EngramError as exc:
            return _json_error(exc)
        agent = fields.get("agent_config_id")
        code = self._store.issue_code(token.strip(), str(agent) if agent else None)
        return JSONResponse(
            {"code": code, "expires_in": CODE_S, "path": f"{PREFIX}/signin/code?code={code}"},
            headers={"Cache-Control": "no-store"},
        )

    async def signout(self, request: Request) -> Response:
        session = self._store.get(request.cookies.get(COOKIE))
        if session is not None:
            form = await form_fields(request)
            check_csrf(request, form.get("csrf"), session.csrf)
            self._store.close(session.id)
        response = RedirectResponse(f"{PREFIX}/signin", status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    async def _open(self, request: Request, token: str, agent_config_id: str | None) -> Response:
        # The verified credential labels the session (an IdP's token as well as Engram's own); a
        # forged or expired token is refused here, at the form.
        try:
            claims = TokenClaims.of(*await self._tokens.check(token))
        except Unauthenticated as exc:
            raise Unauthenticated(
                f"not an Engram token, nor one from an identity provider it trusts ({exc.message})"
            ) from exc
        agent = (agent_config_id or "").strip() or claims.agent_config_id
        if not agent:
            raise InvalidRequest("this token names no agent config: give its id")
        try:  # one read under the token: the services decide whether it is good
            await call(
                self._bridge, ops.MEMORY_LIST, {"agent_config_id": agent, "page_size": 1}, f"Bearer {token}"
            )
        except Unauthenticated as exc:
            raise Unauthenticated(
                "the services refused this token (expired, revoked or not signed by them)"
            ) from exc
        except InvalidRequest:
            raise
        except EngramError:
            pass  # e.g. no memory.read: still a valid token; its pages will say what it may not do
        session = self._store.open(token, claims, agent)
        response = RedirectResponse(f"{PREFIX}/memories", status_code=303)
        set_cookie(request, response, COOKIE, session.id, max_age=ABSOLUTE_S)
        response.delete_cookie(PRE_COOKIE, path=PREFIX)
        return response


def _json_error(exc: EngramError) -> Response:
    envelope = exc.to_wire()
    return JSONResponse(envelope, status_code=int(envelope["error"]["status"]))
