"""A tiny real HTTP server speaking the OpenAI chat-completions and embeddings protocols, for tests.

It is a real socket on 127.0.0.1 (a random port), so adapters are tested through their real
HTTP client, timeouts and connection handling, not through a mock. It runs on the caller's
asyncio loop::

    async with FakeOpenAI(mode="ok", lessons=[{"text": "…", "importance": 0.7}]) as server:
        distiller = OpenAICompatDistiller(server.base_url, "fake-model")

Modes: ``ok`` (answers lessons), ``slow`` (waits ``delay_s``, then answers like ``ok``),
``fail`` (answers ``fail_status``, 500 by default), ``flaky`` (fails the first ``fail_first``
requests, then answers like ``ok``) and ``garbage`` (a valid completion whose content is not JSON).
``mode`` may be changed while the server runs. Every request is recorded in :attr:`requests`.

``/v1/embeddings`` answers every input with a vector of ``embedding_dimension`` floats, under the
same modes (``garbage`` answers a body without ``data``). The vectors are the hashing embedder's,
scaled to length 3 so that a client has to normalize them itself; ``shuffle_embeddings`` lists
the answer's items in a shuffled order (each still carrying its input's ``index``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

from shared.adapters.embedders.hashing import HashingEmbedder

__all__ = ["FakeOpenAI", "FakeOpenAIMode", "RecordedRequest"]

FakeOpenAIMode = Literal["ok", "slow", "fail", "flaky", "garbage"]
LessonItems = list[dict[str, Any]]
#: Lessons to answer: a fixed list, or a function of the request's JSON body.
LessonSource = LessonItems | Callable[[dict[str, Any]], LessonItems]

GARBAGE_CONTENT = "Sure! Here are some lessons: be careful, and good luck."
#: The length of the vectors ``/v1/embeddings`` answers (not 1: clients must normalize).
EMBEDDING_NORM = 3.0
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received, as it arrived."""

    method: str
    path: str
    headers: dict[str, str] = field(repr=False)
    body: bytes = field(repr=False)

    def json(self) -> Any:
        return json.loads(self.body)

    def message(self, role: str) -> str:
        """The content of the first chat message with ``role`` (``system`` or ``user``)."""
        for message in self.json().get("messages", []):
            if message.get("role") == role:
                return str(message.get("content", ""))
        raise LookupError(f"no {role!r} message in the request")


class FakeOpenAI:
    """OpenAI-compatible ``/v1/chat/completions`` and ``/v1/embeddings`` endpoints with scriptable
    failures."""

    def __init__(
        self,
        mode: FakeOpenAIMode = "ok",
        *,
        lessons: LessonSource | None = None,
        content: str | None = None,
        delay_s: float = 1.0,
        fail_first: int = 1,
        fail_status: int = 500,
        model: str = "fake-model",
        embedding_dimension: int = 8,
        shuffle_embeddings: bool = False,
    ) -> None:
        self.mode: FakeOpenAIMode = mode
        #: Lessons answered in ``ok`` mode (``{"lessons": [...]}``), unless ``content`` is set.
        self.lessons: LessonSource = lessons if lessons is not None else []
        #: The exact assistant content to answer instead of the lessons (e.g. fenced JSON).
        self.content = content
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.model = model
        self.embedding_dimension = embedding_dimension
        self.shuffle_embeddings = shuffle_embeddings
        self.requests: list[RecordedRequest] = []
        #: Connections accepted, whether or not a whole request arrived on them: a client that
        #: timed out while this (same-loop) server was starved may have closed before sending.
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._port = 0

    @property
    def base_url(self) -> str:
        """The API root to configure a client with, e.g. ``http://127.0.0.1:54321/v1``."""
        if self._server is None:
            raise RuntimeError("FakeOpenAI is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def request_count(self) -> int:
        return len(self.requests)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        # Handlers may be asleep (slow mode); cancel them so closing never waits for them.
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self.connections += 1
        try:
            request = await _read_request(reader)
            if request is not None:
                self.requests.append(request)
                status, payload = await self._respond(request)
                await _write_response(writer, status, payload)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # the client went away or spoke something else; nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            if task is not None:
                self._handlers.discard(task)

    async def _respond(self, request: RecordedRequest) -> tuple[int, dict[str, Any]]:
        path = request.path.rstrip("/")
        if request.method != "POST" or path not in ("/v1/chat/completions", "/v1/embeddings"):
            return 404, _error("not found", "invalid_request_error")
        if self.mode == "fail" or (self.mode == "flaky" and len(self.requests) <= self.fail_first):
            return self.fail_status, _error("the fake model is failing on purpose", "server_error")
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        if path == "/v1/embeddings":
            return 200, self._embeddings(request.json())
        if self.mode == "garbage":
            return 200, self._completion(GARBAGE_CONTENT)
        body = request.json()
        if self.content is not None:
            return 200, self._completion(self.content)
        lessons = self.lessons(body) if callable(self.lessons) else self.lessons
        return 200, self._completion(json.dumps({"lessons": lessons}))

    def _completion(self, content: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.mode == "garbage":
            return {"object": "list", "model": self.model}
        raw = body.get("input", [])
        texts = [raw] if isinstance(raw, str) else [str(text) for text in raw]
        vectors = HashingEmbedder(self.embedding_dimension).embed_sync(texts)
        items = [
            {"object": "embedding", "index": index, "embedding": [value * EMBEDDING_NORM for value in vector]}
            for index, vector in enumerate(vectors)
        ]
        if self.shuffle_embeddings:
            random.Random(len(self.requests)).shuffle(items)
        return {
            "object": "list",
            "model": self.model,
            "data": items,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
    """One HTTP/1.1 request with a ``Content-Length`` body (what httpx sends for JSON)."""
    request_line = await reader.readline()
    if not request_line.strip():
        return None
    method, path, _version = request_line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return RecordedRequest(method=method, path=path, headers=headers, body=body)


async def _write_response(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    reason = _REASONS.get(status, "Server Error" if status >= 500 else "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()
