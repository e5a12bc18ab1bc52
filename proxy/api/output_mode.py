"""How a module call over chat completions hands back its envelope, from the client's ``tools``,
``tool_choice`` and ``response_format`` (what instructor, pydantic-ai and the SDKs' structured
output send).

* ``tool_choice`` absent, ``auto`` or ``none``: the envelope is the message content; ``tools`` go
  to the module's tools policy as before.
* One function forced — ``tool_choice: {"type": "function", "function": {"name": N}}`` naming one
  of ``tools``, or ``tool_choice: "required"`` with exactly one tool: the envelope is the
  arguments of that tool call (``finish_reason: "tool_calls"``), streamed too. That tool is the
  answer's shape, not a tool for the model: it is not sent upstream.
* ``response_format`` ``text``, ``json_object`` or ``json_schema``: the envelope is the content
  (the module's contract decides its shape; the schema is not sent upstream).
* Anything else is a 400 naming these modes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.api.errors import ApiError
from proxy.jsonshape import as_dict

SUPPORTED_MODES = (
    "a module call answers its envelope as the message content (tool_choice absent, auto or none; "
    "response_format text, json_object or json_schema), or as the arguments of one forced function "
    '(tool_choice {"type": "function", "function": {"name": ...}} naming one of tools, or '
    'tool_choice "required" with exactly one tool)'
)
RESPONSE_FORMATS = frozenset({"text", "json_object", "json_schema"})


@dataclass(frozen=True, slots=True)
class OutputMode:
    tool: str | None
    """The forced function whose arguments are the envelope; None: the envelope is the content."""
    tools: tuple[Mapping[str, Any], ...]
    """The client's tools for the module's tools policy (the forced one left out)."""


def _refuse(why: str, param: str) -> ApiError:
    return ApiError(400, f"{why}: {SUPPORTED_MODES}", code="unsupported_output_mode", param=param)


def _function_name(tool: Mapping[str, Any]) -> str | None:
    name = as_dict(tool.get("function")).get("name")
    return name if tool.get("type", "function") == "function" and isinstance(name, str) else None


def output_mode(body: Mapping[str, Any]) -> OutputMode:
    """The output mode of a module call's chat body; raises ``ApiError`` (400) for another one."""
    given = body.get("tools")
    tools = tuple(t for t in given if isinstance(t, dict)) if isinstance(given, list) else ()
    fmt = body.get("response_format")
    if fmt is not None and as_dict(fmt).get("type") not in RESPONSE_FORMATS:
        raise _refuse("Unsupported response_format for a module call", "response_format")
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none"):
        return OutputMode(None, tools)
    if choice == "required":
        if len(tools) != 1 or _function_name(tools[0]) is None:
            raise _refuse(f'tool_choice "required" with {len(tools)} tools', "tool_choice")
        forced = _function_name(tools[0])
    else:
        named = as_dict(choice)
        forced = _function_name(named) if named.get("type") == "function" else None
        if forced is None or forced not in {_function_name(t) for t in tools}:
            raise _refuse("tool_choice must force a function named in tools", "tool_choice")
    return OutputMode(forced, tuple(t for t in tools if _function_name(t) != forced))
