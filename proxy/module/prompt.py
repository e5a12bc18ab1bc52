"""Prompt rendering: prompt.md with argument substitution, plus the envelope instructions."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from proxy.contract.errors import EXPLAIN_MAX
from proxy.module.model import Module, ModuleFormat
from proxy.module.references import scan

if TYPE_CHECKING:
    from proxy.media.model import Media

MEDIA_PLACEHOLDER = "$MEDIA_INPUTS"

_PLACEHOLDER = re.compile(r"\$ARGUMENTS\[(\d+)\]|\$ARGUMENTS|\$(\d+)")


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    system: str
    user: str


def arguments_of(value: Any) -> str:
    """The text ``$ARGUMENTS`` stands for: ``$ARGUMENTS``, else ``query``, else ``code``."""
    if not isinstance(value, dict):
        return ""
    for key in ("$ARGUMENTS", "query", "code"):
        if key in value:
            found = value[key]
            return found if isinstance(found, str) else orjson.dumps(found).decode()
    return ""


def substitute_arguments(text: str, value: Any) -> str:
    """Replace ``$ARGUMENTS``, ``$ARGUMENTS[N]`` and ``$N`` as the reference runtime does.

    Indexed forms take the N-th whitespace-separated word; an index past the end is left as
    written (so a literal "$5" in a prompt survives a one-word argument).
    """
    args = arguments_of(value)
    words = args.split()

    def replace(match: re.Match[str]) -> str:
        index = match.group(1) or match.group(2)
        if index is None:
            return args
        i = int(index)
        return words[i] if i < len(words) else match.group(0)

    return _PLACEHOLDER.sub(replace, text)


def _injected_value(answer: Any, path: str) -> str:
    value = answer
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def inject_results(text: str, results: Mapping[str, Any]) -> str:
    """Replace ``{{name.meta.risk}}``/``{{name.data.x}}`` with the answer of step ``name``
    (composition.md §5.4); references to names that are not steps are left as written."""
    if not results:
        return text

    pieces, at = [], 0
    for ref in scan(text).references:  # one linear pass: the text holds the client's arguments
        if ref.name in results:
            pieces += [text[at : ref.start], _injected_value(results[ref.name], ref.path)]
            at = ref.end
    return "".join([*pieces, text[at:]])


def _envelope_instructions(module: Module) -> str:
    if module.format is not ModuleFormat.V22:
        return (
            "## Response Format\n"
            "Return ONLY one JSON object that matches the output schema below, including "
            "`confidence` (a number from 0 to 1) and `rationale` (your reasoning)."
        )
    limit = module.overflow.limit
    overflow = (
        f"- `extensions.insights`: at most {limit} observations that do not fit the schema, "
        "each with `text` and `suggested_mapping`\n"
        if limit
        else "- Do not add `extensions.insights`: overflow is disabled for this module\n"
    )
    custom = (
        f"- Where the schema allows it, an enum value outside the list is written as "
        f'{{"{module.unknown_tag}": "<name>", "reason": "<why>"}}\n'
        if module.enum_strategy == "extensible"
        else "- Enum fields take only the listed values\n"
    )
    risk_source = {
        "max_changes_risk": "the highest `risk` in `data.changes`",
        "max_issues_risk": "the highest `risk` in `data.issues`",
    }
    return (
        "## Response Format (Envelope v2.2)\n"
        'Success: {"ok": true, "meta": {"confidence": <0..1>, "risk": "none|low|medium|high", '
        '"explain": "<short summary>"}, "data": {...}}\n'
        'Failure: {"ok": false, "meta": {...}, "error": {"code": "<CODE>", "message": "..."}, '
        '"partial_data": {...}}\n'
        f"- `meta.confidence`: your confidence that the answer meets this contract\n"
        f"- `meta.risk`: {risk_source.get(module.risk_rule, 'the overall risk of acting on the answer')}\n"
        f"- `meta.explain`: at most {EXPLAIN_MAX} characters\n"
        "- `data.rationale`: the complete reasoning, for audit\n"
        f"{overflow}{custom}"
        "Return ONLY valid JSON, with no text before or after it."
    )


def describe_media(media: Sequence[Media]) -> str:
    """What ``$MEDIA_INPUTS`` stands for: one line per media input (spec v2.5 §4.6)."""
    if not media:
        return "(no media inputs)"
    lines = []
    for m in media:
        facts = m.facts
        extra = f", {facts.width}x{facts.height} px" if facts.width is not None else ""
        if facts.duration_ms is not None:
            extra += f", {facts.duration_ms / 1000:g} s"
        if facts.pages is not None:
            extra += f", {facts.pages} pages"
        lines.append(
            f"- media {m.index} ({m.path}): {m.category}, {m.media_type}, {m.size} bytes{extra}; "
            f"attached after the input as {m.category} part {m.index}"
        )
    return "\n".join(lines)


def render_prompt(
    module: Module,
    value: Any,
    media: Sequence[Media] = (),
    injected: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """The system and user messages for one call of ``module`` with input ``value``; ``injected``
    holds composed step answers by name (``{{name.data.x}}``).

    ``$MEDIA_INPUTS`` is replaced before the arguments, so that argument text can never expand it;
    step answers are injected last (their text is never re-expanded).
    """
    template = module.prompt.replace(MEDIA_PLACEHOLDER, describe_media(media))
    prompt = inject_results(substitute_arguments(template, value), injected or {})
    user = "## Input\n```json\n" + orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n```"
    return RenderedPrompt(system=prompt.strip() + "\n\n" + contract_text(module), user=user)


_CONTRACT_TEXTS: dict[int, tuple[Module, str]] = {}
"""``contract_text`` per loaded module (by identity: a module holds dicts, it is not hashable);
the module is kept with its text so that its id is not reused while the entry lives."""
CONTRACT_TEXTS_MAX = 256


def contract_text(module: Module) -> str:
    """What follows the prompt in the system message, the same for every call of ``module``: the
    envelope instructions, the data schema and the excluded actions. Built once per loaded module
    (a reload builds new modules; the oldest texts go past ``CONTRACT_TEXTS_MAX``)."""
    found = _CONTRACT_TEXTS.get(id(module))
    if found is not None and found[0] is module:
        return found[1]
    parts = [_envelope_instructions(module)]
    if module.data_schema:
        parts.append("## Output schema (data)\n" + orjson.dumps(module.data_schema).decode())
    if module.excludes:
        parts.append("## This module must not\n" + "\n".join(f"- {x}" for x in module.excludes))
    text = "\n\n".join(parts)
    if len(_CONTRACT_TEXTS) >= CONTRACT_TEXTS_MAX:
        del _CONTRACT_TEXTS[next(iter(_CONTRACT_TEXTS))]
    _CONTRACT_TEXTS[id(module)] = (module, text)
    return text
