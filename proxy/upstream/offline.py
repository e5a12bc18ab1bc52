"""``kind: offline``: the demo provider. Deterministic answers, no network, no key.

Module calls whose input equals a golden case's input get that case's example answer; any
other input gets a demo answer built from the module's data schema: a valid envelope with low
confidence whose explain says ``offline demo: no model was called`` (so the policy's escalation
and review still show). Answers name ``offline/<model>`` as their model and never carry an
example's recorded model or latency. Plain chat gets a fixed reply. It can be scripted to
answer a module with low confidence on one model, so that a first-time user watches an
escalation::

    options:
      low_confidence:
        - {model: small, module: code-reviewer, confidence: 0.42}
      reply: "Hello from the offline provider."

``options.population`` scripts a seeded synthetic population instead: confidence and correctness
on known curves (``proxy.upstream.offline_population``).

It exists for ``make run``, demos and tests, and is never part of ``policies/default.yaml``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.json_schema import check
from proxy.jsonshape import as_dict, as_list
from proxy.module.golden import GoldenCase, example_for, load_cases
from proxy.module.model import Module
from proxy.module.sample import sample
from proxy.policy.model import ProviderConfig
from proxy.upstream.base import CallInfo, Relayed, relay_from_complete
from proxy.upstream.body import Body
from proxy.upstream.offline_population import populations, wrong
from proxy.wire import DONE, completion, completion_chunks, sse_frame

DEFAULT_REPLY = "Hello from the cognitive-proxy offline demo provider."
DEMO_EXPLAIN = "offline demo: no model was called"
# Below every shipped tier's min_confidence, so a demo answer shows the ladder and the tier's
# `exhausted` outcome instead of passing for a real answer.
DEMO_CONFIDENCE = 0.2
DEMO_RATIONALE = f"{DEMO_EXPLAIN}; this answer was built from the module's schema, not from the input."
_RUNTIME_META = ("trace_id", "model", "latency_ms")  # facts of the run that recorded an example


def _as_demo(data: Any, module: Module) -> dict[str, Any] | None:
    """``data`` with a demo rationale, if it then satisfies the module's data contract."""
    if not isinstance(data, dict):
        return None
    data = dict(data)
    if "rationale" in data or "rationale" in as_dict(module.data_schema.get("properties")):
        data["rationale"] = DEMO_RATIONALE
    return None if check(module.validators.data, data, "data") else data


def demo_answer(module: Module, cases: list[GoldenCase] | None = None) -> dict[str, Any]:
    """A valid but plainly marked placeholder envelope for ``module``: data built from its data
    schema; where the schema needs more than that (a pattern, a conditional field), the data of
    the module's first success example; failing both, a failure envelope."""
    meta = {"confidence": DEMO_CONFIDENCE, "risk": "low", "explain": DEMO_EXPLAIN}
    data = _as_demo(sample(module.data_schema, module.schema), module)
    if data is None:
        examples = (c.example for c in (load_cases(module)[0] if cases is None else cases))
        for example in examples:
            if isinstance(example, dict) and example.get("ok", True) is not False:
                data = _as_demo(example.get("data"), module)
                if data is not None:
                    break
    if data is not None:
        return {"ok": True, "meta": meta, "data": data}
    error = sample(module.schema.get("error") or {"required": ["message"]}, module.schema)
    error = {**as_dict(error), "message": f"{DEMO_EXPLAIN} and no golden case matches this input"}
    return {"ok": False, "meta": {**meta, "confidence": 0.0}, "error": error}


def offline_answer(
    module: Module, value: Any, case: GoldenCase | None = None, cases: list[GoldenCase] | None = None
) -> str:
    """The raw model text the offline provider answers ``module`` with for input ``value``: the
    golden example for this exact input, else the demo answer. The example's recorded model,
    latency and trace id are dropped: whoever runs the call stamps its own."""
    example = case.example if case is not None else example_for(module, value, cases)
    if not isinstance(example, dict):
        example = demo_answer(module, cases)
    meta = example.get("meta")
    if isinstance(meta, dict):
        example = {**example, "meta": {k: v for k, v in meta.items() if k not in _RUNTIME_META}}
    return orjson.dumps(example).decode()


def _drawn(text: str, module: Module, confidence: float, right: bool) -> str:
    """An answer of a synthetic population: ``text`` reporting ``confidence``, its judged fields
    changed when it is to be wrong (``proxy.upstream.offline_population``)."""
    answer = orjson.loads(text)
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
        return text
    answer["meta"] = {**as_dict(answer.get("meta")), "confidence": confidence}
    if not right:
        answer["data"] = wrong(module, answer["data"])
    return orjson.dumps(answer).decode()


class OfflineProvider:
    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._reply = str(config.options.get("reply", DEFAULT_REPLY))
        self._low: dict[tuple[str, str], float] = {
            (str(rule.get("model")), str(rule.get("module"))): float(rule.get("confidence", 0.4))
            for rule in map(as_dict, as_list(config.options.get("low_confidence")))
        }
        self._populations = populations(config.options)
        # Golden cases read once per loaded module (a reload brings new Module objects); the
        # module is kept in the value so its id cannot be reused while cached.
        self._cases: dict[int, tuple[Module, list[GoldenCase]]] = {}

    def _cases_of(self, module: Module) -> list[GoldenCase]:
        cached = self._cases.get(id(module))
        if cached is None:
            cached = (module, load_cases(module)[0])
            self._cases[id(module)] = cached
        return cached[1]

    def _module_answer(self, model: str, ctx: CallInfo) -> str:
        assert ctx.module is not None
        text = offline_answer(ctx.module, ctx.input, cases=self._cases_of(ctx.module))
        population = self._populations.get((model, ctx.module.name))
        if population is not None:
            return _drawn(text, ctx.module, *population.draw())
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
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float
    ) -> dict[str, Any]:
        content = self._module_answer(model, ctx) if ctx.module is not None else self._reply
        return completion(model, content, prompt_tokens=len(orjson.dumps(body.get("messages", []))) // 4)

    async def relay(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Relayed:
        return await relay_from_complete(self, body, model, ctx, timeout)

    async def relay_stream(self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float) -> Body:
        """``stream``'s translated chunks, its reads left to the caller."""
        return Body.of_chunks(self.stream(body, model, ctx, timeout, bound_reads=False))

    async def stream(
        self, body: dict[str, Any], model: str, ctx: CallInfo, timeout: float, *, bound_reads: bool = True
    ) -> AsyncIterator[bytes]:
        include_usage = bool(as_dict(body.get("stream_options")).get("include_usage"))
        full = await self.complete(body, model, ctx, timeout)
        for chunk in completion_chunks(full, include_usage=include_usage):
            yield sse_frame(chunk)
        yield DONE
