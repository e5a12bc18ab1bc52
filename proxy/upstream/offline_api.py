"""The offline demo provider's answers to the common ``/v1/*`` passthrough shapes.

Embeddings are deterministic unit vectors derived from a hash of each input (the same text
always gets the same vector, different texts nearly orthogonal ones); moderations flag nothing;
a plain Responses call gets the provider's fixed reply. No network, no key: ``make run`` can
show the whole drop-in surface.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import uuid
from typing import Any, Final

import orjson

from proxy.jsonshape import as_dict
from proxy.wire import response_object

DEFAULT_DIMENSIONS: Final = 1536  # text-embedding-3-small's size, so client code sized for it works
MAX_DIMENSIONS: Final = 4096  # larger requests are refused: each vector is built in memory
MAX_INPUTS: Final = 2048  # OpenAI's own limit on inputs per embeddings request
MAX_VALUES: Final = 1 << 20
"""Values (inputs x dimensions) one embeddings answer holds at most: about 24 MB of JSON, built in
the event loop. 2,048 inputs at 4,096 dimensions (a 15 KB body) were 8.4 million, ~8 s of CPU
and a 180 MB answer."""
MODERATION_CATEGORIES: Final = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
BYTES_PER_TOKEN: Final = 4  # the same rough estimate the input check uses


class OfflineRequestError(ValueError):
    """A request the offline provider cannot answer; ``str()`` is the message for the 400."""


def _texts(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > MAX_INPUTS:
        raise OfflineRequestError(f"'input' must hold 1 to {MAX_INPUTS} items")
    return [item if isinstance(item, str) else orjson.dumps(item).decode() for item in items]


def vector(text: str, dimensions: int) -> list[float]:
    """A unit vector that depends only on ``text`` and ``dimensions``."""
    seed = hashlib.sha256(text.encode()).digest()
    raw = bytearray()
    block = 0
    while len(raw) < dimensions * 2:
        raw += hashlib.sha256(seed + block.to_bytes(4, "big")).digest()
        block += 1
    values = [(int.from_bytes(raw[2 * i : 2 * i + 2], "big") / 32767.5) - 1.0 for i in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embeddings(body: dict[str, Any], model: str) -> dict[str, Any]:
    texts = _texts(body.get("input"))
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if (
        not isinstance(dimensions, int)
        or isinstance(dimensions, bool)
        or not 1 <= dimensions <= MAX_DIMENSIONS
    ):
        raise OfflineRequestError(f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}")
    if len(texts) * dimensions > MAX_VALUES:
        raise OfflineRequestError(
            f"The offline demo provider answers at most {MAX_VALUES} values (inputs x dimensions) "
            "per embeddings request: send fewer inputs or fewer dimensions"
        )
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        values = vector(text, dimensions)
        encoded: Any = (
            base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode() if as_base64 else values
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(max(1, len(t) // BYTES_PER_TOKEN) for t in texts)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def moderations(body: dict[str, Any], model: str) -> dict[str, Any]:
    results = [
        {
            "flagged": False,
            "categories": dict.fromkeys(MODERATION_CATEGORIES, False),
            "category_scores": dict.fromkeys(MODERATION_CATEGORIES, 0.0),
            "category_applied_input_types": {c: ["text"] for c in MODERATION_CATEGORIES},
        }
        for _ in _texts(body.get("input"))
    ]
    return {"id": f"modr-{uuid.uuid4().hex}", "model": model, "results": results}


def response(body: dict[str, Any], model: str, reply: str) -> dict[str, Any]:
    prompt_tokens = len(orjson.dumps(as_dict(body).get("input", ""))) // BYTES_PER_TOKEN
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(reply) // BYTES_PER_TOKEN}
    return response_object(model, reply, usage)
