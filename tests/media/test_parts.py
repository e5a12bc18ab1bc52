"""Provider parts for each media category, and provider bodies that splice the media bytes in
while being written."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any

from proxy.media.facts import Facts
from proxy.media.model import Media
from proxy.media.parts import ENCODE_SLICE, body, part, user_content
from tests.media import samples


def media(index: int, media_type: str, category: str, data: bytes) -> Media:
    return Media(index, f"input.m[{index}]", "base64", media_type, category, data, Facts())  # type: ignore[arg-type]


def written(payload: dict[str, Any], items: list[Media]) -> bytes:
    out = body(payload, items)
    if isinstance(out, bytes):
        return out

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in out])

    return asyncio.run(collect())


def test_each_category_has_its_openai_part() -> None:
    wav = media(0, "audio/wav", "audio", samples.wav(0.1))
    pdf = media(1, "application/pdf", "document", samples.pdf(1))
    png = media(2, "image/png", "image", samples.PNG)
    assert part(wav) == {"type": "input_audio", "input_audio": {"data": wav.token, "format": "wav"}}
    assert part(pdf) == {
        "type": "file",
        "file": {"filename": "input-1.pdf", "file_data": f"data:application/pdf;base64,{pdf.token}"},
    }
    assert part(png)["image_url"]["url"] == f"data:image/png;base64,{png.token}"
    assert user_content("hi", []) == "hi"


def test_the_body_carries_each_media_base64_in_place_of_its_token() -> None:
    big = os.urandom(ENCODE_SLICE * 3 + 7)  # several slices, not a multiple of 3
    items = [media(0, "image/png", "image", samples.PNG), media(1, "audio/wav", "audio", big)]
    payload = {"model": "m", "messages": [{"role": "user", "content": user_content("look", items)}]}
    sent = json.loads(written(payload, items))
    content = sent["messages"][0]["content"]
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + samples.b64(samples.PNG)
    assert base64.b64decode(content[2]["input_audio"]["data"]) == big


def test_a_client_cannot_guess_a_media_token() -> None:
    item = media(0, "image/png", "image", samples.PNG)
    assert len(item.token.rsplit("-", 2)[1]) == 24  # 96 random bits per process
    # the text a client writes is sent as written, with no media bytes spliced in
    payload = {"messages": [{"role": "user", "content": "cogproxy-media-0000-0"}]}
    assert written(payload, [item]) == json.dumps(payload, separators=(",", ":")).encode()
