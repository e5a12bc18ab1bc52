"""``kind: offline``: the demo provider. Deterministic answers, no network, no key.

Module calls are answered from the module's own golden examples (the case whose input equals
the call's input, else the module's first success example); plain chat gets a fixed reply. It
can be scripted to answer a module with low confidence on one model, so that a first-time user
watches an escalation::

    options:
      low_confidence:
        - {model: small, module: code-reviewer, confidence: 0.42}
      reply: "Hello from the offline provider."

It exists for ``make run``, demos and tests, and is never part of ``policies/default.yaml``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.jsonshape import as_dict, as_list
from proxy.module.golden import GoldenCase, example_for, load_cases
from proxy.module.model import Module
from proxy.policy.model import ProviderConfig
from proxy.upstream.base import CallContext, Relayed, relay_from_complete
from proxy.wire import DONE, completion, completion_chunks, sse_frame

DEFAULT_REPLY = "Hello from the cognitive-proxy offline demo provider."
NO_EXAMPLE_REPLY = "I have no example answer for this input."


def offline_answer(
    module: Module, value: Any, case: GoldenCase | None = None, cases: list[GoldenCase] | None = None
) -> str:
    """The raw model text the offline provider answers ``module`` with for input ``value``."""
    example = case.example if case is not None else example_for(module, value, cases)
    if example is None:
        return NO_EXAMPLE_REPLY  # not JSON: the contract turns it into E1000, as for a real model
    return orjson.dumps(example).decode()


class OfflineProvider:
    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._reply = str(config.options.get("reply", DEFAULT_REPLY))
        self._low: dict[tuple[str, str], float] = {
            (str(rule.get("model")), str(rule.get("module"))): float(rule.get("confidence", 0.4))
            for rule in map(as_dict, as_list(config.options.get("low_confidence")))
        }
        # Golden cases read once per loaded module (a reload brings new Module objects); the
        # module is kept in the value so its id cannot be reused while cached.
        self._cases: dict[int, tuple[Module, list[GoldenCase]]] = {}

    def _cases_of(self, module: Module) -> list[GoldenCase]:
        cached = self._cases.get(id(module))
        if cached is None:
            cached = (module, load_cases(module)[0])
            self._cases[id(module)] = cached
        return cached[1]

    def _module_answer(self, model: str, ctx: CallContext) -> str:
        assert ctx.module is not None
        text = offline_answer(ctx.module, ctx.input, cases=self._cases_of(ctx.module))
        low = self._low.get((model, ctx.module.name))
        if low is None:
            return text
        answer = orjson.loads(text)
        if isinstance(answer, dict) and isinstance(answer.get("meta"), dict):
            answer["meta"] = {
                **answer["meta"],
                "confidence": low,
                "explain": f"Offline demo: scripted low confidence on model {model}.",
            }
        return orjson.dumps(answer).decode()

    async def complete(
        self, body: dict[str, Any], model: str, ctx: CallContext, timeout: float
    ) -> dict[str, Any]:
        content = self._module_answer(model, ctx) if ctx.module is not None else self._reply
        return completion(model, content, prompt_tokens=len(orjson.dumps(body.get("messages", []))) // 4)

    async def relay(self, body: dict[str, Any], model: str, ctx: CallContext, timeout: float) -> Relayed:
        return await relay_from_complete(self, body, model, ctx, timeout)

    async def stream(
        self, body: dict[str, Any], model: str, ctx: CallContext, timeout: float
    ) -> AsyncIterator[bytes]:
        include_usage = bool(as_dict(body.get("stream_options")).get("include_usage"))
        full = await self.complete(body, model, ctx, timeout)
        for chunk in completion_chunks(full, include_usage=include_usage):
            yield sse_frame(chunk)
        yield DONE
