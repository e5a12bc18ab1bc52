"""``@call`` directives in prompt.md (composition.md §5), parsed at load.

    @call:module-name(arguments)[options]      options: async, timeout=Ns, optional, tier=X

A line holding a directive is taken out of the prompt: the model never sees it. ``arguments`` is
``$INPUT`` (or empty: the module's whole input) or a JSONPath over the input. ``@call:name``
without an argument list is a mention, not a call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.compose.paths import Path, PathError, parse_path

DEFAULT_CALL_TIMEOUT_S = 30.0
"""composition.md §5.3: ``timeout`` defaults to 30s."""
MAX_CALL_TIMEOUT_S = 3600.0
"""A directive asking for more than an hour is a typo; the composition's own deadline bounds it too."""
_DIRECTIVE = re.compile(
    r"@call:(?P<name>[a-z0-9][a-z0-9._-]*)\((?P<args>[^)]*)\)(?:\[(?P<options>[^\]]*)\])?"
)
_MENTION = re.compile(r"@call:[a-z0-9][a-z0-9._-]*(?![a-zA-Z0-9._(-])")
"""``@call:name`` with no argument list names a module in prose (the reference product-analyzer's
"ui_spec: from @call:ui-spec-generator"): it stays in the prompt and calls nothing."""
_TIERS = ("exec", "decision", "exploration")


class DirectiveError(ValueError):
    """A directive that does not parse."""


_WHOLE_INPUT = frozenset({"", "$INPUT", "$ARGUMENTS"})
"""Arguments that pass the caller's whole input: composition.md's ``$INPUT``, and ``$ARGUMENTS``
(the reference runtime's name for it; its product-analyzer calls ``ui-spec-generator($ARGUMENTS)``)."""


@dataclass(frozen=True, slots=True)
class CallDirective:
    name: str
    argument: Path | None
    """None: the module's whole input (``$INPUT``)."""
    background: bool = False
    """``async``: started with the others, not waited for before the main call, not injected."""
    timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    optional: bool = False
    tier: str | None = None
    line: int = 0


def _options(text: str, line: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for raw in (p.strip() for p in text.split(",")):
        if not raw:
            continue
        key, _, value = raw.partition("=")
        key, value = key.strip(), value.strip()
        if key in ("async", "optional") and not value:
            out["background" if key == "async" else key] = True
        elif key == "timeout" and re.fullmatch(r"\d+(?:\.\d+)?(?:ms|s)?", value):
            seconds = float(value[:-2]) / 1000 if value.endswith("ms") else float(value.rstrip("s"))
            if not 0 < seconds <= MAX_CALL_TIMEOUT_S:
                raise DirectiveError(
                    f"prompt.md line {line}: timeout must be in (0, {MAX_CALL_TIMEOUT_S:g}]s"
                )
            out["timeout_s"] = seconds
        elif key == "tier" and value in _TIERS:
            out["tier"] = value
        else:
            raise DirectiveError(f"prompt.md line {line}: unknown @call option {raw!r}")
    return out


def parse_directives(prompt: str) -> tuple[str, tuple[CallDirective, ...]]:
    """The prompt without its directive lines, and the directives in order."""
    kept: list[str] = []
    found: list[CallDirective] = []
    for number, line in enumerate(prompt.splitlines(keepends=True), start=1):
        matches = list(_DIRECTIVE.finditer(line))
        if not matches:
            if "@call:" in _MENTION.sub("", line):
                raise DirectiveError(
                    f"prompt.md line {number}: malformed @call directive: {line.strip()[:80]!r}"
                )
            kept.append(line)
            continue
        for match in matches:
            args = match["args"].strip()
            try:
                argument = None if args in _WHOLE_INPUT else parse_path(args)
            except PathError as exc:
                raise DirectiveError(f"prompt.md line {number}: {exc}") from exc
            options = _options(match["options"] or "", number)
            found.append(CallDirective(match["name"], argument, line=number, **options))  # type: ignore[arg-type]
    return "".join(kept), tuple(found)
