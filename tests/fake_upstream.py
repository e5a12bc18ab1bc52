"""A real aiohttp app impersonating OpenAI and Anthropic on loopback, for end-to-end tests.

Usage::

    async with FakeUpstream.start(api_key="sk-upstream") as fake:
        fake.script("gpt-4o", "first answer", Fault.http(429, retry_after=1), DROP)
        ...  # point a client at fake.openai_base (OpenAI) or fake.url (Anthropic)
        assert fake.count("/v1/chat/completions", model="gpt-4o") == 1

or take the ``fake_upstream`` pytest fixture, which yields a started instance.

OpenAI routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/embeddings``,
``POST /v1/moderations``, ``POST /v1/responses`` (plain or ``stream: true``),
``POST /v1/audio/transcriptions`` and ``POST /v1/files`` (multipart, streamed: only byte counts are kept),
``GET /v1/files/{file_id}``; any other ``/v1/...`` path answers the OpenAI 404 error. Every OpenAI answer
carries ``OPENAI_RATE_LIMIT_HEADERS`` and a fresh ``x-request-id``; every answer carries
``Set-Cookie: <fake.set_cookie>`` while that attribute is set, and is compressed as the request's
``Accept-Encoding`` allows while ``fake.compress`` is true. Anthropic: ``POST /v1/messages``.

Stream faults strike a streamed answer as it is written, per attempt: ``Fault.truncate(n)`` (a clean
end after ``n`` frames, no end marker), ``Fault.stall(n, s)``, ``Fault.malformed_chunk(n)``,
``Fault.drip(interval)`` (also for plain answers), ``STREAM_BREAK``; ``DROP`` drops before the headers.

Every route with a ``model`` consumes one scripted reply per request (faults apply as for chat); a content
string is the answer text for chat, ``/v1/responses`` and ``/v1/messages`` and is ignored elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import random
import re
import struct
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest_asyncio
from aiohttp import BodyPartReader, web

FaultKind = Literal[
    "status",
    "slow",
    "drop",
    "malformed",
    "stream_break",
    "cut",
    "truncate",
    "stall",
    "malformed_chunk",
    "drip",
]
STREAM_FAULTS = frozenset({"stream_break", "truncate", "stall", "malformed_chunk", "drip"})
"""Faults applied to a streamed answer as it is written (``drip`` applies to plain answers too)."""
MALFORMED_FRAME = b"data: {this is not json\n\n"
DEFAULT_CONTENT = "Hello from the fake upstream."
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorFactory = Callable[[int, str, Mapping[str, str]], web.Response]
EMBEDDING_DIMENSIONS = 8
OPENAI_RATE_LIMIT_HEADERS: Mapping[str, str] = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-reset-requests": "120ms",
}
MODERATION_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


@dataclass(frozen=True)
class Fault:
    """A scripted misbehaviour, used in place of a reply (see the ``FaultKind`` values)."""

    kind: FaultKind
    status: int = 500
    retry_after: float | str | None = None
    """Seconds (formatted with ``:g``) or a header value sent verbatim (a hostile provider's)."""
    retry_after_name: str = "Retry-After"
    """The header name as sent: providers differ in case (HTTP names are case-insensitive)."""
    delay: float = 0.0
    body: str | None = None
    at: int = 0
    """Stream faults: the frame index where the fault strikes (0: before the first frame)."""

    @classmethod
    def http(
        cls,
        status: int,
        retry_after: float | str | None = None,
        body: str | None = None,
        *,
        retry_after_name: str = "Retry-After",
    ) -> Fault:
        """Answer ``status`` with a wire-format error body (or ``body`` verbatim) and optional Retry-After."""
        return cls(
            "status", status=status, retry_after=retry_after, body=body, retry_after_name=retry_after_name
        )

    @classmethod
    def slow(cls, delay: float, content: str | None = None) -> Fault:
        """Sleep ``delay`` seconds, then answer normally (with ``content`` or the model's default)."""
        return cls("slow", delay=delay, body=content)

    @classmethod
    def drop(cls) -> Fault:
        """Close the TCP connection without any HTTP answer."""
        return cls("drop")

    @classmethod
    def malformed(cls, body: str = "{this is not json") -> Fault:
        """Answer 200 with a body that is not JSON."""
        return cls("malformed", status=200, body=body)

    @classmethod
    def cut(cls, content: str) -> Fault:
        """Answer ``content`` as output stopped at the token limit: chat ``finish_reason: "length"``,
        Anthropic ``stop_reason: "max_tokens"``."""
        return cls("cut", status=200, body=content)

    @classmethod
    def stream_break(cls) -> Fault:
        """For streamed requests: send two chunks, then drop the connection (plain drop otherwise)."""
        return cls("stream_break")

    @classmethod
    def truncate(cls, at: int) -> Fault:
        """For streamed requests: send ``at`` frames, then end the answer cleanly, with no
        ``finish_reason``, ``[DONE]``, ``response.completed`` or ``message_stop``."""
        return cls("truncate", at=at)

    @classmethod
    def stall(cls, at: int, delay: float) -> Fault:
        """For streamed requests: send ``at`` frames, pause ``delay`` seconds, then send the rest."""
        return cls("stall", at=at, delay=delay)

    @classmethod
    def malformed_chunk(cls, at: int) -> Fault:
        """For streamed requests: a frame whose data is not JSON (``MALFORMED_FRAME``) before frame ``at``;
        the stream then goes on normally."""
        return cls("malformed_chunk", at=at)

    @classmethod
    def drip(cls, interval: float) -> Fault:
        """Send the answer (a plain body or a stream) one byte every ``interval`` seconds."""
        return cls("drip", delay=interval)


DROP = Fault.drop()
MALFORMED = Fault.malformed()
STREAM_BREAK = Fault.stream_break()
RATE_LIMITED = Fault.http(429, retry_after=1)
SERVER_ERROR = Fault.http(500)
UNAVAILABLE = Fault.http(503)

Reply = str | Fault


@dataclass(frozen=True)
class FaultMix:
    """Independent random faults: each request of the model draws ``fault`` with its rate (else the
    normal reply), from a generator seeded with ``seed`` so a run can be replayed."""

    rates: tuple[tuple[Fault, float], ...]
    seed: int = 0

    def __post_init__(self) -> None:
        assert sum(rate for _, rate in self.rates) <= 1.0, "fault rates add up to more than 1"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it; ``headers`` has lower-case keys, ``json`` is None if not JSON.

    Multipart uploads are never buffered: their ``json`` is filled in by the route once the upload has been
    read, with the form fields plus ``<part>_bytes`` for each file part and ``filename`` for the ``file``
    part, e.g. ``{"model": "whisper-1", "file_bytes": 3145728, "filename": "a.wav"}``.
    """

    method: str
    path: str
    headers: dict[str, str]
    json: Any
    query: str
    target: str = ""
    """The request target exactly as received (path and query, still percent-encoded)."""

    @property
    def model(self) -> str | None:
        """The ``model`` field of a JSON object body, if any."""
        return self.json.get("model") if isinstance(self.json, dict) else None


_OPENAI_TYPES = {429: "requests"}
_OPENAI_CODES = {401: "invalid_api_key", 404: "not_found", 429: "rate_limit_exceeded"}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def openai_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """An OpenAI-style error response."""
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error = {"message": message, "type": kind, "param": None, "code": _OPENAI_CODES.get(status)}
    return web.json_response({"error": error}, status=status, headers=headers)


def anthropic_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """An Anthropic-style error response."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _upload_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def embedding_vector(item: Any, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """The deterministic vector the fake answers for one embeddings input (exact in float32)."""
    digest = hashlib.shake_256(json.dumps(item).encode()).digest(dimensions)
    return [(b - 128) / 128 for b in digest]


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = [body["system"]] if isinstance(body.get("system"), str) else []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return " ".join(parts)


def _responses_prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    items = body.get("input")
    if isinstance(items, str):
        return " ".join([*parts, items])
    return " ".join([*parts, _prompt_text({"messages": items if isinstance(items, list) else []})])


def _embedding_inputs(raw: Any) -> list[Any] | None:
    """Split an embeddings ``input`` into its items (str or token list); None if it is invalid."""
    if isinstance(raw, str) and raw:
        return [raw]
    if not isinstance(raw, list) or not raw:
        return None
    if all(isinstance(t, int) for t in raw):
        return [raw]
    if all((isinstance(i, str) and i) or (isinstance(i, list) and i) for i in raw):
        return raw
    return None


def _pieces(content: str) -> list[str]:
    """Split content into several deltas on word boundaries (leading whitespace kept)."""
    return re.findall(r"\s*\S+\s*$|\s*\S+", content) or ([content] if content else [])


_RECORD = web.RequestKey("fake_upstream_record", RecordedRequest)
_CUT = web.RequestKey("fake_upstream_cut", bool)
_DRIP = web.RequestKey("fake_upstream_drip", float)


@dataclass
class Gate:
    """Requests held by ``FakeUpstream.hold`` until ``release``."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    model: str | None = None
    """Hold only requests for this model (None: every request)."""

    def release(self) -> None:
        self.opened.set()


class FakeUpstream:
    """State and routes of a fake LLM provider; ``chunk_delay`` is the pause between streamed chunks."""

    def __init__(self, api_key: str | None = None, chunk_delay: float = 0.0) -> None:
        self.api_key = api_key
        self.chunk_delay = chunk_delay
        self.url = ""
        self.requests: list[RecordedRequest] = []
        self.cancelled = 0
        self.in_flight = 0
        self.max_in_flight = 0
        """The most requests the fake has held at once."""
        self.set_cookie: str | None = None
        """When set, every answer carries ``Set-Cookie: <this>``."""
        self.compress = False
        """When set, answers are compressed as the request's ``Accept-Encoding`` allows (as
        OpenAI's edge does)."""
        self.files: dict[str, dict[str, Any]] = {}
        self.tool_calls: dict[str, list[str]] = {}
        """Per model: names of the tools each plain chat answer calls (``message.tool_calls``)."""
        self._scripts: defaultdict[str, deque[Reply]] = defaultdict(deque)
        self._defaults: dict[str, Reply] = {}
        self._mixes: dict[str, tuple[FaultMix, random.Random]] = {}
        self.gate: Gate | None = None
        """When set, every request is held on arrival until the gate opens (``hold``)."""

    def hold(self, model: str | None = None) -> Gate:
        """Hold every request (``model``: every request for that model) on arrival until
        ``Gate.release()``; ``Gate.reached`` is set once one arrived (a test does something while
        the proxy waits on the upstream)."""
        self.gate = Gate(model=model)
        return self.gate

    @property
    def openai_base(self) -> str:
        """Base URL for OpenAI clients (``url + "/v1"``)."""
        return self.url + "/v1"

    def script(self, model: str, *replies: Reply) -> None:
        """Queue replies (content strings or Faults) for ``model``, consumed one per request, in order."""
        self._scripts[model].extend(replies)

    def set_default_reply(self, model: str, reply: Reply | Mapping[str, Any] | list[Any]) -> None:
        """Set the reply used when ``model``'s queue is empty; mappings/lists are sent as JSON text."""
        self._defaults[model] = reply if isinstance(reply, str | Fault) else json.dumps(reply)

    def set_fault_mix(self, model: str, mix: FaultMix | None) -> None:
        """Draw ``model``'s unscripted replies from ``mix`` (None: back to the default reply)."""
        if mix is None:
            self._mixes.pop(model, None)
        else:
            self._mixes[model] = (mix, random.Random(mix.seed))

    def default_reply(self, model: str) -> Reply:
        """The reply used when ``model``'s queue is empty."""
        return self._defaults.get(model, DEFAULT_CONTENT)

    def next_reply(self, model: str) -> Reply:
        """Pop the next scripted reply for ``model`` (or its default)."""
        queue = self._scripts.get(model)
        if queue:
            return queue.popleft()
        if model in self._mixes:
            mix, rng = self._mixes[model]
            draw = rng.random()
            for fault, rate in mix.rates:
                if draw < rate:
                    return fault
                draw -= rate
        return self.default_reply(model)

    def count(self, path: str | None = None, model: str | None = None) -> int:
        """Number of recorded requests matching ``path`` and/or body ``model``."""
        return sum(
            1
            for r in self.requests
            if (path is None or r.path == path) and (model is None or r.model == model)
        )

    def reset(self) -> None:
        """Forget requests, counters, scripts, default replies and files (keeps api_key/chunk_delay)."""
        self.requests.clear()
        self.files.clear()
        self.tool_calls.clear()
        self._scripts.clear()
        self._defaults.clear()
        self._mixes.clear()
        self.cancelled = 0

    def app(self) -> web.Application:
        """The aiohttp application serving the fake routes."""
        # Large enough for a module call carrying a 20 MB image as base64 (the media memory test).
        app = web.Application(middlewares=[self._record], client_max_size=256 * 1024 * 1024)
        app.on_response_prepare.append(self._openai_headers)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/moderations", self._moderations)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        app.router.add_post("/v1/files", self._upload_file)
        app.router.add_get("/v1/files/{file_id}", self._retrieve_file)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_route("*", "/v1/{tail:.*}", self._not_found)
        return app

    @classmethod
    @asynccontextmanager
    async def start(
        cls, api_key: str | None = None, chunk_delay: float = 0.0, shutdown_timeout: float = 0.5
    ) -> AsyncIterator[FakeUpstream]:
        """Serve a new FakeUpstream on 127.0.0.1 on a free port for the duration of the block."""
        fake = cls(api_key=api_key, chunk_delay=chunk_delay)
        runner = web.AppRunner(fake.app(), access_log=None, shutdown_timeout=shutdown_timeout)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            yield fake
        finally:
            await runner.cleanup()

    # -- plumbing ----------------------------------------------------------------------------------

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # multipart bodies are left unread for the route to stream (see ``_read_upload``)
            multipart = request.content_type.startswith("multipart/")
            body = None if multipart else _parse_json(await request.read())
            headers = {k.lower(): v for k, v in request.headers.items()}
            record = RecordedRequest(
                request.method, request.path, headers, body, request.query_string, request.raw_path
            )
            self.requests.append(record)
            request[_RECORD] = record
            if self.gate is not None and self.gate.model in (None, record.model):
                self.gate.reached.set()
                await self.gate.opened.wait()
            response = await handler(request)
            if _DRIP in request and isinstance(response, web.Response) and not response.prepared:
                return await self._dripped(request, response, request[_DRIP])
            if self.compress and not response.prepared:
                response.enable_compression()  # must come before the headers are prepared
            return response
        finally:
            self.in_flight -= 1

    async def _openai_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if request.path.startswith("/v1/") and request.path != "/v1/messages":
            response.headers.update(OPENAI_RATE_LIMIT_HEADERS)
            response.headers["x-request-id"] = f"req_{uuid.uuid4().hex}"
        if self.set_cookie is not None:
            response.headers["Set-Cookie"] = self.set_cookie

    def _update_record(self, request: web.Request, body: dict[str, Any]) -> None:
        """Replace the recorded ``json`` of this request (kept in place in ``requests``)."""
        record = request[_RECORD]
        for i, r in enumerate(self.requests):
            if r is record:
                self.requests[i] = request[_RECORD] = dataclasses.replace(record, json=body)
                return

    def _openai_auth(self, request: web.Request) -> web.Response | None:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return openai_error(401, "Incorrect API key provided.")
        return None

    def _anthropic_auth(self, request: web.Request) -> web.Response | None:
        key = request.headers.get("x-api-key")
        if not key or (self.api_key is not None and key != self.api_key):
            return anthropic_error(401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return anthropic_error(401, "anthropic-version header is required")
        return None

    async def _consume(
        self, request: web.Request, auth: Callable[[web.Request], web.Response | None], error: ErrorFactory
    ) -> tuple[web.StreamResponse | None, dict[str, Any], str, Fault | None]:
        """Check auth, take the next reply: (early answer or None, JSON body, content, stream fault)."""
        if denied := auth(request):
            return denied, {}, "", None
        body = await self._json_body(request)
        early, content, fault = await self._take_reply(request, body, error)
        return early, body, content, fault

    @staticmethod
    async def _json_body(request: web.Request) -> dict[str, Any]:
        body = _parse_json(await request.read())
        return body if isinstance(body, dict) else {}

    async def _take_reply(
        self, request: web.Request, body: Mapping[str, Any], error: ErrorFactory = openai_error
    ) -> tuple[web.StreamResponse | None, str, Fault | None]:
        """Take ``body["model"]``'s next reply: (early answer or None, content, stream fault)."""
        model = str(body.get("model", ""))
        reply = self.next_reply(model)
        if isinstance(reply, str):
            return None, reply, None
        streamed = reply.kind in STREAM_FAULTS and bool(body.get("stream"))
        if reply.kind == "drip":
            request[_DRIP] = reply.delay
        elif not streamed and (answer := await self._fault(request, reply, error)) is not None:
            return answer, "", None
        default = self.default_reply(model)
        fallback = default if isinstance(default, str) else DEFAULT_CONTENT
        return None, fallback if reply.body is None else reply.body, reply if streamed else None

    async def _read_upload(self, request: web.Request) -> dict[str, Any] | web.Response:
        """Stream a multipart body chunk by chunk, keeping only form fields and file sizes; record them.

        A client that goes away mid-upload is counted in ``cancelled`` and recorded with ``"aborted": True``.
        """
        try:
            reader = await request.multipart()
        except (AssertionError, ValueError, KeyError):
            await self._drain(request)
            return openai_error(400, "Expected a multipart/form-data body.")
        fields: dict[str, Any] = {}
        try:
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    continue  # nested multipart: not something OpenAI accepts; skipped unread
                name = part.name or ""
                if part.filename is None:
                    fields[name] = await part.text()
                    continue
                if name == "file":
                    fields["filename"] = part.filename
                fields[f"{name}_bytes"] = 0
                while chunk := await part.read_chunk():
                    fields[f"{name}_bytes"] += len(chunk)
        except ConnectionResetError:
            self.cancelled += 1
            self._update_record(request, {**fields, "aborted": True})
            return web.Response()  # nobody is left to read it
        self._update_record(request, fields)
        return fields

    async def _drain(self, request: web.Request) -> None:
        """Discard an unread body without buffering it (so the client can finish its upload)."""
        try:
            async for _ in request.content.iter_chunked(1 << 16):
                pass
        except ConnectionResetError:
            self.cancelled += 1

    async def _fault(
        self, request: web.Request, fault: Fault, error: ErrorFactory
    ) -> web.StreamResponse | None:
        """Apply a non-streaming fault; None means "answer normally" (after any delay)."""
        if fault.kind == "slow":
            await asyncio.sleep(fault.delay)
            return None
        if fault.kind == "cut":
            request[_CUT] = True
            return None
        if fault.kind in ("truncate", "stall", "malformed_chunk"):
            return None  # stream faults: a plain answer is sent whole
        if fault.kind not in ("status", "malformed"):
            return self._drop(request)
        value = fault.retry_after
        headers = (
            {}
            if value is None
            else {fault.retry_after_name: value if isinstance(value, str) else f"{value:g}"}
        )
        if fault.body is None:
            return error(fault.status, f"fake upstream fault: HTTP {fault.status}", headers)
        return web.Response(
            status=fault.status, text=fault.body, content_type="application/json", headers=headers
        )

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.close()
        return web.Response()  # aiohttp fails to write it to the closed transport and moves on quietly

    async def _stream(
        self, request: web.Request, frames: list[bytes], fault: Fault | None
    ) -> web.StreamResponse:
        """Write each frame separately (``chunk_delay`` apart), misbehaving as ``fault`` says."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        kind = fault.kind if fault is not None else None
        at = 2 if kind == "stream_break" else (fault.at if fault is not None else 0)
        if kind == "malformed_chunk":
            frames = [*frames[:at], MALFORMED_FRAME, *frames[at:]]
        try:
            await resp.prepare(request)
            for i, frame in enumerate(frames):
                if i == at and kind == "stream_break":
                    self._drop(request)
                    return resp
                if i == at and kind == "truncate":
                    break
                if i == at and kind == "stall" and fault is not None:
                    await asyncio.sleep(fault.delay)
                if i and self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                if kind == "drip" and fault is not None:
                    await self._drip(resp, frame, fault.delay)
                else:
                    await resp.write(frame)
            await resp.write_eof()
        except ConnectionResetError:
            self.cancelled += 1
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return resp

    @staticmethod
    async def _drip(resp: web.StreamResponse, data: bytes, interval: float) -> None:
        for i in range(len(data)):
            await resp.write(data[i : i + 1])
            await asyncio.sleep(interval)

    async def _dripped(
        self, request: web.Request, answer: web.Response, interval: float
    ) -> web.StreamResponse:
        """``answer`` sent one byte every ``interval`` seconds."""
        resp = web.StreamResponse(status=answer.status, headers=answer.headers)
        resp.headers.pop("Content-Length", None)
        body = answer.body if isinstance(answer.body, bytes) else b""
        try:
            await resp.prepare(request)
            await self._drip(resp, body, interval)
            await resp.write_eof()
        except ConnectionResetError:
            self.cancelled += 1
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return resp

    # -- OpenAI ------------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if denied := self._openai_auth(request):
            return denied
        models = sorted({"gpt-4o-mini", *self._scripts, *self._defaults} - {""})
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake-upstream"} for m in models]
        return web.json_response({"object": "list", "data": data})

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        return openai_error(404, f"Unknown path {request.method} {request.path}")

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        if denied := self._openai_auth(request):
            return denied
        body = await self._json_body(request)
        items = _embedding_inputs(body.get("input"))
        if items is None:
            return openai_error(400, "'$.input' is invalid. Please check the API reference.")
        dimensions = body.get("dimensions")
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions <= 0:
            dimensions = EMBEDDING_DIMENSIONS
        early, _, _ = await self._take_reply(request, body)
        if early is not None:
            return early
        as_base64 = body.get("encoding_format") == "base64"
        data: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            vector = embedding_vector(item, dimensions)
            encoded: Any = vector
            if as_base64:
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(_tokens(i) if isinstance(i, str) else len(i) for i in items)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", ""),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _moderations(self, request: web.Request) -> web.StreamResponse:
        if denied := self._openai_auth(request):
            return denied
        body = await self._json_body(request)
        raw = body.get("input")
        if not isinstance(raw, str | list) or not raw:
            return openai_error(400, "'$.input' is invalid. Please check the API reference.")
        early, _, _ = await self._take_reply(request, body)
        if early is not None:
            return early
        items = [raw] if isinstance(raw, str) or any(isinstance(i, dict) for i in raw) else raw
        result = {
            "flagged": False,
            "categories": dict.fromkeys(MODERATION_CATEGORIES, False),
            "category_scores": dict.fromkeys(MODERATION_CATEGORIES, 1e-06),
            "category_applied_input_types": {c: ["text"] for c in MODERATION_CATEGORIES},
        }
        return web.json_response(
            {
                "id": f"modr-{uuid.uuid4().hex[:24]}",
                "model": body.get("model") or "omni-moderation-latest",
                "results": [result for _ in items],
            }
        )

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        early, body, content, fault = await self._consume(request, self._openai_auth, openai_error)
        if early is not None:
            return early
        input_tokens, output_tokens = _tokens(_responses_prompt_text(body)), _tokens(content)
        created = int(time.time())
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        item = {
            "type": "message",
            "id": message_id,
            "status": "completed",
            "role": "assistant",
            "content": [part],
        }
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        response: dict[str, Any] = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": created,
            "status": "completed",
            "completed_at": created,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": body.get("model", ""),
            "output": [item],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": usage,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }
        if not body.get("stream"):
            return web.json_response(response)
        pending = {**response, "status": "in_progress", "completed_at": None, "output": [], "usage": None}
        where = {"item_id": message_id, "output_index": 0, "content_index": 0}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
            {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
            *[
                {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
                for piece in _pieces(content)
            ],
            {"type": "response.output_text.done", **where, "text": content, "logprobs": []},
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": response},
        ]
        frames = [
            f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n".encode()
            for n, e in enumerate(events)
        ]
        return await self._stream(request, frames, fault)

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        if denied := self._openai_auth(request):
            await self._drain(request)
            return denied
        fields = await self._read_upload(request)
        if isinstance(fields, web.Response):
            return fields
        if "file_bytes" not in fields or not fields.get("model"):
            return openai_error(400, "A 'file' part and a 'model' field are required.")
        early, _, _ = await self._take_reply(request, fields)
        if early is not None:
            return early
        text = f"transcribed {fields['file_bytes']} bytes"
        if fields.get("response_format") in ("text", "srt", "vtt"):
            return web.Response(text=text)
        return web.json_response({"text": text})

    async def _upload_file(self, request: web.Request) -> web.StreamResponse:
        if denied := self._openai_auth(request):
            await self._drain(request)
            return denied
        fields = await self._read_upload(request)
        if isinstance(fields, web.Response):
            return fields
        if "file_bytes" not in fields or not fields.get("purpose"):
            return openai_error(400, "A 'file' part and a 'purpose' field are required.")
        file = {
            "id": _upload_id(),
            "object": "file",
            "bytes": fields["file_bytes"],
            "created_at": int(time.time()),
            "filename": fields.get("filename") or "upload",
            "purpose": fields["purpose"],
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }
        self.files[file["id"]] = file
        return web.json_response(file)

    async def _retrieve_file(self, request: web.Request) -> web.StreamResponse:
        if denied := self._openai_auth(request):
            return denied
        file_id = request.match_info["file_id"]
        if (file := self.files.get(file_id)) is None:
            return openai_error(404, f"No such File object: {file_id}")
        return web.json_response(file)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        early, body, content, fault = await self._consume(request, self._openai_auth, openai_error)
        if early is not None:
            return early
        model, stream = str(body.get("model", "")), bool(body.get("stream"))
        prompt, completion = _tokens(_prompt_text(body)), _tokens(content)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if self.tool_calls.get(model):
                message["tool_calls"] = [
                    {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
                    for i, name in enumerate(self.tool_calls[model])
                ]
            finish = "length" if request.get(_CUT) else "stop"
            return web.json_response(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                    "usage": usage,
                    "system_fingerprint": None,
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            out: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [choice],
            }
            if include_usage:
                out["usage"] = None
            return out

        chunks = [chunk({"role": "assistant", "content": ""})]
        chunks += [chunk({"content": piece}) for piece in _pieces(content)]
        chunks.append(chunk({}, "stop"))
        if include_usage:
            chunks.append({**chunk({}), "choices": [], "usage": usage})
        frames = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
        return await self._stream(request, frames, fault)

    # -- Anthropic ---------------------------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        early, body, content, fault = await self._consume(request, self._anthropic_auth, anthropic_error)
        if early is not None:
            return early
        model, stream = str(body.get("model", "")), bool(body.get("stream"))
        input_tokens, output_tokens = _tokens(_prompt_text(body)), _tokens(content)
        message: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": content}],
            "stop_reason": "max_tokens" if request.get(_CUT) else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
        if not stream:
            return web.json_response(message)
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            *[
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                for piece in _pieces(content)
            ],
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
            {"type": "message_stop"},
        ]
        frames = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
        return await self._stream(request, frames, fault)


@pytest_asyncio.fixture
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    """A started FakeUpstream (no api_key, no chunk delay), stopped after the test."""
    async with FakeUpstream.start() as fake:
        yield fake
