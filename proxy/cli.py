"""The ``cogproxy`` command line: validate, conformance, test, run."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from proxy import __version__
from proxy.conformance import run_vectors
from proxy.contract.engine import run_contract
from proxy.contract.inputs import check_input
from proxy.module.golden import GoldenCase, run_golden
from proxy.module.lint import lint_module
from proxy.module.loader import ModuleLoadError, is_module_dir, load_module
from proxy.module.model import Module
from proxy.module.registry import ModuleRegistry
from proxy.upstream.offline import offline_answer

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def offline_envelope(module: Module, value: Any, case: GoldenCase | None = None) -> dict[str, Any]:
    """One module call answered by the offline provider: input check, answer, contract."""
    error = check_input(module, value)
    if error is not None:
        return error
    return run_contract(offline_answer(module, value, case), module).envelope


def cmd_validate(args: argparse.Namespace) -> int:
    problems = lint_module(Path(args.module_dir), v22=args.v22)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{args.module_dir}: valid" + (" (v2.2)" if args.v22 else ""))
    return EXIT_FAILED if problems else EXIT_OK


def cmd_conformance(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"{directory}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    outcomes = run_vectors(directory)
    failed = [o for o in outcomes if not o.passed]
    for outcome in failed:
        print(f"FAIL {outcome.path.relative_to(directory)} ({outcome.name}): {outcome.problem}")
    print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return EXIT_FAILED if failed or not outcomes else EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    try:
        module = load_module(Path(args.module_dir))
    except ModuleLoadError as exc:
        print(exc, file=sys.stderr)
        return EXIT_FAILED
    outcomes = run_golden(module, offline_envelope)
    for outcome in outcomes:
        mark = "PASS" if outcome.passed else "FAIL"
        print(f"{mark} {module.name}/{outcome.name}")
        for problem in outcome.problems:
            print(f"    {problem}")
    failed = sum(not o.passed for o in outcomes)
    print(f"{len(outcomes) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed or not outcomes else EXIT_OK


def _find_module(name_or_path: str, directories: list[str]) -> Module:
    path = Path(name_or_path)
    if is_module_dir(path):
        return load_module(path)
    registry = ModuleRegistry.load(Path(d) for d in directories)
    module = registry.get(name_or_path)
    if module is None:
        known = ", ".join(registry.names()) or "none"
        raise ModuleLoadError(path, f"no such module (known: {known})")
    return module


def cmd_run(args: argparse.Namespace) -> int:
    try:
        module = _find_module(args.module, args.modules or ["modules"])
    except ModuleLoadError as exc:
        print(exc, file=sys.stderr)
        return EXIT_FAILED
    try:
        raw = sys.stdin.buffer.read() if args.input == "-" else Path(args.input).read_bytes()
        value = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError) as exc:
        print(f"{args.input}: cannot read the input JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    envelope = offline_envelope(module, value)
    _print_json(envelope)
    return EXIT_OK if envelope.get("ok") else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cogproxy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"cogproxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a module directory")
    p.add_argument("module_dir")
    p.add_argument("--v22", action="store_true", help="also run the v2.2 checks of module-format.md")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("conformance", help="run envelope test vectors (spec/test-vectors format)")
    p.add_argument("directory")
    p.set_defaults(func=cmd_conformance)

    p = sub.add_parser("test", help="run a module's golden tests")
    p.add_argument("module_dir")
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("run", help="execute one module call and print the envelope")
    p.add_argument("module", help="a module name (looked up in --modules) or a module directory")
    p.add_argument("--input", required=True, help="input JSON file, or - for stdin")
    p.add_argument(
        "--modules",
        action="append",
        default=[d for d in os.environ.get("COGPROXY_MODULES", "").split(os.pathsep) if d],
        help="module directory (repeatable; env COGPROXY_MODULES)",
    )
    p.set_defaults(func=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
