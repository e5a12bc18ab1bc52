"""The offline demo provider: deterministic answers from each module's own golden examples.

It never calls a network. It exists for ``make run``, demos and tests; it is never the default
of ``policies/default.yaml``.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.module.golden import GoldenCase, example_for
from proxy.module.model import Module

NO_EXAMPLE_REPLY = "I have no example answer for this input."


def offline_answer(module: Module, value: Any, case: GoldenCase | None = None) -> str:
    """The raw model text the offline provider answers ``module`` with for input ``value``."""
    example = case.example if case is not None else example_for(module, value)
    if example is None:
        return NO_EXAMPLE_REPLY  # not JSON: the contract turns it into E1000, as for a real model
    return orjson.dumps(example).decode()
