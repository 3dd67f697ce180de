"""What every console response shares: templates that escape everything, the security headers
(a strict Content-Security-Policy: no inline script, nothing from another origin), the session
cookie and the CSRF check on every form that changes something."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from contracts.errors import Forbidden, InvalidRequest
from services.gateway.payloads import read_limited

__all__ = [
    "COOKIE",
    "PREFIX",
    "PRE_COOKIE",
    "SECURITY_HEADERS",
    "check_csrf",
    "form_fields",
    "render",
    "set_cookie",
]

PREFIX = "/console"
#: The session id (HttpOnly, SameSite=Strict, path /console).
COOKIE = "engram_console"
#: The largest form the console takes (an edited memory is at most 8,000 characters).
MAX_FORM_BYTES = 64 * 1024
#: Before sign-in there is no session: the sign-in form is protected by a double-submit token.
PRE_COOKIE = "engram_console_signin"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: under it Chromium sends "Origin: null" on our own forms, and the origin
    # check below could no longer tell them from a sandboxed attacker's.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

# autoescape=True for every template, whatever its name: memory text is hostile input.
_env = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("session", None)
    context.setdefault("error", None)
    context.setdefault("notice", None)
    context.setdefault("active", "")
    html = _env.get_template(name).render(prefix=PREFIX, **context)
    return HTMLResponse(html, status_code=status_code)


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _same_origin(request: Request) -> bool:
    """A browser names the page a form came from (Origin, else Referer); it must be this host.
    Neither header (a non-browser client) leaves the token check alone to decide."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return source is None
    return urlsplit(source).netloc == request.headers.get("host", "")


def check_csrf(request: Request, form_token: str | None, expected: str | None) -> None:
    """Refuse a mutating request whose form token does not match (synchronizer token of the session,
    or the sign-in cookie's double-submit value) or that comes from another origin."""
    if not expected or not form_token or not secrets.compare_digest(form_token, expected):
        raise Forbidden("the form expired or did not come from this console; reload and try again")
    if not _same_origin(request):
        raise Forbidden("cross-origin form submission refused")


async def form_fields(request: Request) -> dict[str, str]:
    """A posted form's fields (the last value of a repeated one). Read here, bounded, rather than by
    Starlette's ``request.form()``: that reads a url-encoded body whole, however large, and needs
    python-multipart, while every console form is a small url-encoded one."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise InvalidRequest("send the form url-encoded")
    body = await read_limited(request.stream(), request.headers.get("content-length"), MAX_FORM_BYTES)
    try:
        return dict(
            parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=100, strict_parsing=False)
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest("the form could not be read") from exc
