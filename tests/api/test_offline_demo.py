"""The offline demo tells the truth: `make run`'s policy through a live proxy and the openai SDK."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from proxy.cli import main
from proxy.contract.engine import check_answer
from proxy.module.loader import load_module
from proxy.upstream.offline import DEMO_EXPLAIN, demo_answer
from tests.conftest import MODULES, ROOT
from tests.proxy_server import cognitive_of, running_proxy


def demo_policy() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    return doc


async def test_an_unseen_input_gets_a_marked_demo_answer_that_escalates_then_goes_to_review(
    tmp_path: Path,
) -> None:
    async with running_proxy(tmp_path, demo_policy()) as px:
        client = px.client()
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-reviewer",
            messages=[{"role": "user", "content": json.dumps({"code": "print('I hate Mondays')"})}],
        )
        envelope = json.loads(raw.parse().choices[0].message.content or "")
        assert envelope["ok"] is True
        assert envelope["meta"]["explain"] == DEMO_EXPLAIN
        assert envelope["meta"]["confidence"] < 0.5
        assert envelope["meta"]["model"] == "offline/large"
        assert "no model was called" in envelope["data"]["rationale"]
        assert raw.headers["x-cognitive-decision"] == "review"
        attempts = cognitive_of(raw.parse())["attempts"]
        assert [a["outcome"] for a in attempts] == ["escalate", "review"]


async def test_an_exact_golden_input_gets_its_answer_with_the_real_model_and_latency(tmp_path: Path) -> None:
    case = MODULES / "code-reviewer" / "tests" / "case_sql_injection"
    recorded = json.loads(case.with_suffix(".expected.json").read_text())
    async with running_proxy(tmp_path, demo_policy()) as px:
        raw = await px.client().chat.completions.with_raw_response.create(
            model="module:code-reviewer",
            messages=[{"role": "user", "content": case.with_suffix(".input.json").read_text()}],
        )
    envelope = json.loads(raw.parse().choices[0].message.content or "")
    assert envelope["data"] == recorded["data"]
    assert envelope["meta"]["model"].startswith("offline/")
    assert envelope["meta"]["latency_ms"] != recorded["meta"]["latency_ms"]


@pytest.mark.parametrize("tier", ["exec", "decision", "exploration"])
def test_the_demo_answer_is_a_valid_envelope_for_every_tier(
    tier: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["new", "senti", "--tier", tier, "--dir", str(tmp_path)]) == 0
    (tmp_path / "in.json").write_text(json.dumps({"text": "I hate Mondays"}))
    capsys.readouterr()
    assert main(["run", str(tmp_path / "senti"), "--input", str(tmp_path / "in.json")]) == 0
    envelope = json.loads(capsys.readouterr().out)
    assert envelope["ok"] is True and envelope["meta"]["explain"] == DEMO_EXPLAIN
    assert envelope["data"]["label"] == "positive"  # the schema's first value, marked as a demo
    assert envelope["meta"]["model"] == "offline/examples"


@pytest.mark.parametrize("module", sorted(p.name for p in MODULES.iterdir() if p.is_dir()))
def test_every_bundled_module_gets_a_valid_demo_answer(module: str) -> None:
    loaded = load_module(MODULES / module)
    result = check_answer(demo_answer(loaded), loaded)
    assert result.passed, result.violations
    assert result.envelope["ok"] is True


async def test_embeddings_moderations_responses_and_model_retrieval_work_offline(tmp_path: Path) -> None:
    async with running_proxy(tmp_path, demo_policy()) as px:
        client = px.client()
        first = await client.embeddings.create(model="text-embedding-3-small", input=["cat", "dog"])
        again = await client.embeddings.create(model="text-embedding-3-small", input="cat")
        floats = await client.embeddings.create(
            model="text-embedding-3-small", input="cat", encoding_format="float", dimensions=8
        )
        cat, dog = (d.embedding for d in first.data)
        assert len(cat) == 1536 and math.isclose(sum(v * v for v in cat), 1.0, rel_tol=1e-4)
        assert again.data[0].embedding == pytest.approx(cat, abs=1e-6)
        assert dog != cat and len(floats.data[0].embedding) == 8

        moderation = await client.moderations.create(input="hello")
        assert moderation.results[0].flagged is False

        answer = await client.responses.create(model="gpt-4o-mini", input="Hello!")
        assert "offline demo provider" in answer.output_text
        stream = await client.responses.create(model="gpt-4o-mini", input="Hello!", stream=True)
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"

        listed = [m.id for m in (await client.models.list()).data]
        for model_id in listed:
            assert (await client.models.retrieve(model_id)).id == model_id
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("no-such-model")
        assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]

        with pytest.raises(openai.NotFoundError) as unsupported:
            await client.images.generate(prompt="a cat")
        assert "offline demo provider" in unsupported.value.message


async def test_a_gzip_body_to_the_offline_passthrough_is_inflated(tmp_path: Path) -> None:
    """The server leaves bodies compressed (passthrough forwards them as sent); the offline
    provider reads them itself, so it inflates them under the body limit like every parsed route."""
    async with running_proxy(tmp_path, demo_policy()) as px, aiohttp.ClientSession() as session:
        body = gzip.compress(json.dumps({"model": "text-embedding-3-small", "input": "cat"}).encode())
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        async with session.post(px.base + "/embeddings", data=body, headers=headers) as resp:
            assert resp.status == 200
            assert len((await resp.json())["data"][0]["embedding"]) == 1536


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/embeddings", "input"),
        ("/moderations", "input"),
        ("/responses", "input"),
        ("/embeddings", "metadata"),
        ("/responses", "metadata"),
    ],
)
async def test_a_body_too_deep_to_encode_is_a_400_from_the_offline_passthrough(
    path: str, field: str, tmp_path: Path
) -> None:
    """The offline provider re-encodes parts of the body (token counts, texts to embed), and orjson
    writes at most ~254 levels: a body nested deeper was a 500 (found probing `make run`); it is the
    caller's 400 with the chat passthrough's code, and a body just under the limit still answers."""
    async with running_proxy(tmp_path, demo_policy()) as px, aiohttp.ClientSession() as session:
        for depth, status in ((200, 200), (600, 400), (1000, 400)):
            nested = "[" * depth + '"cat"' + "]" * depth
            body = f'{{"model": "text-embedding-3-small", "input": "cat", "{field}": {nested}}}'
            headers = {"Content-Type": "application/json"}
            async with session.post(px.base + path, data=body, headers=headers) as resp:
                answer = await resp.json()
                assert resp.status == status, (depth, answer)
                if status == 400:
                    assert answer["error"]["code"] == "too_deeply_nested"
                    assert "nests more than about 250 levels" in answer["error"]["message"]
