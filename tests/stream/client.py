"""Reading streamed module answers in tests: SSE and NDJSON, every chunk checked by the schema."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import aiohttp
import fastjsonschema

from proxy import schemas
from proxy.contract.validate import validate_envelope
from proxy.stream.chunks import CHUNK_SCHEMA_FILE

Event = tuple[str, dict[str, Any]]


@cache
def _chunk_validator() -> Any:
    return fastjsonschema.compile(schemas.load(CHUNK_SCHEMA_FILE))


def check_chunk(chunk: Any) -> None:
    """Raise ``fastjsonschema.JsonSchemaValueException`` unless ``chunk`` is a valid chunk."""
    _chunk_validator()(chunk)


def checked(name: str, chunk: dict[str, Any]) -> Event:
    """Validate ``chunk`` with the shipped chunk schema (and a final chunk's envelope with the
    normative envelope schema)."""
    check_chunk(chunk)
    if chunk.get("final") is True:
        envelope = {k: chunk[k] for k in ("ok", "meta", "data")}
        assert validate_envelope(envelope) == [], envelope
    return name, chunk


async def read_sse(response: aiohttp.ClientResponse, *, stop_after: int | None = None) -> list[Event]:
    """The events of an SSE module stream; ``stop_after``: return after that many sequenced chunks."""
    events: list[Event] = []
    name, data = "message", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data += line[len("data: ") :]
        elif not line and data:
            events.append(checked(name, json.loads(data)))
            name, data = "message", ""
            if stop_after is not None and len(sequenced(events)) >= stop_after:
                return events
    return events


async def read_ndjson(response: aiohttp.ClientResponse) -> list[Event]:
    events: list[Event] = []
    async for raw in response.content:
        if raw.strip():
            chunk = json.loads(raw)
            events.append(checked("ndjson", chunk))
    return events


def seq(chunk: dict[str, Any]) -> int | None:
    value = chunk.get("chunk", {}).get("seq", chunk.get("seq"))
    return value if isinstance(value, int) else None


def sequenced(events: list[Event]) -> list[dict[str, Any]]:
    return [c for _, c in events if seq(c) is not None]


def rendered(events: list[Event]) -> dict[str, str]:
    """What a client shows: deltas appended per field, a snapshot replacing the state."""
    state: dict[str, str] = {}
    for _, chunk in events:
        inner = chunk.get("chunk")
        if not isinstance(inner, dict):
            continue
        if inner["type"] == "snapshot":
            state = dict(inner["data"])
        else:
            state[inner["field"]] = state.get(inner["field"], "") + inner["delta"]
    return state
