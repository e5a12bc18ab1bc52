"""The offline provider's seeded synthetic population (``options.population``): a model whose
reported confidence and correctness follow known curves, for calibration tests and demos::

    options:
      population:
        - {model: small, module: code-reviewer, seed: 7,
           confidence: [0.5, 1.0], accuracy: [0.2, 1.0]}

Each answer of ``model`` to ``module`` reports a confidence drawn uniformly from ``confidence``
and is right with probability ``accuracy`` interpolated linearly over that range (0.2 at 0.5 to
1.0 at 1.0 above). Right: the provider's usual answer. Wrong: the same answer with each of the
module's judged fields (``Module.judged_fields``) changed to another valid value, so a judge
without the population (another model of the provider) disagrees exactly on the wrong ones.
Draws come from ``random.Random(seed)`` per rule: sequential calls give the same population.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.jsonshape import as_dict, as_list
from proxy.module.model import Module


@dataclass
class Population:
    low: float
    high: float
    accuracy_low: float
    accuracy_high: float
    rng: random.Random

    def draw(self) -> tuple[float, bool]:
        """One answer's (reported confidence, right)."""
        share = self.rng.random()
        confidence = round(self.low + (self.high - self.low) * share, 4)  # as Redis keeps it
        accuracy = self.accuracy_low + (self.accuracy_high - self.accuracy_low) * share
        return confidence, self.rng.random() < accuracy


def populations(options: Mapping[str, Any]) -> dict[tuple[str, str], Population]:
    """``options.population`` by (model, module)."""
    out = {}
    for rule in map(as_dict, as_list(options.get("population"))):
        low, high = (float(x) for x in rule.get("confidence", (0.5, 1.0)))
        acc_low, acc_high = (float(x) for x in rule.get("accuracy", (low, high)))
        rng = random.Random(int(rule.get("seed", 0)))
        out[(str(rule.get("model")), str(rule.get("module")))] = Population(low, high, acc_low, acc_high, rng)
    return out


def wrong(module: Module, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every judged field changed to another valid value where one is known (the
    next enum member, a negated boolean, a number plus one, a marked string)."""
    props = as_dict(module.data_schema.get("properties"))
    out = dict(data)
    for name in module.judged_fields:
        value, spec = out.get(name), as_dict(props.get(name))
        enum = as_list(spec.get("enum"))
        if value in enum and len(enum) > 1:
            out[name] = enum[(enum.index(value) + 1) % len(enum)]
        elif isinstance(value, bool):
            out[name] = not value
        elif isinstance(value, (int, float)):
            out[name] = value + 1
        elif isinstance(value, str):
            out[name] = value + " (wrong)"
    return out
