"""The load the pictures show, in three phases so that the lines move.

Module calls of every decision (accept, escalated, review, reject), repairs, contract errors and
risk disagreements, each judged over ``POST /v1/feedback`` (the fast rung over-confident, the
strong one calibrated; some verdicts replaced); plain, streamed and cut passthrough; a client
over its rate limit; a policy reload refused then applied (twice); and, as the fast rung
degrades, a failover that opens ``up/cheap``'s breaker until a trial closes it.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml

from tests.fake_upstream import FakeUpstream, Fault
from tests.test_grafana import LIMITED_KEY, PATCH_INPUT, REVIEW_INPUT, e2e_policy, patch_answer, review_answer

TICK_S = 0.2
SHADOW_RATE = 0.1
"""Pause between rounds: a steady load (some 6 module calls a second here), not a stress test."""
BREAKER_OPEN_S = 10
RELOAD_INTERVAL_S = 0.2
APP_KEY = "sk-pictures"
KEYS = f"{APP_KEY} name=app\n{LIMITED_KEY} name=limited\n"
"""The proxy's ``--api-keys-file``: the load's client, and one allowed a request a minute."""


@dataclass(frozen=True)
class Phase:
    name: str
    until: float
    """End of the phase, as a fraction of the run."""
    confident: float
    """Probability that the fast rung's answer is confident enough to be accepted."""


PHASES = (
    Phase("healthy", 0.4, 0.85),
    Phase("fast rung degraded", 0.7, 0.35),
    Phase("recovered", 1.0, 0.8),
)


def pictures_policy(fake: FakeUpstream) -> dict[str, Any]:
    """``tests/test_grafana.py``'s end-to-end policy, with a breaker that closes again."""
    policy = e2e_policy(fake)
    policy["failover"]["circuit_breaker"]["open_s"] = BREAKER_OPEN_S
    # the strong rung judges a share of code-reviewer's accepted answers (the shadow panels)
    policy["feedback"] = {"shadow": {"rate": SHADOW_RATE, "modules": ["code-reviewer"]}}
    return policy


def policy_yaml(policy: dict[str, Any]) -> str:
    return yaml.safe_dump(json.loads(json.dumps(policy)))


def review_reply(confidence: float, risk: str = "low") -> str:
    return review_answer(round(confidence, 3), risk)


class Load:
    """One scripted call after another (the fake's scripts are per model, so calls never overlap)."""

    def __init__(self, session: aiohttp.ClientSession, proxy_url: str, fake: FakeUpstream, seed: int) -> None:
        self.session, self.url, self.base, self.fake = session, proxy_url, proxy_url + "/v1", fake
        self.rng = random.Random(seed)
        self.client = openai.AsyncOpenAI(base_url=self.base, api_key=APP_KEY, max_retries=0)
        self.calls = 0
        self.refused = 0

    def _slow(self, reply: str | Fault, low: float, high: float) -> Fault:
        return reply if isinstance(reply, Fault) else Fault.slow(self.rng.uniform(low, high), reply)

    async def module(
        self, module: str, data: dict[str, Any], fast: str | Fault, strong: str, backup: str | None = None
    ) -> None:
        """One module call (the rungs' replies scripted; up/backup's is ``fast`` unless given),
        then the verdict on its answer."""
        self.fake.reset()
        self.fake.script("cheap", self._slow(fast, 0.005, 0.04))
        self.fake.script("backup", self._slow(backup or fast, 0.005, 0.04))
        self.fake.script("strong", self._slow(strong, 0.03, 0.15))
        self.fake.set_default_reply("strong", strong)  # a shadow judgement may take the scripted one
        async with self.session.post(self.base + f"/modules/{module}/execute", json={"input": data}) as resp:
            await resp.read()
            headers = resp.headers
        self.calls += 1
        trace, confidence = headers.get("X-Cognitive-Trace-Id"), headers.get("X-Cognitive-Confidence")
        if trace and confidence:
            # The fast rung is over-confident (right with probability confidence - 0.25), the strong
            # one calibrated: the calibration dashboard's reliability diagram tells them apart.
            offset = 0.25 if headers.get("X-Cognitive-Decision") == "accept" else 0.0
            correct = self.rng.random() < float(confidence) - offset
            await self.judge(trace, correct)
            if self.rng.random() < 0.05:
                await self.judge(trace, correct if self.rng.random() < 0.5 else not correct)

    async def judge(self, trace: str, correct: bool) -> None:
        body = {"trace_id": trace, "verdict": "correct" if correct else "incorrect", "source": "pictures"}
        async with self.session.post(self.base + "/feedback", json=body) as resp:
            await resp.read()

    async def code_review(self, phase: Phase) -> None:
        rng = self.rng
        confident = rng.random() < phase.confident
        fast: str | Fault = review_reply(rng.uniform(0.72, 0.99) if confident else rng.uniform(0.3, 0.69))
        if rng.random() < 0.04:
            fast = "Sure! Here is my review: looks fine."  # not JSON: a contract error, escalated
        elif rng.random() < 0.05:
            fast = review_reply(rng.uniform(0.75, 0.95), "LOW")  # repaired: enum_normalized
        await self.module("code-reviewer", REVIEW_INPUT, fast, review_reply(rng.uniform(0.6, 0.99)))

    async def config_patch(self, phase: Phase) -> None:
        rng = self.rng
        confident = rng.random() < phase.confident
        change_risk = "high" if rng.random() < 0.1 else "low"  # meta.risk understated: rejected
        fast = patch_answer(
            round(rng.uniform(0.9, 0.99) if confident else rng.uniform(0.6, 0.89), 3), change_risk
        )
        strong = patch_answer(round(rng.uniform(0.8, 0.99), 3), change_risk)
        await self.module("config-patcher", PATCH_INPUT, fast, strong)

    async def passthrough(self) -> None:
        """A plain and a streamed chat completion (a 5xx, say with both fast targets' breakers
        open, is an outcome the dashboards show, not an error of the load)."""
        self.fake.reset()
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        try:
            await self.client.chat.completions.create(model="gpt-4o-mini", messages=messages)
            stream = await self.client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, stream=True, stream_options={"include_usage": True}
            )
            async for _ in stream:
                pass
        except openai.APIStatusError as exc:
            self.refused += exc.status_code >= 500

    async def cut_stream(self) -> None:
        """A stream up/cheap ends after two frames (its breaker opens for ``BREAKER_OPEN_S``)."""
        self.fake.reset()
        self.fake.script("cheap", Fault.truncate(2))
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with self.session.post(self.base + "/chat/completions", json=body) as resp:
            await resp.read()

    async def over_the_limit(self) -> None:
        """Two requests of the client allowed one a minute: the second (at least) is a 429."""
        self.fake.reset()
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            headers = {"Authorization": f"Bearer {LIMITED_KEY}"}
            async with self.session.post(self.base + "/chat/completions", json=body, headers=headers) as resp:
                await resp.read()

    async def reload(self, policy: dict[str, Any], policy_path: Path) -> None:
        """A broken policy file (refused: result="error"), then the good one again (result="ok")."""
        for text, result in (("version: 1\nladder: []\n", "error"), (policy_yaml(policy), "ok")):
            before = await self.reloads(result)
            policy_path.write_text(text)
            while await self.reloads(result) == before:
                await asyncio.sleep(0.05)  # polled: the proxy checks the file every RELOAD_INTERVAL_S

    async def reloads(self, result: str) -> float:
        async with self.session.get(self.url + "/metrics") as resp:
            text = await resp.text()
        line = f'cognitive_policy_reloads_total{{result="{result}"}} '
        return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))

    async def failover(self) -> None:
        """up/cheap answers 500, up/backup answers: one failure opens cheap's breaker."""
        reply = review_reply(0.9)
        await self.module("code-reviewer", REVIEW_INPUT, Fault.http(500), reply, backup=reply)


async def run(
    load: Load, px_policy: dict[str, Any], policy_path: Path, duration_s: float, progress: bool = True
) -> None:
    """Drive ``load`` for ``duration_s`` seconds through the phases, with the one-off events."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    events = {
        "cut stream": (0.1, load.cut_stream),
        "policy reload": (0.2, lambda: load.reload(px_policy, policy_path)),
        "failover": (0.42, load.failover),
        "policy reload again": (0.65, lambda: load.reload(px_policy, policy_path)),
        "cut stream again": (0.8, load.cut_stream),
    }
    rounds = 0
    while (elapsed := (loop.time() - start) / duration_s) < 1:
        phase = next(p for p in PHASES if elapsed < p.until)
        for name, (at, event) in list(events.items()):
            if at <= elapsed:
                del events[name]
                await event()
        for _ in range(2):
            await load.code_review(phase)
        await load.config_patch(phase)
        if rounds % 3 == 0:
            await load.passthrough()
        if rounds % 50 == 0:
            await load.over_the_limit()
        rounds += 1
        if progress and rounds % 100 == 0:
            print(f"  {elapsed:4.0%} {phase.name}: {load.calls} module calls", flush=True)
        await asyncio.sleep(TICK_S)
