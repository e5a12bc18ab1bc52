"""``cogproxy calibration report|fit``: the reliability table, and a proposed map as policy YAML."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from proxy.state.redis_flags import URL_ENV, access_options, add_access_flags, env, refuse_unused

if TYPE_CHECKING:  # the commands import what they run: building the parser (cogproxy --help) stays light
    from proxy.calibration.choose import Choice
    from proxy.calibration.fit import Point
    from proxy.calibration.reliability import Reliability
    from proxy.state.redis_client import RedisOptions

DEFAULT_WINDOW = "7d"
DEFAULT_MIN_VERDICTS = 100
"""Below this a target's map would follow noise: with n verdicts a bin's accuracy is off by about
0.5/sqrt(n/bins) (±0.16 for 100 verdicts over 10 bins)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    calibration = sub.add_parser("calibration", help="reliability of model confidence, and calibration maps")
    commands = calibration.add_subparsers(dest="calibration_command", required=True, metavar="SUBCOMMAND")
    for name, help_text, func in (
        ("report", "per model: verdicts, ECE, Brier, reliability bins; per tier and decision", cmd_report),
        ("fit", "propose calibration maps (isotonic, Platt or temperature) as policy YAML", cmd_fit),
    ):
        p = commands.add_parser(name, help=help_text)
        source = p.add_mutually_exclusive_group()
        source.add_argument("--prometheus", metavar="URL", help="read the cognitive_feedback_* counters here")
        source.add_argument(
            "--redis-url",
            metavar="URL",
            help="read the judged answers the proxy stored here (COGPROXY_REDIS_URL)",
        )
        add_access_flags(p)  # serve's TLS and ACL flags and variables
        p.add_argument(
            "--window",
            default=DEFAULT_WINDOW,
            help=f"with --prometheus: over this range (default {DEFAULT_WINDOW})",
        )
        p.add_argument("--module", default=None, help="only this module's verdicts")
        if name == "fit":
            p.add_argument(
                "--min-verdicts",
                type=int,
                default=DEFAULT_MIN_VERDICTS,
                help=f"skip targets with fewer verdicts (default {DEFAULT_MIN_VERDICTS})",
            )
        p.set_defaults(func=func)


def _redis(args: argparse.Namespace) -> RedisOptions:
    """``--redis-url`` (else ``COGPROXY_REDIS_URL``) with ``serve``'s access flags and variables,
    checked as ``serve`` checks them."""
    from proxy.calibration.sources import SourceError

    url = args.redis_url or env(URL_ENV)
    if not url:
        raise SourceError(f"give --prometheus URL or --redis-url URL (or set COGPROXY_{URL_ENV})")
    try:
        return access_options(url, args)
    except ValueError as exc:
        raise SourceError(str(exc)) from None


async def _load(args: argparse.Namespace) -> tuple[Reliability, dict[str, list[Point]]]:
    from proxy.calibration.sources import SourceError, from_prometheus, from_redis, points_from_bins

    if args.prometheus:
        try:
            refuse_unused(args, "--prometheus")
        except ValueError as exc:
            raise SourceError(str(exc)) from None
        rel = await from_prometheus(args.prometheus, args.window, args.module)
        return rel, points_from_bins(rel)
    return await from_redis(_redis(args), args.module)


def _read(args: argparse.Namespace) -> tuple[Reliability, dict[str, list[Point]]] | None:
    from proxy.calibration.sources import SourceError

    try:
        loaded = asyncio.run(_load(args))
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    if loaded[0].skipped:
        print(f"# {loaded[0].skipped} records skipped as malformed (not counted)", file=sys.stderr)
    return loaded


def cmd_report(args: argparse.Namespace) -> int:
    from proxy.calibration.reliability import render

    loaded = _read(args)
    if loaded is None:
        return 2
    print(render(loaded[0]))
    return 0


def _scores(choice: Choice) -> list[str]:
    header = f"{'kind':<12} {'log-loss':>8} {'ECE before':>10} {'after':>6} {'Brier before':>12} {'after':>6}"
    lines = [f"#   {header}"]
    for s in choice.scores:
        mark = "  <- proposed" if s.kind == choice.kind else ""
        lines.append(
            f"#   {s.kind:<12} {s.log_loss:>8.4f} {s.ece_before:>10.3f} {s.ece_after:>6.3f} "
            f"{s.brier_before:>12.3f} {s.brier_after:>6.3f}{mark}"
        )
    return lines


def cmd_fit(args: argparse.Namespace) -> int:
    import yaml

    from proxy.calibration.choose import FOLDS, choose

    loaded = _read(args)
    if loaded is None:
        return 2
    maps = {}
    for target, points in sorted(loaded[1].items()):
        verdicts = sum(p.weight for p in points)
        if verdicts < max(args.min_verdicts, FOLDS):
            print(f"# {target}: {verdicts:.0f} verdicts, no map proposed", file=sys.stderr)
            continue
        choice = choose(points)
        maps[target] = choice.as_yaml()
        print(
            f"# {target}: fitted on {verdicts:.0f} verdicts; {choice.kind} has the lowest log-loss on "
            f"held-out verdicts ({FOLDS}-fold cross-validation):",
            file=sys.stderr,
        )
        print("\n".join(_scores(choice)), file=sys.stderr)
    if not maps:
        print("error: no target has enough verdicts to fit a map", file=sys.stderr)
        return 1
    print("# Proposed by `cogproxy calibration fit` (isotonic, Platt or temperature: the lowest")
    print("# cross-validated log-loss). Review it, put it in the policy, and reload (SIGHUP, or the")
    print("# file change is picked up): nothing applies it for you.")
    print(yaml.safe_dump({"calibration": maps}, sort_keys=True, default_flow_style=None), end="")
    return 0
