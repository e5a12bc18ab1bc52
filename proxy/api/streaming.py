"""Streamed module answers on the wire: start, follow, resume (spec v2.5 §3.2).

A streamed call runs as a producer task that appends chunks to its session (``proxy.stream``);
each HTTP response follows the session from some position and frames the chunks for its
transport: SSE or NDJSON on ``/execute``, ``chat.completion.chunk`` frames on chat completions,
Responses events on ``/v1/responses``. The producer outlives the connection while the session
can be resumed (``--stream-session-ttl``; the call's own deadline ``total_s`` still bounds it),
so a client that drops and retries with the session id gets the rest of the same answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import web

from proxy.api.app_keys import METRICS, SETTINGS, Runtime
from proxy.api.calls import module_call, record_report, services_of
from proxy.api.envelopes import answer_status, caller_error, refused_envelope
from proxy.api.frames import ChatFramer, Framer, ResponsesFramer
from proxy.api.limits import CallLimits
from proxy.api.middleware import RECORD_KEY
from proxy.api.output_mode import OutputMode
from proxy.api.stream_response import HeldHeadResponse
from proxy.context.identity import without_context
from proxy.contract.errors import Code, Origin, error_envelope, http_status
from proxy.jsonshape import as_dict
from proxy.module.model import Module
from proxy.observability.metrics import OUTCOME_INVALID_INPUT, Metrics
from proxy.pipeline import input_error
from proxy.service.module_call import Admitted, Answered, ModuleCall, Services, admit_call, answer_module
from proxy.service.stream_emitter import ChunkEmitter
from proxy.state.stream_sessions import MirrorGap, Session, SessionHub, Source
from proxy.stream.chunks import CHECKPOINT_MARK, Kind, error_chunk, meta_chunk, recovery_info
from proxy.stream.fields import RATIONALE, streamable_fields

log = structlog.get_logger("proxy.api")

STREAMS = web.AppKey("streams", SessionHub)
SESSION_HEADER = "X-Cognitive-Session-Id"
RECOVERY_SESSION_HEADER = "X-Cognitive-Recovery-Session"
RECOVERY_SEQ_HEADER = "X-Cognitive-Recovery-Seq"
CHECKPOINT_MISMATCH = "W4012"
"""Warning of a resumed stream restarted at seq 1 (the spec names no code for it)."""
_TERMINAL: frozenset[Kind] = frozenset({"final", "error"})


async def streams_ctx(app: web.Application) -> Any:
    """The session hub of this process (Redis-mirrored with ``--redis-url``)."""
    settings = app[SETTINGS]
    hub = app[STREAMS] = SessionHub(
        ttl_s=settings.stream_session_ttl_s,
        max_bytes=settings.stream_session_max_bytes,
        redis=settings.redis if settings.stream_recovery else None,
        on_mirror_drop=lambda reason: app[METRICS].stream_mirror_dropped.labels(reason).inc(),
    )
    app[METRICS].stream_sessions.set_function(lambda: hub.live)
    yield
    await hub.aclose()


# -- producing -------------------------------------------------------------------------------------


def _outcome(chunk: dict[str, Any]) -> str:
    return "final" if chunk.get("final") is True else "error"


async def _produce(
    call: ModuleCall, services: Services, emitter: ChunkEmitter, admitted: Admitted | None
) -> Answered | None:
    """The producer of a streamed call: the service's answer appended to the session as its last
    chunk. Holds no request: the edge copies the returned report into its record."""
    metrics, module = services.metrics, call.module
    try:
        answered = await answer_module(call, services, admitted)
    except asyncio.CancelledError:
        emitter.fail(
            error_envelope(
                Code.STREAM_INTERRUPTED,
                "The streamed call was stopped before its answer (the client left, or the proxy stopped)",
            )
        )
        metrics.streams.labels(module.name, "interrupted").inc()
        raise
    except Exception:  # the pipeline answers its own failures; this is a bug in the stream code
        log.exception("proxy.stream_failed", module=module.name, session=emitter.session.id[:12])
        emitter.fail(error_envelope(Code.INTERNAL_ERROR, "Internal error in the proxy while streaming"))
        metrics.streams.labels(module.name, "error").inc()
        return None
    answer = answered.answer
    outcome = _outcome(emitter.finish(answer, answer_status(answer)))
    metrics.child(metrics.streams, module.name, outcome).inc(1)
    return answered


@dataclass(frozen=True, slots=True)
class Started:
    session: Session
    producer: asyncio.Task[Answered | None]


def start_stream(
    request: web.Request, admitted_call: ModuleCall, services: Services, admitted: Admitted | None
) -> Started:
    """Create the session and start its producer (which outlives this request): ``admitted_call``
    (its requester and media as they are) with the session's emitter as its listener, run with
    ``admitted`` (what ``admit_call`` returned: its context and rung, not admitted again). The
    input was checked before (``input_refused``): the producer's pipeline does not check it
    again."""
    app = request.app
    hub = app[STREAMS]
    metrics: Metrics = app[METRICS]
    module = admitted_call.module
    session = hub.create(admitted_call.requester.caller.id, module.name)
    emitter = ChunkEmitter(
        session,
        streamable_fields(module),
        on_first_delta=metrics.child(metrics.stream_ttfd, module.name).observe,
    )
    call = ModuleCall(
        admitted_call.runtime,
        module,
        admitted_call.value,
        admitted_call.requester,
        admitted_call.limits,
        admitted_call.media,
        admitted_call.check_input,
        input_checked=True,
        listener=emitter,
        history=admitted_call.history,
        tools=admitted_call.tools,
    )
    return Started(session, hub.spawn(_produce(call, services, emitter, admitted)))


def primary_field(module: Module) -> str:
    fields = streamable_fields(module)
    return RATIONALE if RATIONALE in fields or not fields else fields[0]


# -- following -------------------------------------------------------------------------------------


Write = Callable[[bytes], Awaitable[None]]


@dataclass
class _Position:
    index: int
    given_checkpoint: dict[str, Any] | None = None
    """The checkpoint a resumed client named (``last_checkpoint`` until a chunk with one passes)."""
    checkpointed: bytes | None = None
    """The last delta written (``CHECKPOINT_MARK``): parsed only if the stream is interrupted."""

    @property
    def last_checkpoint(self) -> dict[str, Any] | None:
        if self.checkpointed is None:
            return self.given_checkpoint
        held = as_dict(orjson.loads(self.checkpointed).get("chunk")).get("checkpoint")
        return held if isinstance(held, dict) and held else None


async def follow(
    source: Source,
    position: _Position,
    framer: Framer,
    write: Write,
    *,
    heartbeat_s: float,
    max_s: float,
    session_id: str,
    last: Write | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Write the session's chunks from ``position`` until its final or error chunk; a heartbeat
    after each ``heartbeat_s`` of silence. A session that stays silent past ``max_s`` (its replica
    died; chunks reset the bound, heartbeats do not) or cannot be read ends with a resumable error
    chunk. ``last`` (default ``write``) writes the frames that end the stream: the response's end
    can leave with them."""
    end = write if last is None else last
    deadline = clock() + max_s
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            await _interrupted(
                end, framer, session_id, position, Code.STREAM_TIMEOUT, "no chunk within the session TTL"
            )
            return
        try:
            events, done = await source.read(position.index, min(heartbeat_s, remaining))
        except (TimeoutError, OSError, ConnectionError, MirrorGap) as exc:
            await _interrupted(end, framer, session_id, position, Code.STREAM_INTERRUPTED, str(exc)[:200])
            return
        except Exception as exc:  # a Redis error while following another replica's session
            log.warning("proxy.stream_follow_failed", session=session_id[:12], error=repr(exc)[:200])
            await _interrupted(end, framer, session_id, position, Code.STREAM_INTERRUPTED, type(exc).__name__)
            return
        if not events:
            if done:
                return
            await write(framer.heartbeat())
            continue
        # the chunks read at once leave in one write (the socket's, one call of aiohttp's writer)
        frames: list[bytes] = []
        ended = False
        for kind, payload in events:
            position.index += 1
            if kind == "chunk" and CHECKPOINT_MARK in payload:
                position.checkpointed = payload
            frames.append(framer.event(kind, payload))
            if kind in _TERMINAL:
                ended = True
                break
        await (end if ended else write)(frames[0] if len(frames) == 1 else b"".join(frames))
        if ended:
            return
        deadline = clock() + max_s  # the bound is on silence: a chunk came


async def _interrupted(
    write: Write, framer: Framer, session_id: str, position: _Position, code: Code, why: str
) -> None:
    envelope = error_envelope(code, f"The stream was interrupted: {why}")
    chunk = error_chunk(
        None, session_id, envelope, recovery=recovery_info(position.index, position.last_checkpoint)
    )
    await write(framer.event("error", orjson.dumps(chunk)))


async def respond(
    request: web.Request,
    source: Source,
    first: dict[str, Any],
    position: _Position,
    framer: Framer,
    headers: dict[str, str],
    *,
    producer: asyncio.Task[Any] | None = None,
) -> web.StreamResponse:
    """Send ``first`` (the meta chunk), then follow ``source``. Without recovery, a client that
    leaves cancels ``producer`` (its upstream call); with it, one that leaves before the head
    (and the session id in it) reached it.

    The head and the meta chunk leave in one write, the last frames and the response's end in
    another (each write wakes the client). A new stream's ``producer`` runs first, so that its
    upstream request is on its way while the meta chunk is written."""
    settings = request.app[SETTINGS]
    response = HeldHeadResponse(
        headers={
            **headers,
            "Content-Type": framer.content_type,
            "Cache-Control": "no-cache",
            SESSION_HEADER: first["session_id"],
        }
    )
    ended = False

    async def end(frames: bytes) -> None:
        nonlocal ended
        ended = True
        await response.write_eof(frames + framer.end())

    finished = headed = False
    try:
        if producer is not None:
            await _upstream_request_sent()
        await response.prepare(request)
        await response.write(framer.meta(first))
        # the session id reached the client (a write to a reset connection only closes the transport)
        headed = request.transport is not None and not request.transport.is_closing()
        await follow(
            source,
            position,
            framer,
            response.write,
            heartbeat_s=settings.stream_heartbeat_s,
            max_s=settings.stream_session_ttl_s,
            session_id=first["session_id"],
            last=end,
        )
        finished = True
    finally:
        # With recovery the producer outlives the client, who resumes with the session id from the
        # head: one whose head never left has no one to resume it.
        if not finished and producer is not None and not (settings.stream_recovery and headed):
            producer.cancel()
    if not ended:  # the session ended without a terminal chunk for this reader
        await response.write_eof(framer.end())
    return response


async def _upstream_request_sent() -> None:
    """Two turns of the loop: in the first the producer task just spawned runs up to its first
    wait (with a local context store and no limits: its upstream request made and queued); in
    the second aiohttp's client sends the request (Python 3.11 starts the task that writes it on
    the next turn; 3.12 eagerly). A producer that waits on something else first (a Redis round
    trip) is simply not there yet: the meta chunk goes first, as it would without this."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


# -- recovery --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recovery:
    session_id: str
    last_seq: int
    last_checkpoint: dict[str, Any] | None


class BadRecovery(ValueError):
    pass


def recovery_of(request: web.Request, body: dict[str, Any]) -> Recovery | None:
    """The recovery context of a retry (headers win over ``_recovery``), or None."""
    sid = request.headers.get(RECOVERY_SESSION_HEADER)
    seq: Any = request.headers.get(RECOVERY_SEQ_HEADER)
    checkpoint = None
    if sid is None:
        given = body.get("_recovery")
        if given is None:
            return None
        context = as_dict(given)
        sid, seq, checkpoint = (
            context.get("session_id"),
            context.get("last_seq"),
            context.get("last_checkpoint"),
        )
    if not isinstance(sid, str) or not sid:
        raise BadRecovery("the recovery context needs a session_id")
    try:
        last_seq = int(seq if seq is not None else 0)
    except (TypeError, ValueError) as exc:
        raise BadRecovery("last_seq (X-Cognitive-Recovery-Seq) must be an integer >= 0") from exc
    if last_seq < 0 or isinstance(seq, bool) or (isinstance(seq, float) and not seq.is_integer()):
        raise BadRecovery("last_seq (X-Cognitive-Recovery-Seq) must be an integer >= 0")
    return Recovery(sid, last_seq, checkpoint if isinstance(checkpoint, dict) else None)


async def resume(
    request: web.Request, recovery: Recovery, module: Module, framer: Framer, headers: dict[str, str]
) -> web.StreamResponse | None:
    """Answer a retry from the session it names; None when the session is unknown (the caller
    starts a new one). Another client key is refused (E4007); a checkpoint that does not match
    the session replays it from seq 1 with a W4012 warning."""
    hub = request.app[STREAMS]
    metrics = request.app[METRICS]
    record = request[RECORD_KEY]
    trace_id = record.trace_id
    found = await hub.find(recovery.session_id)
    if found is None or found.module != module.name:
        metrics.stream_resumptions.labels("unknown").inc()
        return None
    if not hub.same_client(found.client, record.caller.id):
        metrics.stream_resumptions.labels("refused").inc()
        return caller_error(
            Code.PERMISSION_DENIED, "This stream session was started by another client", trace_id
        )
    matches = await _checkpoint_matches(found.chunk_at, recovery)
    if matches:
        metrics.stream_resumptions.labels("resumed").inc()
        first = meta_chunk(recovery.session_id, trace_id=trace_id, resume_from_seq=recovery.last_seq + 1)
        position = _Position(recovery.last_seq, _as_stored(recovery.last_checkpoint))
    else:
        metrics.stream_resumptions.labels("restarted").inc()
        warning = {
            "code": CHECKPOINT_MISMATCH,
            "message": f"Checkpoint of seq {recovery.last_seq} does not match the session: restarted",
        }
        first = meta_chunk(recovery.session_id, trace_id=trace_id, resume_from_seq=1, warnings=[warning])
        first["resumed"] = False
        position = _Position(0)
    return await respond(request, found.source, first, position, framer, headers)


def _as_stored(matched: dict[str, Any] | None) -> dict[str, Any] | None:
    """A checkpoint ``_checkpoint_matches`` matched, as the session holds it: its offset an integer
    (a client's ``5.0`` equals ``5``) and no key of the client's own. An interrupted resumed stream
    names it in its error chunk's recovery, which the chunk schema checks."""
    if matched is None:
        return None
    return {"offset": int(matched["offset"]), "hash": matched["hash"]}


async def _checkpoint_matches(
    chunk_at: Callable[[int], Awaitable[dict[str, Any] | None]], recovery: Recovery
) -> bool:
    """Whether the session holds ``last_seq`` and ``last_checkpoint`` is the checkpoint of its
    last delta at or before it (what the client holds there, and what an interrupted stream's
    error chunk names): progress, snapshot and final chunks carry none. A snapshot resetting the
    fields does not reset it: the client saw the deltas before it all the same."""
    if recovery.last_seq == 0:
        return recovery.last_checkpoint is None
    chunk = await chunk_at(recovery.last_seq)
    if chunk is None:
        return False  # the client claims chunks the session never had
    if recovery.last_checkpoint is None:
        return True
    given = {k: recovery.last_checkpoint.get(k) for k in ("offset", "hash")}
    seq = recovery.last_seq
    # back over the chunks without one: a few a rung (progress, snapshot), the final one
    while (stored := as_dict(chunk.get("chunk")).get("checkpoint")) is None:
        seq -= 1
        found = await chunk_at(seq) if seq >= 1 else None
        if found is None:
            return False  # no delta at or before last_seq: no checkpoint to match
        chunk = found
    return bool(stored == given)


def input_refused(request: web.Request, module: Module, value: Any, check: bool) -> web.Response | None:
    """The E1xxx answer for a bad input, checked before a stream opens so that the caller's
    mistake keeps its 400; None when the input may be sent. ``_context`` is checked by the
    pipeline's context step, not against the input schema."""
    refused = input_error(module, without_context(value), schema=check)
    if refused is None:
        return None
    record = request[RECORD_KEY]
    record.outcome = OUTCOME_INVALID_INPUT
    code = str(as_dict(refused.get("error")).get("code"))
    return refused_envelope(refused, http_status(code, Origin.CALLER), record.trace_id)


async def _start_and_follow(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    check: bool,
    framer: Framer,
    history: Sequence[Mapping[str, Any]] = (),
    tools: tuple[Mapping[str, Any], ...] = (),
) -> web.StreamResponse:
    refused = input_refused(request, module, value, check)
    if refused is not None:
        return refused
    request[RECORD_KEY].module = module.name
    limits = CallLimits.of(request)
    call = module_call(
        request, runtime, module, value, limits, check_input=check, history=history, tools=tools
    )
    services = services_of(request)
    try:
        admitted = await admit_call(call, services)  # a 429 before the stream starts
    finally:
        limits.keep_admission(request)
    started = start_stream(request, call, services, admitted)
    first = meta_chunk(started.session.id, trace_id=call.requester.trace_id)
    headers: dict[str, str] = {"X-Cognitive-Tier": module.tier}
    response = await respond(
        request, started.session, first, _Position(0), framer, headers, producer=started.producer
    )
    _report_if_done(request, started.producer)
    return response


def _report_if_done(request: web.Request, producer: asyncio.Task[Answered | None]) -> None:
    """The producer's report into the request's log line, when the call finished while the client
    followed it (a producer that outlives the request reports nothing to it)."""
    if producer.done() and not producer.cancelled() and producer.exception() is None:
        answered = producer.result()
        if answered is not None:
            record_report(request, answered.report)


async def stream_module_execute(
    request: web.Request, runtime: Runtime, module: Module, value: Any, framer: Framer
) -> web.StreamResponse:
    """A module answer streamed on ``/execute`` (SSE or NDJSON)."""
    return await _start_and_follow(request, runtime, module, value, True, framer)


async def stream_module_chat(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    check: bool,
    body: dict[str, Any],
    history: Sequence[Mapping[str, Any]],
    mode: OutputMode,
) -> web.StreamResponse:
    """A module answer streamed as ``chat.completion.chunk`` frames (``ChatFramer``)."""
    include_usage = bool(as_dict(body.get("stream_options")).get("include_usage"))
    framer = ChatFramer(f"module:{module.name}", primary_field(module), include_usage, mode.tool)
    return await _start_and_follow(request, runtime, module, value, check, framer, history, mode.tools)


async def stream_module_response(
    request: web.Request,
    runtime: Runtime,
    module: Module,
    value: Any,
    check: bool,
    history: Sequence[Mapping[str, Any]] = (),
) -> web.StreamResponse:
    """A module answer streamed as Responses API events (``ResponsesFramer``)."""
    framer = ResponsesFramer(f"module:{module.name}", primary_field(module))
    return await _start_and_follow(request, runtime, module, value, check, framer, history)
