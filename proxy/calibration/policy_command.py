"""``cogproxy policy tune`` and ``cogproxy policy simulate``: policies from verdicts, tried on them.

Both read the judged answers the proxy stored in Redis (``tune`` also the first human verdicts
Prometheus counts, on the calibrated scale's 0.1 bins) and change nothing: ``tune`` prints the
thresholds it can vouch for as a policy YAML block to review, ``simulate`` what a candidate policy
would have decided.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from proxy.calibration.defaults import DEFAULT_DELTA, TOKENS_IN, TOKENS_OUT
from proxy.state.redis_flags import access_options, add_access_flags, refuse_unused

if TYPE_CHECKING:  # the commands import what they run: building the parser (cogproxy --help) stays light
    from proxy.calibration.replay import Usage
    from proxy.calibration.suggest import Group
    from proxy.calibration.tune import Tuned
    from proxy.policy.model import Policy, Thresholds
    from proxy.state.feedback import AnswerRecord

DEFAULT_WINDOW = "7d"
PER = 1000
"""Cost changes are stated per this many answers."""


def add_parsers(policy_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = policy_sub.add_parser(
        "tune", help="min_confidence per module and tier from verdicts, with a finite-sample guarantee"
    )
    p.add_argument("--policy", required=True, help="the policy in force (maps, ladder, prices, thresholds)")
    p.add_argument(
        "--target-accuracy", type=_probability, required=True, help="accuracy of accepted answers, 0..1"
    )
    p.add_argument(
        "--delta",
        type=_probability,
        default=DEFAULT_DELTA,
        help=f"the guarantee holds with probability 1 - delta (default {DEFAULT_DELTA})",
    )
    _common(p)
    p.set_defaults(func=cmd_tune, reads_prometheus=True)
    p.add_argument(
        "--window",
        default=DEFAULT_WINDOW,
        help=f"with a Prometheus --from: the verdicts of this last window (default {DEFAULT_WINDOW})",
    )
    p = policy_sub.add_parser("simulate", help="replay stored judged answers under a candidate policy")
    p.add_argument("--policy", required=True, help="the candidate policy")
    p.add_argument("--json", action="store_true", help="print the result as JSON (for CI)")
    _common(p)
    p.set_defaults(func=cmd_simulate)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="the Redis the proxy stores answers in (redis://); for tune also a Prometheus (http://): "
        "simulate needs the answers themselves, which Prometheus does not keep",
    )
    p.add_argument("--module", default=None, help="only this module's answers")
    add_access_flags(p)  # a managed Redis's TLS files and ACL user, as `calibration` and `serve` take them
    p.add_argument(
        "--tokens-in",
        type=int,
        default=TOKENS_IN,
        help=f"prompt tokens of an escalation's extra call (default {TOKENS_IN})",
    )
    p.add_argument(
        "--tokens-out",
        type=int,
        default=TOKENS_OUT,
        help=f"completion tokens of an escalation's extra call (default {TOKENS_OUT})",
    )


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1)")
    return value


PER_ANSWER_ONLY = (
    "simulate replays answers stored in Redis (redis://): it decides each answer again on its own "
    "confidence, risk and earlier rungs, which only the Redis records keep; Prometheus keeps counts "
    "per confidence bin (what tune reads), not answers"
)
SOURCE_UNREADABLE = 2
"""Exit status when the verdicts cannot be read (as ``calibration report`` and ``fit``)."""


def _load(args: argparse.Namespace) -> tuple[Policy, list[AnswerRecord]] | int:
    """The policy and the judged answers, or the exit status after printing why not."""
    from proxy.calibration.sources import SourceError, judged_records, prometheus_records
    from proxy.policy.loader import PolicyError, load_policy

    try:
        policy = load_policy(Path(args.policy))
    except PolicyError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        return PolicyError.EXIT_STATUS
    prometheus = args.source.startswith(("http://", "https://"))
    if prometheus and not getattr(args, "reads_prometheus", False):
        print(f"error: --from: {PER_ANSWER_ONLY}", file=sys.stderr)
        return SOURCE_UNREADABLE
    try:
        if prometheus:
            refuse_unused(args, "a Prometheus --from")
            records = asyncio.run(prometheus_records(args.source, args.window, args.module))
        else:
            records = asyncio.run(judged_records(access_options(args.source, args), args.module))
    except (SourceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return SOURCE_UNREADABLE
    # Prometheus's bins are on the calibrated scale already: the maps in force are not applied again.
    return (replace(policy, calibration={}) if prometheus else policy), records


def _cost_change(policy: Policy, group: Group, now: float, new: float, usage: Usage) -> float:
    """USD per PER answers: escalations a stricter threshold adds, minus those a looser one saves."""
    from proxy.calibration.replay import escalation_usd

    total = 0.0
    for record, rung in group.answers:
        calibrated = policy.calibrate(f"{record.provider}/{record.model}", record.confidence)
        was, will = calibrated >= now, calibrated >= new
        if was != will:
            total += escalation_usd(policy, rung, usage) * (1 if was else -1)
    return total * PER / len(group.answers)


def _describe(group: Group, tuned: Tuned, current: Thresholds, args: argparse.Namespace, cost: float) -> str:
    label = f"{group.kind} {group.name}" + (f" ({group.tier})" if group.kind == "module" else "")
    head = f"# {label}: {tuned.verdicts} verdicts"
    goal = f"accuracy {args.target_accuracy:g} with probability {1 - args.delta:g}"
    if tuned.threshold is None:
        if tuned.more_needed is None:
            below = f"accepted accuracy is below {args.target_accuracy:g} at every threshold"
            return f"{head}; {below}: no threshold (more verdicts will not help)"
        return f"{head}; too few for {goal}: about {tuned.more_needed} more verdicts needed"
    escalated = 1 - tuned.accepted_share
    return "\n".join(
        [
            f"{head}; min_confidence {tuned.threshold:g} (now {current.min_confidence:g})",
            f"#   accepted accuracy >= {tuned.accuracy_bound:.3f} with probability {1 - args.delta:g} "
            f"(Clopper-Pearson, {tuned.errors} wrong of {tuned.accepted} accepted)",
            f"#   accepted {tuned.accepted_share:.1%}, escalated or exhausted {escalated:.1%}",
            f"#   cost change {cost:+.4f} USD per {PER} answers at today's prices "
            f"({args.tokens_in} in / {args.tokens_out} out tokens per extra call)",
        ]
    )


def _entry(thresholds: Thresholds, threshold: float) -> dict[str, object]:
    values = {f.name: getattr(thresholds, f.name) for f in fields(thresholds)}
    values["min_confidence"] = threshold
    return {k: v for k, v in values.items() if v is not None}


def cmd_tune(args: argparse.Namespace) -> int:
    import yaml

    from proxy.calibration.replay import Usage
    from proxy.calibration.suggest import suggest

    loaded = _load(args)
    if isinstance(loaded, int):
        return loaded
    policy, records = loaded
    usage = Usage(args.tokens_in, args.tokens_out)
    suggestions = suggest(policy, records, args.target_accuracy, args.delta, pooled=args.module is None)
    if suggestions.unplaced:
        print(
            f"# {suggestions.unplaced} verdicts left out: "
            "their targets are on no rung of the policy, or their tiers not in it"
        )
    block: dict[str, dict[str, object]] = {}
    for row in suggestions.rows:
        group, tuned, current = row.group, row.tuned, row.current
        cost = 0.0
        if tuned.threshold is not None:
            cost = _cost_change(policy, group, current.min_confidence, tuned.threshold, usage)
            if group.kind == "module":
                override = dict(policy.modules.get(group.name, {}))
                override["min_confidence"] = tuned.threshold
                block.setdefault("modules", {})[group.name] = override
            else:
                block.setdefault("tiers", {})[group.name] = _entry(current, tuned.threshold)
        print(_describe(group, tuned, current, args, cost))
    if not block:
        print("error: no threshold can be vouched for with these verdicts", file=sys.stderr)
        return 1
    print("# Proposed by `cogproxy policy tune`: review it, merge it into the policy and reload;")
    print("# nothing applies it for you. The guarantee is about the answers the verdicts came from.")
    print(yaml.safe_dump(block, sort_keys=True, default_flow_style=None), end="")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from proxy.calibration.replay import Usage
    from proxy.calibration.simulate import render, simulate

    loaded = _load(args)
    if isinstance(loaded, int):
        return loaded
    policy, records = loaded
    usage = Usage(args.tokens_in, args.tokens_out)
    result = simulate(policy, records, usage)
    if args.json:
        sys.stdout.write(orjson.dumps(result.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(result, usage))
    return 0
