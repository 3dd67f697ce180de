"""uvicorn's HTTP/1.1 protocol (httptools), refusing what its parser cannot read in the SPEC 9
envelope: a request line or header block past the parser's limit (a URL over ~64 KiB), or bytes
that are not HTTP. uvicorn answers those itself, before any application runs, with a plain-text
400; every other refusal of the gateway is the envelope, so these are too."""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from contracts.errors import InvalidRequest

__all__ = ["UNREADABLE_REQUEST", "EnvelopeHttpToolsProtocol"]

#: What the parser's refusals answer (one body for all of them: the parser does not say which
#: limit or rule a request broke).
UNREADABLE_REQUEST = InvalidRequest(
    "the request is not HTTP/1.1 the gateway can read: its request line or headers are malformed "
    "or longer than the parser allows (a URL over about 64 KiB)"
)


class EnvelopeHttpToolsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = json.dumps(UNREADABLE_REQUEST.to_wire()).encode()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
