"""Finding the media inputs of a call and turning each into a validated ``Media`` (spec v2.5
§4.3, §4.5), or the ``MediaError`` that refuses the call before any provider is asked.

Per input: read (base64 strictly decoded, a ``file`` confined to the module directory, a URL
fetched safely), each capped by its category's size while reading -> magic bytes against the
declared type (E1014) -> checksum -> header facts (E1015-E1017, duration/pages) -> optional
EXIF strip. Every byte held is reserved in the in-flight memory budget first.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from proxy.media import checksum
from proxy.media.cache import ClientCache, Fetched
from proxy.media.decode import decode_strict, decoded_size
from proxy.media.facts import Buffer, Facts, open_image, read_facts
from proxy.media.fetch import fetch
from proxy.media.model import Media
from proxy.media.sniff import HEAD_BYTES, candidates, matches
from proxy.media.types import ALLOWED, BY_EXTENSION, LIMITS, MediaCategory, MediaError, normalise
from proxy.policy.model import MediaPolicy

FORMS = {"url": "url", "base64": "data", "file": "path", "upload_ref": "upload_id"}
"""Spec v2.5 §4.3: each form and the field that carries it."""
MAX_MEDIA_PER_CALL = 32
"""More media inputs than any provider takes in one message; bounds the work of one call."""
FILE_CHUNK = 1024 * 1024


class MemoryBudget(Protocol):
    """The in-flight memory budget of the request (``proxy.api.budget.Reservation``)."""

    async def grow(self, size: int) -> None: ...


class NoBudget:
    """For calls outside a request (CLI runs): nothing to reserve against."""

    async def grow(self, size: int) -> None:
        return None


class FetchWatch(Protocol):
    """Wraps each URL fetch of a call (tracing: one span per fetch); the media layer names no tracer."""

    def __call__(self, url: str, fetching: Awaitable[Fetched]) -> Awaitable[Fetched]: ...


@dataclass(frozen=True, slots=True)
class Found:
    path: str
    item: dict[str, Any]


def is_media(value: Any) -> bool:
    """A media input: an object whose ``type`` names a form and which carries that form's field
    (``type`` may be anything a client sent: it is checked to be a string before it is looked up)."""
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    return isinstance(kind, str) and FORMS.get(kind) in value


def find(value: Any, path: str = "input") -> Iterator[Found]:
    """Every media input in ``value``, depth first, in document order."""
    if is_media(value):
        yield Found(path, value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from find(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from find(item, f"{path}[{i}]")


def replaced(value: Any, media: Sequence[Media]) -> Any:
    """``value`` with each media input replaced by its description (what the prompt shows).
    Matched by input path, so fields added beside the checked input (``_context``) stay as they are."""
    return _replace(value, {m.path: m.describe() for m in media}, "input")


def stubbed(value: Any) -> Any:
    """``value`` with each media input replaced by a stub: what its text costs without the bytes
    (the input's token estimate; the bytes travel as parts, not as prompt text)."""
    stubs = {found.path: {"type": found.item["type"], "media": i} for i, found in enumerate(find(value))}
    return _replace(value, stubs, "input")


def _replace(value: Any, by_path: dict[str, dict[str, Any]], path: str) -> Any:
    if path in by_path and is_media(value):
        return by_path[path]
    if isinstance(value, dict):
        return {k: _replace(v, by_path, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, by_path, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _category(media_type: str, where: str, accepted: frozenset[str]) -> MediaCategory:
    category = ALLOWED.get(media_type)
    if category is None:
        raise MediaError(
            "E1010",
            f"{where}: media type {media_type!r} is not supported",
            {"media_type": media_type, "supported": sorted(ALLOWED)},
        )
    if category not in accepted:
        raise MediaError(
            "E1010",
            f"{where}: {category} input is not among the module's modalities ({', '.join(sorted(accepted))})",
            {"media_type": media_type, "modalities": sorted(accepted)},
        )
    return category


def _declared(item: dict[str, Any], where: str) -> str | None:
    raw = item.get("media_type")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise MediaError("E1010", f"{where}.media_type must be a string", {})
    return normalise(raw)


def _max_cap(accepted: frozenset[str]) -> int:
    caps = [LIMITS[c].max_bytes for c in LIMITS if c in accepted]
    return max(caps, default=0)


@dataclass(frozen=True, slots=True)
class MediaRequest:
    """What ``prepare`` needs besides the input itself."""

    module_dir: Path
    accepted: frozenset[str]
    """The module's input modalities."""
    settings: MediaPolicy
    deadline: float
    budget: MemoryBudget
    cache: ClientCache | None = None
    watch: FetchWatch | None = None


async def _read_file(item: dict[str, Any], where: str, req: MediaRequest) -> tuple[Buffer, str, str]:
    raw = item.get("path")
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise MediaError("E1012", f"{where}.path must be a non-empty path", {"reason": "bad path"})
    path = module_file(req.module_dir, raw)
    if path is None:
        raise MediaError(
            "E1012", f"{where}: {raw!r} is not a file of the module directory", {"reason": NOT_A_MODULE_FILE}
        )
    media_type = _declared(item, where) or BY_EXTENSION.get(path.suffix.lower(), "")
    category = _category(media_type or f"(unknown extension {path.suffix!r})", where, req.accepted)
    cap = LIMITS[category].max_bytes
    size = path.stat().st_size
    if size > cap:
        raise MediaError(
            "E1011", f"{where} is {size} bytes; the limit is {cap}", {"size_bytes": size, "max_bytes": cap}
        )
    await req.budget.grow(size)
    data = await asyncio.to_thread(_read_capped, path, cap, where)
    return data, media_type, path.name


NOT_A_MODULE_FILE = "not a file of the module directory"
"""The one answer for every path that is not a regular file inside the module directory: outside
it (``..``, absolute, through a symlink), missing, a directory, a symlink loop. Distinct answers
would tell a client which files exist outside the module (issue #26 finding 7)."""


def module_file(module_dir: Path, raw: str) -> Path | None:
    """The regular file ``raw`` names inside ``module_dir`` (symlinks followed), else None.
    A path that leaves the directory lexically is refused before the filesystem is asked."""
    root = module_dir.resolve()
    if not Path(os.path.normpath(root / raw)).is_relative_to(root):
        return None
    try:
        path = (root / raw).resolve(strict=True)
        return path if path.is_relative_to(root) and path.is_file() else None
    except (OSError, RuntimeError):
        return None


def _read_capped(path: Path, cap: int, where: str) -> bytearray:
    data = bytearray()
    with path.open("rb") as handle:
        while chunk := handle.read(FILE_CHUNK):
            if len(data) + len(chunk) > cap:  # the file grew since it was measured
                raise MediaError("E1011", f"{where} is larger than {cap} bytes", {"max_bytes": cap})
            data += chunk
    return data


async def _read(item: dict[str, Any], where: str, req: MediaRequest) -> tuple[Buffer, str, str | None]:
    form = item["type"]
    if form == "upload_ref":
        raise MediaError(
            "E4011",
            f"{where}: upload_ref is not supported by this runtime (it keeps no upload store); "
            "send the media as base64 or a URL",
            {"form": "upload_ref"},
        )
    if form == "base64":
        media_type = _declared(item, where)
        if media_type is None:
            raise MediaError("E1010", f"{where}.media_type is required for base64 media (spec §4.3.2)", {})
        category = _category(media_type, where, req.accepted)
        text = item["data"]
        if not isinstance(text, str):
            raise MediaError("E1013", f"{where}.data must be a base64 string", {})
        cap = LIMITS[category].max_bytes
        if decoded_size(text) <= cap:
            await req.budget.grow(decoded_size(text))
        data = await asyncio.to_thread(decode_strict, text, where, cap)
        return data, media_type, None
    if form == "file":
        return await _read_file(item, where, req)
    url = item["url"]
    if not isinstance(url, str):
        raise MediaError("E1012", f"{where}.url must be a string", {"reason": "bad url"})
    declared = _declared(item, where)
    if declared is not None:
        _category(declared, where, req.accepted)

    def cap_for(content_type: str | None) -> int:
        for candidate in (declared, normalise(content_type) if content_type else None):
            if candidate is not None and candidate in ALLOWED:
                return LIMITS[ALLOWED[candidate]].max_bytes
        return _max_cap(req.accepted)

    fetching = fetch(url, req.settings, req.deadline, cap_for, req.budget.grow, req.cache)
    fetched = await (fetching if req.watch is None else req.watch(url, fetching))
    media_type = declared or (normalise(fetched.content_type) if fetched.content_type else "")
    if media_type not in ALLOWED:  # §4.3.1: MAY infer; neither declared nor served: the bytes say
        found = candidates(bytes(memoryview(fetched.data)[:HEAD_BYTES]))
        media_type = found[0] if found else media_type or "application/octet-stream"
    return fetched.data, media_type, fetched.url


def _check_bytes(
    data: Buffer, media_type: str, category: MediaCategory, item: dict[str, Any], where: str
) -> Facts:
    cap = LIMITS[category].max_bytes
    if len(data) > cap:
        raise MediaError(
            "E1011",
            f"{where} is {len(data)} bytes; the limit is {cap}",
            {"size_bytes": len(data), "max_bytes": cap},
        )
    head = bytes(memoryview(data)[:HEAD_BYTES])
    found = candidates(head)
    if not matches(media_type, found):
        raise MediaError(
            "E1014",
            f"{where}: media content does not match declared type {media_type}",
            {
                "declared_type": media_type,
                "detected_type": found[0] if found else None,
                # Only bytes the client sent itself: fetched bytes would make E1014 a reader of
                # whatever answered, a module's own files a reader of the module directory.
                **({"magic_bytes": head[:8].hex()} if item.get("type") == "base64" else {}),
            },
        )
    checksum.verify(data, checksum.expected(item.get("checksum"), where), where)
    return read_facts(data, media_type, category, where)


def strip_metadata(data: Buffer, where: str) -> bytes:
    """The image re-encoded in its own format without EXIF, XMP, ICC text chunks or comments.

    Its pixels are decoded here, the one step of media handling that does: pixel data that is not
    what the (already checked) header says is the client's bad input, E1013, never a 500."""
    try:
        with open_image(data) as image:
            fmt = image.format or "PNG"
            clean = image.copy()
    except Exception as exc:  # Pillow raises OSError, SyntaxError, zlib.error, ValueError ...
        raise MediaError("E1013", f"{where}: the image cannot be decoded: {exc}", {}) from None
    clean.info = {}
    out = io.BytesIO()
    options: dict[str, Any] = {"quality": 95} if fmt == "JPEG" else {}
    clean.save(out, format=fmt, **options)
    return out.getvalue()


async def _one(index: int, found: Found, req: MediaRequest) -> Media:
    where, item = found.path, found.item
    data, media_type, source = await _read(item, where, req)
    category = _category(media_type, where, req.accepted)
    facts = await asyncio.to_thread(_check_bytes, data, media_type, category, item, where)
    if req.settings.strip_metadata and category == "image" and media_type != "image/gif":
        assert facts.width is not None and facts.height is not None
        await req.budget.grow(facts.width * facts.height * 4)  # the decoded pixels
        data = await asyncio.to_thread(strip_metadata, data, where)
        facts = await asyncio.to_thread(read_facts, data, media_type, category, where)
    return Media(index, where, item["type"], media_type, category, data, facts, source)


async def prepare(value: Any, req: MediaRequest) -> tuple[Media, ...]:
    """Every media input of ``value``, validated, in document order; ``MediaError`` refuses."""
    found = list(find(value))
    if len(found) > MAX_MEDIA_PER_CALL:
        raise MediaError(
            "E1001",
            f"{len(found)} media inputs; at most {MAX_MEDIA_PER_CALL} per call",
            {"max_media": MAX_MEDIA_PER_CALL},
        )
    if time.monotonic() >= req.deadline:
        raise MediaError("E1012", "the call's deadline is spent", {})
    return tuple([await _one(i, f, req) for i, f in enumerate(found)])


def validation_meta(media: Sequence[Media]) -> dict[str, Any]:
    """``meta.media_validation`` (spec v2.5 §4.5.6)."""
    return {"input_count": len(media), "validated": [m.validation() for m in media]}
