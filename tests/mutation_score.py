"""`make mutation`'s verdict: the mutation score of each mutated module, from mutmut's results.

A mutant counts as killed when a test failed (or timed out) on it; survivors and mutants no test
reaches count against the module. Exits 1 when a module scores under ``MIN_SCORE``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MIN_SCORE = 0.90
"""Issue #14: every mutated module at 90 % or more (the survivors left are argued equivalent)."""
KILLED = {1, 3, 36, -24, 24, 152, 255}
"""mutmut's exit codes for a killed mutant: a failing test, a pytest error, a timeout."""
MUTANTS = Path("mutants")


def scores(root: Path = MUTANTS) -> dict[str, tuple[int, int, list[str]]]:
    """Per module: (killed, total, surviving mutant names)."""
    out: dict[str, tuple[int, int, list[str]]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        results: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        module = meta.relative_to(root).as_posix().removesuffix(".meta")
        survivors = sorted(name for name, code in results.items() if code not in KILLED)
        out[module] = (len(results) - len(survivors), len(results), survivors)
    return out


def main() -> int:
    table = scores()
    if not table:
        print("no mutmut results under mutants/: run `make mutation`", file=sys.stderr)
        return 2
    failing = 0
    for module, (killed, total, survivors) in table.items():
        score = killed / total
        failing += score < MIN_SCORE
        print(f"{module:<32}{killed:>5} / {total:<5}{score:>8.1%}{'' if score >= MIN_SCORE else '  < 90%'}")
        for name in survivors:
            print(f"    survived: {name}")
    killed = sum(k for k, _, _ in table.values())
    total = sum(t for _, t, _ in table.values())
    print(f"{'all':<32}{killed:>5} / {total:<5}{killed / total:>8.1%}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
