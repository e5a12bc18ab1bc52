"""The chunks of a streamed module answer (spec v2.5 §3.2.1-3.2.3, §3.2.6) and their schema.

Every chunk after ``meta`` carries a ``seq`` (``chunk.seq`` in delta and snapshot chunks, a
top-level ``seq`` in progress, final and error chunks), from 1 with no gap, so a recovery from
``last_seq + 1`` is exact whatever kind of chunk was last seen. Heartbeats are empty and carry
none. A checkpoint's ``offset`` counts the UTF-8 bytes of the field's accumulated text and its
``hash`` is the first 6 hex digits of that text's SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

from proxy.jsonshape import as_dict

Kind = Literal["chunk", "progress", "final", "error"]
"""The SSE event name of a stored chunk (``meta`` is per connection and never stored)."""
CHUNK_SCHEMA_FILE = "stream-chunk.schema.json"
HEARTBEAT: dict[str, Any] = {}
PENDING_EXPLAIN = "Streaming: the decision comes with the final chunk"
RETRY_AFTER_MS = 1000
"""What an interrupted stream's error chunk asks the client to wait before resuming."""
MAX_RETRIES = 3
"""Resumptions a client is told to attempt (spec §3.2.6.5)."""
ANSWER_KEY = "_answer"
"""The proxy's own key on a stored final or error chunk: ``{"status", "envelope"}``, the decided
answer as the sync call answers it (HTTP status and envelope). The OpenAI-wire framers build their
content from it; every transport strips it from the chunk it sends (``without_answer``)."""


CHECKPOINT_MARK = b'"checkpoint":{"offset":'
"""Bytes only a delta holds among stored ``chunk`` events (what ``follow`` looks for instead of
parsing each one): a key ``checkpoint`` whose value is an object, ``offset`` first (as
``checkpoint`` builds it). A snapshot's field names and texts are JSON strings, whose quotes are
escaped, and its values are never objects: ``"checkpoint"`` may occur in one, this never."""


def checkpoint(text: str) -> dict[str, Any]:
    raw = text.encode("utf-8")
    return {"offset": len(raw), "hash": hashlib.sha256(raw).hexdigest()[:6]}


def kind_of(chunk: Mapping[str, Any]) -> Kind:
    if "chunk" in chunk:
        return "chunk"
    if "progress" in chunk:
        return "progress"
    return "final" if chunk.get("final") is True else "error"


def meta_chunk(
    session_id: str,
    *,
    trace_id: str = "",
    resume_from_seq: int | None = None,
    warnings: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The first chunk of every response; ``confidence`` and ``risk`` are null until decided."""
    meta: dict[str, Any] = {"confidence": None, "risk": None, "explain": PENDING_EXPLAIN}
    if trace_id:
        meta["trace_id"] = trace_id
    chunk: dict[str, Any] = {"ok": True, "streaming": True, "session_id": session_id, "meta": meta}
    if resume_from_seq is not None:
        chunk["resumed"] = True
        chunk["resume_from_seq"] = resume_from_seq
    if warnings:
        chunk["_warnings"] = warnings
    return chunk


def delta_chunk(seq: int, field: str, delta: str, accumulated: str) -> dict[str, Any]:
    return {
        "chunk": {
            "seq": seq,
            "type": "delta",
            "field": field,
            "delta": delta,
            "checkpoint": checkpoint(accumulated),
        }
    }


def snapshot_chunk(seq: int, data: dict[str, str]) -> dict[str, Any]:
    """The streamed fields' whole state; ``{}`` resets them (an answer set aside)."""
    return {"chunk": {"seq": seq, "type": "snapshot", "data": data}}


def progress_chunk(seq: int, stage: str, from_rung: str, to_rung: str, reason: str) -> dict[str, Any]:
    verb = {"escalating": "escalating to", "reasking": "re-asking", "retrying": "retrying on"}[stage]
    return {
        "seq": seq,
        "progress": {
            "percent": 0,
            "stage": stage,
            "message": f"Answer on {from_rung} set aside ({reason}); {verb} {to_rung}",
            "from_rung": from_rung,
            "to_rung": to_rung,
            "reason": reason,
        },
    }


def spec_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """OpenAI usage -> the spec's ``input_tokens``/``output_tokens``/``total_tokens``."""

    def count(*keys: str) -> int:
        for key in keys:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return 0

    given = count("prompt_tokens", "input_tokens")
    made = count("completion_tokens", "output_tokens")
    return {
        "input_tokens": given,
        "output_tokens": made,
        "total_tokens": count("total_tokens") or given + made,
    }


def final_chunk(
    seq: int, envelope: Mapping[str, Any], usage: Mapping[str, Any], cognitive: dict[str, Any]
) -> dict[str, Any]:
    """The decided success envelope (``ok: true``, which the spec's example leaves out)."""
    return {
        "seq": seq,
        "final": True,
        "ok": True,
        "meta": envelope.get("meta"),
        "data": envelope.get("data"),
        "usage": spec_usage(usage),
        "cognitive": cognitive,
    }


def error_chunk(
    seq: int | None,
    session_id: str,
    envelope: Mapping[str, Any],
    *,
    cognitive: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A failure envelope as the stream's last chunk (with its ``meta``, which the spec's
    example leaves out); ``recovery`` when the session can still be resumed."""
    error = dict(as_dict(envelope.get("error")))
    if recovery is not None:
        error["recoverable"] = True
        error["recovery"] = recovery
    chunk: dict[str, Any] = {
        "ok": False,
        "streaming": True,
        "session_id": session_id,
        "meta": envelope.get("meta"),
        "error": error,
    }
    if seq is not None:
        chunk["seq"] = seq
    if isinstance(envelope.get("partial_data"), dict):
        chunk["partial_data"] = envelope["partial_data"]
    if cognitive is not None:
        chunk["cognitive"] = cognitive
    return chunk


def with_answer(chunk: dict[str, Any], status: int, envelope: Mapping[str, Any]) -> dict[str, Any]:
    """``chunk`` (final or error) carrying the decided answer under ``ANSWER_KEY``."""
    chunk[ANSWER_KEY] = {"status": status, "envelope": envelope}
    return chunk


def without_answer(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """Remove ``ANSWER_KEY`` from ``chunk``; return it (``{"status", "envelope"}``) or None."""
    answer = chunk.pop(ANSWER_KEY, None)
    return answer if isinstance(answer, dict) else None


def recovery_info(last_seq: int, last_checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "last_seq": last_seq,
        "retry_after_ms": RETRY_AFTER_MS,
        "max_retries": MAX_RETRIES,
    }
    if last_checkpoint is not None:
        info["last_checkpoint"] = last_checkpoint
    return info
