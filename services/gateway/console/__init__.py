"""The web console, served by the gateway under ``/console``: server-rendered pages over the same
operations as every other interface, under the signed-in user's own token."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.bridge import Bridge
from services.gateway.console.sessions import SessionStore
from services.gateway.console.signin import SignIn
from services.gateway.console.views import Views
from services.gateway.console.web import PREFIX, SECURITY_HEADERS
from shared.security.auth import TokenVerifier

__all__ = ["PREFIX", "console_mount"]


class _SecureHeaders:
    """The security headers (CSP, nosniff, no-store, ...) on every console response."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        await self._app(scope, receive, send_with_headers)


def console_mount(bridge: Bridge, tokens: TokenVerifier, store: SessionStore | None = None) -> Mount:
    store = store or SessionStore()
    views, signin = Views(bridge, store), SignIn(bridge, store, tokens)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/memories", status_code=303)

    page = views.page
    app = Starlette(
        routes=[
            Route("/", home),
            Route("/signin", signin.form, methods=["GET"]),
            Route("/signin", signin.submit, methods=["POST"]),
            Route("/signin/code", signin.redeem, methods=["GET"]),
            Route("/signout", signin.signout, methods=["POST"]),
            Route("/tickets", signin.ticket, methods=["POST"]),
            Route("/memories", page(views.memories), methods=["GET"]),
            Route("/memories/{entry_id}", page(views.entry), methods=["GET"]),
            Route("/memories/{entry_id}/manage", page(views.manage), methods=["POST"]),
            Route("/memories/{entry_id}/delete", page(views.delete), methods=["POST"]),
            Route("/recall", page(views.recall), methods=["GET"]),
            Route("/purge", page(views.purge_form), methods=["GET"]),
            Route("/purge", page(views.purge), methods=["POST"]),
            Route("/audit", page(views.audit), methods=["GET"]),
            Route("/config", page(views.config), methods=["GET"]),
            Route("/config", page(views.config_put), methods=["POST"]),
            Route("/dead-letters", page(views.dead_letters), methods=["GET"]),
            Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"),
        ],
    )
    return Mount(PREFIX, app=_SecureHeaders(app))
