"""Running a composite module (composition.md §6-7): every step is a full module call.

    [@call directives] -> dataflow by pattern (sequential | parallel | conditional | iterative)
        -> pure dataflow: the aggregate is the answer | otherwise: the module's own call,
           with step answers injected into its prompt

Each step goes through ``runner`` (``run_module`` plus the edge's per-answer metrics): its own
contract, tier thresholds, ladder climb, decision and attempts. A required step that fails (after
its fallback) aborts the composition with its error, or with E2002 "Composition partially failed"
and ``partial_data`` per step when other steps had succeeded; an optional one becomes null and a
``_warnings`` entry. Per-step ``timeout_ms`` and the total ``timeout_ms`` cancel what still runs.

Context (context protocol §6): the composite's ``_context`` is the context object. In ``main`` mode
every step gets that one object in its ``_context`` and what a step emits (its ``_emitted_context``)
is merged into it, seen by later steps and returned by the parent; in ``fork`` mode each step gets a
copy, and what it emits stays in that copy.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.compose.paths import MISSING, Path
from proxy.compose.spec import INPUT, Composition, Flow, Requirement
from proxy.context.identity import CONTEXT_FIELD, without_context
from proxy.contract.errors import EXPLAIN_MAX, Code, Origin, error_envelope
from proxy.contract.inputs import check_input
from proxy.contract.risk import RISK_RANK
from proxy.json_schema import check
from proxy.jsonshape import as_dict, as_list
from proxy.module.model import Module
from proxy.pipeline import ModuleAnswer, ModuleRun, Step, refused_by_policies
from proxy.policy.decide import Meta, decide

Runner = Callable[[ModuleRun], Awaitable[ModuleAnswer]]
MAX_PARALLEL_STEPS = 4
"""Steps of one parallel composite in flight at once: each is a provider call (and a bill); more
would let one request fan out unboundedly against the providers' rate limits."""
WARNINGS = "_warnings"
EMITTED = "_emitted_context"


class _Abort(Exception):
    """A required step failed (after its fallback): the composition stops."""

    def __init__(self, name: str, answer: ModuleAnswer) -> None:
        super().__init__(name)
        self.name = name
        self.answer = answer


@dataclass(frozen=True, slots=True)
class StepOptions:
    optional: bool = False
    fallback: str | None = None
    timeout_s: float | None = None
    tier: str | None = None


def _options(requirement: Requirement | None) -> StepOptions:
    if requirement is None:
        return StepOptions()
    timeout = requirement.timeout_ms / 1000 if requirement.timeout_ms else None
    return StepOptions(requirement.optional, requirement.fallback, timeout)


def _ok(answer: ModuleAnswer | None) -> bool:
    return answer is not None and answer.envelope.get("ok") is True


def _map(mapping: tuple[tuple[str, Path], ...], document: Any) -> dict[str, Any]:
    out = {}
    for key, path in mapping:
        value = path.find(document)
        if value is not MISSING:
            out[key] = value
    return out


def _deep_merge(into: dict[str, Any], value: Mapping[str, Any]) -> dict[str, Any]:
    for key, item in value.items():
        if isinstance(item, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], item)
        else:
            into[key] = copy.deepcopy(item)
    return into


def aggregate(strategy: str, values: list[Any]) -> Any:
    """composition.md §4.4: ``merge`` (deep, later wins), ``array``, ``first`` non-null."""
    if strategy == "array":
        return values
    if strategy == "first":
        return next((v for v in values if v is not None), None)
    merged: dict[str, Any] = {}
    for value in values:
        if isinstance(value, Mapping):
            _deep_merge(merged, value)
    return merged


@dataclass
class _Run:
    """The state of one composite call."""

    call: ModuleRun
    composition: Composition | None
    depth: int
    context: dict[str, Any]
    results: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    required: set[str] = field(default_factory=set)
    done: dict[str, asyncio.Event] = field(default_factory=dict)
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_PARALLEL_STEPS))
    """Bounds the steps of this composite in flight (not the flows waiting for their sources)."""

    def event(self, name: str) -> asyncio.Event:
        return self.done.setdefault(name, asyncio.Event())


class Composer:
    """Runs composites over ``modules``; plain modules go straight to ``runner``."""

    def __init__(self, modules: Mapping[str, Module], runner: Runner) -> None:
        self.modules = modules
        self.runner = runner

    async def run(self, call: ModuleRun, depth: int = 0) -> ModuleAnswer:
        module = call.module
        if not module.is_composite:
            return await self.runner(call)
        started = time.perf_counter()
        bare = without_context(call.input) if isinstance(call.input, dict) else call.input
        error = None if call.input_checked else check_input(module, bare, schema=call.check_input)
        error = error or refused_by_policies(module, bare)
        if error is not None:
            return ModuleAnswer(module, error, "reject", Origin.CALLER)
        composition = module.composition
        limit = composition.max_depth if composition else 5
        if depth >= limit:
            message = f"Maximum composition depth ({limit}) exceeded at {module.name!r}"
            return ModuleAnswer(
                module, error_envelope(Code.MAX_DEPTH_EXCEEDED, message), "reject", Origin.RUNTIME
            )
        incoming = as_dict(call.input.get(CONTEXT_FIELD)) if isinstance(call.input, dict) else {}
        state = _Run(replace(call, input=bare), composition, depth, copy.deepcopy(incoming))
        total_s = (composition.timeout_ms if composition else 60000) / 1000
        background: list[asyncio.Task[None]] = []
        try:
            async with asyncio.timeout(total_s):
                background = await self._directives(state)
                if composition is not None:
                    await self._pattern(state, composition)
                answer = await self._finish(state, composition)
                if background:
                    await asyncio.gather(*background)
        except _Abort as abort:
            answer = self._aborted(state, abort)
        except TimeoutError:
            answer = self._timed_out(state, total_s)
        finally:
            for task in background:
                task.cancel()
        answer = self._with_steps(state, answer, incoming)
        meta = answer.envelope.get("meta")
        if not isinstance(meta, dict):
            return answer
        meta = dict(meta)  # _with_steps' envelope is the composite's own: completed in place
        if call.trace_id:
            meta.setdefault("trace_id", call.trace_id)
        if not answer.attempts:
            meta["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
        answer.envelope["meta"] = meta
        return answer

    # -- steps ---------------------------------------------------------------------------------

    async def _step(self, state: _Run, name: str, value: Any, options: StepOptions) -> dict[str, Any] | None:
        """Run step ``name`` (or its fallback); its envelope, or None for an optional failure."""
        answer = await self._attempt(state, name, value, options)
        if not _ok(answer) and options.fallback and options.fallback in self.modules:
            state.warnings.append(f"{name}: failed ({_code(answer)}); fallback {options.fallback} used")
            answer = await self._attempt(state, options.fallback, value, options)
        if _ok(answer):
            assert answer is not None
            state.results[name] = answer.envelope
            return answer.envelope
        state.results[name] = None
        if options.optional:
            state.warnings.append(f"{name}: optional step failed ({_code(answer)}); continued with null")
            return None
        if answer is None:
            answer = ModuleAnswer(
                state.call.module,
                error_envelope(Code.MODULE_NOT_FOUND, f"Step {name!r} is not installed"),
                "reject",
                Origin.RUNTIME,
            )
        raise _Abort(name, answer)

    async def _attempt(self, state: _Run, name: str, value: Any, options: StepOptions) -> ModuleAnswer | None:
        module = self.modules.get(name)
        if module is None:
            return None
        if options.tier is not None and options.tier != module.tier:
            module = replace(module, tier=options.tier)  # type: ignore[arg-type]
        main = state.call.module.context.mode == "main"
        context = state.context if main else copy.deepcopy(state.context)
        accepted = {k: v for k, v in context.items() if module.context.accepted(k) is not None}
        if accepted and isinstance(value, dict):  # what the step does not accept is never sent
            value = {**value, CONTEXT_FIELD: accepted}
        # a step never streams to the client: only the composite's own call may
        child = replace(
            state.call,
            module=module,
            input=value,
            check_input=True,
            input_checked=False,
            injected=None,
            listener=None,
        )
        try:
            async with state.gate:
                if options.timeout_s is None:
                    answer = await self._call(child, state.depth)
                else:
                    async with asyncio.timeout(options.timeout_s):
                        answer = await self._call(child, state.depth)
        except TimeoutError:
            message = f"Step {name!r} exceeded its timeout of {options.timeout_s * 1000:g} ms"  # type: ignore[operator]
            answer = ModuleAnswer(module, error_envelope(Code.TIMEOUT, message), "reject", Origin.RUNTIME)
        state.steps.append(Step(name, answer))
        if _ok(answer):
            _deep_merge(context, answer.emitted or as_dict(answer.envelope.get(EMITTED)))
        return answer

    async def _call(self, call: ModuleRun, depth: int) -> ModuleAnswer:
        if call.module.is_composite:
            return await self.run(call, depth + 1)
        return await self.runner(call)

    async def _directives(self, state: _Run) -> list[asyncio.Task[None]]:
        """Run the prompt's ``@call`` directives; ``async`` ones are left running (returned)."""
        waited: list[Coroutine[Any, Any, Any]] = []
        background: list[asyncio.Task[None]] = []
        for directive in state.call.module.calls:
            value = (
                state.call.input if directive.argument is None else directive.argument.find(state.call.input)
            )
            options = StepOptions(directive.optional, None, directive.timeout_s, directive.tier)
            run = self._step(state, directive.name, None if value is MISSING else value, options)
            if directive.background:
                background.append(asyncio.ensure_future(_quiet(run)))
            else:
                waited.append(run)
        await _together(waited)
        return background

    # -- patterns ------------------------------------------------------------------------------

    async def _pattern(self, state: _Run, composition: Composition) -> None:
        state.required = {r.name for r in composition.requires if not r.optional}
        flows = [f for f in composition.dataflow if not f.to_output]
        if composition.pattern == "parallel":
            await _together([self._flow(state, f, wait=True) for f in flows])
        else:
            for flow in flows:
                await self._flow(state, flow, wait=False)
        if composition.pattern == "conditional":
            await self._route(state, composition)
        elif composition.pattern == "iterative":
            await self._iterate(state, composition)

    def _source(self, state: _Run, flow: Flow) -> tuple[bool, Any]:
        """Whether the flow's sources produced something, and the document it reads."""

        def one(name: str) -> Any:
            return state.call.input if name == INPUT else state.results.get(name)

        if len(flow.sources) == 1:
            document = one(flow.sources[0])
            return document is not None, document
        documents = {name: one(name) for name in flow.sources}
        return any(v is not None for v in documents.values()), documents

    async def _flow(self, state: _Run, flow: Flow, *, wait: bool) -> None:
        if wait:
            for source in flow.sources:
                if source != INPUT and source in self._targets(state):
                    await state.event(source).wait()
        try:
            present, document = self._source(state, flow)
            skip = not present or (flow.condition is not None and not flow.condition.holds(document))
            if skip:
                for target in flow.targets:
                    state.results.setdefault(target, None)
                return
            value = _input_for(flow, document)
            requirement = state.composition.requirement if state.composition else None
            runs = [
                self._step(state, t, value, _options(requirement(t) if requirement else None))
                for t in flow.targets
            ]
            if wait:
                await _together(runs)
            else:
                await _one_by_one(runs)
        finally:
            for target in flow.targets:
                state.event(target).set()

    @staticmethod
    def _targets(state: _Run) -> set[str]:
        flows = state.composition.dataflow if state.composition else ()
        return {t for f in flows for t in f.targets}

    async def _route(self, state: _Run, composition: Composition) -> None:
        document = {INPUT: state.call.input, **{k: v for k, v in state.results.items() if v is not None}}
        for route in composition.routing:
            if route.condition.holds(document):
                if route.next is not None:
                    await self._step(
                        state, route.next, state.call.input, _options(composition.requirement(route.next))
                    )
                    state.results["$chosen"] = state.results.get(route.next)
                return
        state.warnings.append("routing: no condition held; the last step's answer is the result")

    async def _iterate(self, state: _Run, composition: Composition) -> None:
        iterate = composition.iterate
        assert iterate is not None
        value = state.call.input
        for _ in range(iterate.max_iterations):
            envelope = await self._step(
                state, iterate.module, value, _options(composition.requirement(iterate.module))
            )
            if envelope is None or iterate.until.holds(envelope):
                state.results["$chosen"] = envelope
                return
            previous = {INPUT: state.call.input, "previous": envelope}
            value = _map(iterate.mapping, previous) if iterate.mapping else state.call.input
        state.results["$chosen"] = state.results.get(iterate.module)
        state.warnings.append(
            f"{iterate.module}: 'until' did not hold after {iterate.max_iterations} iterations; "
            "the last answer is the result"
        )

    # -- the composite's answer ----------------------------------------------------------------

    async def _finish(self, state: _Run, composition: Composition | None) -> ModuleAnswer:
        call = state.call
        if composition is None or not composition.produces_output:
            injected = {k: v for k, v in state.results.items() if v is not None and not k.startswith("$")}
            value = (
                {**call.input, CONTEXT_FIELD: state.context}
                if state.context and isinstance(call.input, dict)
                else call.input
            )
            own = replace(call, input=value, injected=injected)
            return await self.runner(own)
        if "$chosen" in state.results or composition.pattern in ("conditional", "iterative"):
            chosen = state.results.get("$chosen") or _last_ok(state)
            meta = dict(as_dict(chosen.get("meta"))) if chosen else {}
            data = chosen.get("data") if chosen else None
        else:
            out = next(f for f in composition.dataflow if f.to_output)
            present, document = self._source(state, out)
            parts = [
                as_dict(state.results.get(s)).get("data") if s != INPUT else call.input for s in out.sources
            ]
            data = _map(out.mapping, document) if out.mapping and present else aggregate(out.aggregate, parts)
            meta = self._aggregate_meta(state)
            if not isinstance(data, dict):  # v2.2 data is an object: an array (or a scalar) is wrapped
                data = {"results": data}
            data.setdefault("rationale", f"{meta['explain']} ({out.aggregate})")
        violations = check(call.module.validators.data, data, "data")
        if violations:  # the composite's own contract holds for its aggregate too
            listed = "; ".join(str(v) for v in violations[:5])
            failed = error_envelope(
                Code.SCHEMA_VALIDATION_FAILED,
                f"The composed answer does not match the module's data schema: {listed}"[:1000],
                partial_data=data if isinstance(data, dict) else None,
            )
            return ModuleAnswer(call.module, failed, "reject", Origin.CONTRACT)
        envelope: dict[str, Any] = {"ok": True, "meta": meta, "data": data}
        return self._decided(state, envelope)

    def _aggregate_meta(self, state: _Run) -> dict[str, Any]:
        """confidence = min over required steps that answered (all steps if none is required),
        risk = max over every step that answered."""
        answered = {k: v for k, v in state.results.items() if v is not None and not k.startswith("$")}
        required = [v for k, v in answered.items() if k in state.required] or list(answered.values())
        confidences = [float(as_dict(v.get("meta")).get("confidence", 0.0)) for v in required]
        risks = [str(as_dict(v.get("meta")).get("risk", "high")) for v in answered.values()]
        risk = max(risks, key=lambda r: RISK_RANK.get(r, RISK_RANK["high"]), default="high")
        names = ", ".join(answered) or "none"
        return {
            "confidence": min(confidences, default=0.0),
            "risk": risk,
            "explain": f"Composed from {names}"[:EXPLAIN_MAX],
        }

    def _decided(self, state: _Run, envelope: dict[str, Any]) -> ModuleAnswer:
        """The composite's own tier thresholds decide on the aggregate (no rung left to climb)."""
        module, policy = state.call.module, state.call.policy
        thresholds = policy.thresholds_for(module.name, module.tier)
        meta = as_dict(envelope.get("meta"))
        rungs = max(len(policy.ladder), 1)
        decision = decide(
            thresholds,
            Meta(float(meta.get("confidence", 0.0)), str(meta.get("risk", "high"))),
            rungs - 1,
            rungs,
        )
        if decision.action == "reject":
            rejected = error_envelope(
                Code.LOW_CONFIDENCE,
                f"Composite {module.name!r} ({module.tier} tier) answer rejected: {decision.reason}",
                meta={**meta, "explain": f"Rejected by policy: {decision.reason}"[:EXPLAIN_MAX]},
                partial_data=as_dict(envelope.get("data")) or None,
            )
            return ModuleAnswer(module, rejected, "reject", Origin.POLICY)
        return ModuleAnswer(module, envelope, decision.action, Origin.MODEL)

    def _partial_data(self, state: _Run) -> dict[str, Any]:
        names = state.composition.steps if state.composition else ()
        names = tuple(dict.fromkeys([*names, *(c.name for c in state.call.module.calls)]))
        return {n: as_dict(state.results.get(n)).get("data") if state.results.get(n) else None for n in names}

    def _aborted(self, state: _Run, abort: _Abort) -> ModuleAnswer:
        module = state.call.module
        succeeded = [k for k, v in state.results.items() if v is not None and not k.startswith("$")]
        if not succeeded:
            return replace(abort.answer, module=module, attempts=(), steps=())
        error = as_dict(abort.answer.envelope.get("error"))
        meta = self._aggregate_meta(state)
        explain = f"Step {abort.name} failed ({error.get('code', '?')}); completed: {', '.join(succeeded)}"
        envelope = error_envelope(
            Code.TIMEOUT,
            "Composition partially failed",
            suggestion="error.details.step_error is the failed step's error; partial_data has the others'",
            meta={**meta, "explain": explain[:EXPLAIN_MAX]},
            details={
                "failed_step": abort.name,
                "step_error": {"code": error.get("code"), "message": error.get("message")},
            },
            partial_data=self._partial_data(state),
        )
        return ModuleAnswer(module, envelope, "reject", Origin.RUNTIME)

    def _timed_out(self, state: _Run, total_s: float) -> ModuleAnswer:
        envelope = error_envelope(
            Code.TIMEOUT,
            f"Composition timed out after {total_s * 1000:g} ms",
            partial_data=self._partial_data(state),
        )
        return ModuleAnswer(state.call.module, envelope, "reject", Origin.RUNTIME)

    def _with_steps(self, state: _Run, answer: ModuleAnswer, incoming: Mapping[str, Any]) -> ModuleAnswer:
        """The composite's answer with its steps' warnings and (``main`` mode) what they emitted, in
        a new envelope (the answer's own is not edited)."""
        envelope = dict(answer.envelope)
        if state.warnings:
            envelope[WARNINGS] = [*as_list(envelope.get(WARNINGS)), *state.warnings]
        if state.call.module.context.mode == "main":
            emitted = {k: v for k, v in state.context.items() if incoming.get(k) != v}
            if emitted and envelope.get("ok") is True:
                envelope[EMITTED] = {**as_dict(envelope.get(EMITTED)), **emitted}
        return replace(answer, envelope=envelope, steps=tuple(state.steps) + answer.steps)


def _code(answer: ModuleAnswer | None) -> str:
    if answer is None:
        return "E4006: not installed"
    error = as_dict(answer.envelope.get("error"))
    return f"{error.get('code', '?')}: {str(error.get('message', ''))[:120]}"


def _last_ok(state: _Run) -> dict[str, Any] | None:
    for step in reversed(state.steps):
        if _ok(step.answer):
            return step.answer.envelope
    return None


def _input_for(flow: Flow, document: Any) -> Any:
    if flow.mapping is not None:
        return _map(flow.mapping, document)
    if len(flow.sources) == 1:
        return document if flow.sources[0] == INPUT else as_dict(document).get("data")
    return {k: (as_dict(v).get("data") if k != INPUT else v) for k, v in as_dict(document).items()}


async def _quiet(run: Awaitable[Any]) -> None:
    """An ``async`` directive: its failure is a warning (recorded by ``_step``), never an abort."""
    try:
        await run
    except _Abort:
        return


async def _one_by_one(runs: list[Coroutine[Any, Any, Any]]) -> None:
    """Await ``runs`` in order; those left when one fails are closed, never started."""
    try:
        for run in runs:
            await run
    finally:
        for run in runs:
            run.close()  # a no-op on those that ran


async def _together(runs: list[Coroutine[Any, Any, Any]]) -> None:
    """Await ``runs`` concurrently (steps are bounded by the composite's gate); the first failure
    cancels the rest and is raised."""
    if len(runs) <= 1:
        await _one_by_one(runs)
        return
    try:
        async with asyncio.TaskGroup() as group:
            for run in runs:
                group.create_task(run)
    except* _Abort as caught:
        raise caught.exceptions[0] from None
