"""Media inputs end to end: the bundled image-describer through the proxy to a scripted upstream
that records the parts it received (OpenAI and Anthropic wires), modality routing, E4011."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from PIL import Image

from proxy.upstream.offline import DEMO_EXPLAIN
from tests.conftest import MODULES, ROOT
from tests.fake_upstream import FakeUpstream
from tests.media import samples
from tests.proxy_server import UPSTREAM_KEY, UPSTREAM_KEY_ENV, running_proxy, upstream_policy

ANSWER = json.dumps(
    {
        "ok": True,
        "meta": {"confidence": 0.91, "risk": "low", "explain": "A purple rectangle."},
        "data": {
            "rationale": "One flat colour fills the frame.",
            "description": "A purple rectangle.",
            "objects": [{"label": "rectangle", "confidence": 0.91}],
            "tags": ["purple"],
        },
    }
)


def image_input(*items: dict[str, Any]) -> dict[str, Any]:
    return {"input": {"prompt": "What is this?", "images": list(items)}}


def inline(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"type": "base64", "media_type": media_type, "data": samples.b64(data), **extra}


async def execute(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/modules/image-describer/execute", json=body) as resp,
    ):
        return resp.status, await resp.json()


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)


async def test_openai_receives_image_url_parts_with_the_exact_bytes(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("cheap", ANSWER)
    jpeg = samples.image("JPEG", (50, 40))
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy:
        status, env = await execute(
            proxy.url, image_input(inline("image/png", samples.PNG), inline("image/jpg", jpeg))
        )
    assert status == 200 and env["ok"] is True, env
    (sent,) = [r.json for r in fake_upstream.requests]
    system, user = sent["messages"]
    text, first, second = user["content"]
    assert first == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + samples.b64(samples.PNG)},
    }
    assert second["image_url"]["url"] == "data:image/jpeg;base64," + samples.b64(jpeg)
    # $MEDIA_INPUTS became a description; the input shows descriptions, never the bytes.
    assert "- media 0 (input.images[0]): image, image/png" in system["content"]
    assert "32x24 px" in system["content"] and "50x40 px" in system["content"]
    assert "$MEDIA_INPUTS" not in system["content"]
    assert samples.b64(samples.PNG) not in text["text"] and '"media_type": "image/jpeg"' in text["text"]
    validated = env["meta"]["media_validation"]
    assert validated["input_count"] == 2
    assert [v["dimensions"] for v in validated["validated"]] == [
        {"width": 32, "height": 24},
        {"width": 50, "height": 40},
    ]


async def test_anthropic_receives_image_blocks(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    fake_upstream.script("claude-x", ANSWER)
    policy = upstream_policy(
        fake_upstream,
        ladder=[{"name": "fast", "targets": ["anth/claude-x"]}, {"name": "strong", "targets": ["up/strong"]}],
    )
    async with running_proxy(tmp_path, policy) as proxy:
        status, env = await execute(proxy.url, image_input(inline("image/webp", samples.WEBP)))
    assert status == 200 and env["ok"] is True, env
    (sent,) = [r.json for r in fake_upstream.requests]
    (message,) = sent["messages"]
    assert message["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/webp", "data": samples.b64(samples.WEBP)},
    }


async def test_a_target_that_cannot_take_images_is_skipped_like_an_unavailable_one(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.script("strong", ANSWER)
    policy = upstream_policy(
        fake_upstream,
        ladder=[
            {"name": "fast", "targets": ["up/cheap", "up/strong"]},
            {"name": "strong", "targets": ["up/strong"]},
        ],
        modalities={"up/cheap": ["text"]},
    )
    async with running_proxy(tmp_path, policy) as proxy:
        status, env = await execute(proxy.url, image_input(inline("image/png", samples.PNG)))
    assert status == 200 and env["meta"]["model"] == "up/strong"
    assert [r.model for r in fake_upstream.requests] == ["strong"]


async def test_no_target_for_the_modality_is_e4011_and_nothing_is_sent(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = upstream_policy(fake_upstream, modalities={"up": ["text", "audio"]})
    async with running_proxy(tmp_path, policy) as proxy:
        status, env = await execute(proxy.url, image_input(inline("image/png", samples.PNG)))
    assert (status, env["error"]["code"]) == (422, "E4011")
    assert env["error"]["details"]["modalities"] == ["image"]
    assert fake_upstream.requests == []


@pytest.mark.parametrize(
    ("item", "code", "status"),
    [
        (inline("image/png", samples.JPEG), "E1014", 415),
        (inline("image/bmp", samples.PNG), "E1010", 415),
        (inline("application/pdf", samples.pdf(1)), "E1010", 415),
        ({"type": "base64", "media_type": "image/png", "data": "not base64!"}, "E1013", 400),
        (inline("image/png", samples.png_header(9000, 20)), "E1015", 400),
        (inline("image/png", samples.png_header(5, 20)), "E1016", 400),
        (inline("image/png", samples.png_header(60000, 60000)), "E1017", 400),
        (inline("image/png", samples.PNG, checksum={"algorithm": "md5", "value": "0" * 32}), "E1001", 400),
        ({"type": "upload_ref", "upload_id": "upl_1"}, "E4011", 422),
        ({"type": "file", "path": "../code-reviewer/module.yaml"}, "E1012", 422),
        ({"type": "url", "url": "http://example.com/a.png"}, "E1012", 422),
    ],
)
async def test_refused_media_never_reach_the_upstream(
    fake_upstream: FakeUpstream, tmp_path: Path, item: dict[str, Any], code: str, status: int
) -> None:
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy:
        got_status, env = await execute(proxy.url, image_input(item))
    assert (got_status, env["error"]["code"]) == (status, code), env
    assert fake_upstream.requests == []


async def test_strip_metadata_removes_exif_before_sending(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    exif = Image.Exif()
    exif[0x010F] = "SecretCam"  # Make
    exif[0x8825] = {2: (51.0, 30.0, 0.0)}  # GPS latitude
    photo = samples.image("JPEG", (40, 30), exif=exif.tobytes())
    assert b"SecretCam" in photo
    fake_upstream.script("cheap", ANSWER)
    fake_upstream.script("cheap", ANSWER)
    policy = upstream_policy(fake_upstream, media={"strip_metadata": True})
    async with running_proxy(tmp_path, policy) as proxy:
        status, env = await execute(proxy.url, image_input(inline("image/jpeg", photo)))
    assert status == 200, env
    url = fake_upstream.requests[0].json["messages"][1]["content"][1]["image_url"]["url"]
    sent = base64.b64decode(url.split(",", 1)[1])
    assert b"SecretCam" not in sent
    with Image.open(io.BytesIO(sent)) as image:
        assert image.size == (40, 30) and not image.getexif()


async def test_without_strip_metadata_the_bytes_are_sent_as_given(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    photo = samples.image("JPEG", (40, 30), exif=b"Exif\x00\x00" + Image.Exif().tobytes()[6:])
    fake_upstream.script("cheap", ANSWER)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy:
        status, _ = await execute(proxy.url, image_input(inline("image/jpeg", photo)))
    url = fake_upstream.requests[0].json["messages"][1]["content"][1]["image_url"]["url"]
    assert status == 200 and url.split(",", 1)[1] == samples.b64(photo)


async def test_escalation_resends_the_same_media_without_reading_them_again(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    low = json.loads(ANSWER)
    low["meta"]["confidence"] = 0.3
    fake_upstream.script("cheap", json.dumps(low))
    fake_upstream.script("strong", ANSWER)
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy:
        status, env = await execute(proxy.url, image_input(inline("image/png", samples.PNG)))
    assert status == 200 and env["meta"]["model"] == "up/strong"
    parts = [r.json["messages"][1]["content"][1] for r in fake_upstream.requests]
    assert [r.model for r in fake_upstream.requests] == ["cheap", "strong"]
    assert parts[0] == parts[1]


async def test_make_run_demo_answers_image_describer_offline(tmp_path: Path) -> None:
    """``make run``: policies/demo.yaml, the offline provider, the bundled module's golden input."""
    demo = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    case = json.loads((MODULES / "image-describer" / "tests" / "case_png_base64.input.json").read_text())
    async with running_proxy(tmp_path, demo) as proxy:
        status, golden = await execute(proxy.url, {"input": case})
        _, unseen = await execute(proxy.url, image_input(inline("image/png", samples.PNG)))
        _, mismatch = await execute(proxy.url, image_input(inline("image/png", samples.JPEG)))
    assert status == 200 and golden["ok"] is True and golden["meta"]["confidence"] == 0.86
    assert golden["meta"]["model"] == "offline/small" and "landscape" in golden["data"]["tags"]
    assert golden["meta"]["media_validation"]["validated"][0]["dimensions"] == {"width": 64, "height": 48}
    assert unseen["meta"]["explain"] == DEMO_EXPLAIN and "media_validation" in unseen["meta"]
    assert mismatch["error"]["code"] == "E1014"


@pytest.mark.parametrize("stream", [False, True], ids=["sync", "streamed"])
@pytest.mark.parametrize(
    "item",
    [{"type": {}}, {"type": [1], "data": "x"}, {"type": None}, {"type": 1.5, "url": "x"}],
    ids=["type an object", "type a list", "type null", "type a number"],
)
async def test_an_input_whose_type_is_not_a_string_is_a_400_not_a_crash(
    fake_upstream: FakeUpstream, tmp_path: Path, item: dict[str, Any], stream: bool
) -> None:
    """Found by schemathesis in a fresh-clone run: the media finder looked a ``type`` up in a dict
    (``TypeError: unhashable``) before the input was checked: a 500 (E4000) on both paths."""
    body = {**image_input(item), **({"stream": True} if stream else {})}
    async with running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy:
        status, env = await execute(proxy.url, body)
    assert status == 400 and env["error"]["code"] != "E4000", env
    assert fake_upstream.requests == []


@pytest.mark.parametrize("stream", [False, True], ids=["sync", "streamed"])
async def test_a_deeply_nested_input_is_a_400_not_a_crash(
    fake_upstream: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    """The media finder walked the unchecked input recursively: at a depth near the JSON parser's
    own bound it exhausted the recursion limit, and the connection hung up (no answer). The input's
    depth is checked before anything walks it."""
    depth = 1000
    images = "[" * depth + '"leaf"' + "]" * depth
    flag = ', "stream": true' if stream else ""
    raw = f'{{"input": {{"prompt": "What is this?", "images": {images}}}{flag}}}'
    async with (
        running_proxy(tmp_path, upstream_policy(fake_upstream)) as proxy,
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.url}/v1/modules/image-describer/execute",
            data=raw,
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        status, env = resp.status, await resp.json()
    assert status == 400 and env["error"]["code"] != "E4000", env
    assert fake_upstream.requests == []
