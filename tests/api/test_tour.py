"""The README's five-minute tour, on the embedded default (demo policy, offline provider)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tests.proxy_server import cognitive_of, running_proxy


async def test_five_minute_tour_on_the_demo_policy(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "policies" / "demo.yaml").read_text())
    async with running_proxy(tmp_path, policy) as px:
        client = px.client(api_key="anything")
        reply = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}]
        )
        assert "offline demo provider" in (reply.choices[0].message.content or "")

        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello!"}], stream=True
        )
        assert "offline demo provider" in "".join([c.choices[0].delta.content or "" async for c in stream])

        code = json.loads((ROOT / "modules/code-simplifier/tests/case1.input.json").read_text())
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-simplifier", messages=[{"role": "user", "content": json.dumps(code)}]
        )
        assert raw.headers["x-cognitive-decision"] == "accept"
        assert json.loads(raw.parse().choices[0].message.content or "")["ok"] is True

        review = json.loads((ROOT / "modules/code-reviewer/tests/case_minor_issues.input.json").read_text())
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(review)}]
        )
        assert raw.headers["x-cognitive-decision"] == "escalated"
        assert raw.headers["x-cognitive-model"] == "offline/large"
        attempts = cognitive_of(raw.parse())["attempts"]
        assert [a["outcome"] for a in attempts] == ["escalate", "accept"]

        mine = {"code": "def add(a, b):\n    return a+b\n", "language": "python"}
        raw = await client.chat.completions.with_raw_response.create(
            model="module:code-reviewer", messages=[{"role": "user", "content": json.dumps(mine)}]
        )
        assert raw.headers["x-cognitive-decision"] == "review"
        assert json.loads(raw.parse().choices[0].message.content or "")["meta"]["explain"] == (
            "offline demo: no model was called"
        )

        models = [m.id for m in (await client.models.list()).data]
        assert {"gpt-4o-mini", "gpt-4o", "module:code-reviewer"} <= set(models)
