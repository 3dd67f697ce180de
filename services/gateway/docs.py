"""The HTTP API documented where it is served: ``GET /openapi.json`` (the checked-in OpenAPI document,
``contracts/openapi.json``, as ``make schema`` writes it) and interactive documentation at ``/docs``
(Swagger UI, from the ``swagger-ui-bundle`` package's files: nothing from a CDN, so it works
offline). The page runs no inline script — its start-up is a file of its own — under a policy that
allows this origin only (docs/adr/0091-api-docs-served.md)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

__all__ = ["DOCS_PATH", "OPENAPI_FILE", "OPENAPI_PATH", "docs_routes"]

#: The checked-in document (``python -m services.gateway.openapi`` writes it; this module serves it).
OPENAPI_FILE = Path(__file__).resolve().parents[2] / "contracts" / "openapi.json"

OPENAPI_PATH = "/openapi.json"
DOCS_PATH = "/docs"

#: Swagger UI needs inline styles (it sets them from script) and data: images (its icons); nothing
#: else, and nothing from another origin.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
)
_HEADERS = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff"}

_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Engram HTTP API</title>
  <link rel="stylesheet" href="{docs}/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{docs}/assets/swagger-ui-bundle.js"></script>
<script src="{docs}/assets/swagger-ui-standalone-preset.js"></script>
<script src="{docs}/start.js"></script>
</body>
</html>
"""

# Relative URLs: the page works behind a proxy that serves the gateway under a prefix.
_START = """window.ui = SwaggerUIBundle({
  url: "../openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
  layout: "StandaloneLayout",
  validatorUrl: null
});
"""


@cache
def _document() -> bytes:
    return OPENAPI_FILE.read_bytes()


async def _openapi(request: Request) -> Response:
    return Response(_document(), media_type="application/json")


async def _page(request: Request) -> Response:
    return HTMLResponse(_PAGE.format(docs=DOCS_PATH), headers=_HEADERS)


async def _start(request: Request) -> Response:
    return Response(_START, media_type="text/javascript", headers=_HEADERS)


def docs_routes() -> list[BaseRoute]:
    return [
        Route(OPENAPI_PATH, _openapi, methods=["GET"]),
        Route(DOCS_PATH, _page, methods=["GET"]),
        Route(f"{DOCS_PATH}/start.js", _start, methods=["GET"]),
        Mount(f"{DOCS_PATH}/assets", StaticFiles(directory=swagger_ui_path), name="docs-assets"),
    ]
