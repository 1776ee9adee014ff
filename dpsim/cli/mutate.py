"""``dpsim mutate``: how many plausible sync bugs would the properties catch?

Exit status: 0 when every non-equivalent mutant was killed (or the score
reached --min-score), 1 when some survived, 2 on a usage or target error.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from dpsim.allowances import NO_LIMITS
from dpsim.cli import add_debug_argument, check_output_directory
from dpsim.cli.check import add_target_arguments
from dpsim.errors import UsageError
from dpsim.isolation import run_isolated
from dpsim.lanes.runner.check import DEFAULT_RUNNER_EXAMPLES, DEFAULT_RUNNER_RANKS
from dpsim.mutate import (
    DEFAULT_EXAMPLES,
    DEFAULT_SECONDS,
    OPERATOR_NAMES,
    Budget,
    MutantOutcome,
    generate,
    mutate,
    render,
    select_operators,
    summary,
    write,
)
from dpsim.mutate.files import SLOTS, mutated_file
from dpsim.mutate.run import REFUSED
from dpsim.mutate.runner import (
    DEFAULT_RUNNER_LIMIT,
    DEFAULT_RUNNER_SLOT,
    RUNNER_SLOTS,
    V1_RUNNER_SLOTS,
    runner_mutated_file,
    runner_target,
    slots_of,
)
from dpsim.options import SEED_HELP, add_lane_argument, lane_runner, parse_ranks
from dpsim.records.case import PROFILES
from dpsim.records.policy import CapturePolicy
from dpsim.targets import DEFAULT_RELEASE, load_target, parse_target

RUNNER_FILES = "\n".join(f"  {name:<17}{what}" for name, what in RUNNER_SLOTS.items())
V1_RUNNER_FILES = "\n".join(
    f"  {name:<17}{what}" for name, what in V1_RUNNER_SLOTS.items()
)
#: Every name ``--file`` takes under ``--lane runner``, either runner.
_ALL_RUNNER_SLOTS = tuple(dict.fromkeys((*RUNNER_SLOTS, *V1_RUNNER_SLOTS)))

HELP = "mutation testing: plant small bugs in the sync and count those caught"
EPILOG = f"""\
operators: {", ".join(OPERATOR_NAMES)} (default: all)

Each mutant is the target's dp_utils.py with one small change to a sync
function, written to a temporary directory and checked like `dpsim check`
(same seed for every mutant) until a property fails. The score is killed /
non-equivalent; mutants in the reviewed equivalent list are shown apart.
With --runner v1 the sync is V1's coordinate_batch_across_dp; --file caller
mutates V1's caller instead: gpu_model_runner.py, inside
GPUModelRunner._determine_batch_execution_and_padding only (vLLM 0.12+).

--lane runner mutates a file the runner lane runs, only in the methods it
rebuilds from it (`dpsim targets --lane runner` lists them), and judges each
mutant by `dpsim check --lane runner`'s search (DP sizes 2..4, {DEFAULT_RUNNER_EXAMPLES}
cases by default). --file (default {DEFAULT_RUNNER_SLOT}):
{RUNNER_FILES}
With --runner v1 (the V1 model runner and its EAGLE/MTP drafter):
{V1_RUNNER_FILES}
A mutant the lane cannot drive is *refused*: listed, neither killed nor
scored. Properties the original breaks under the same budget are not judged
(--policy fixes a capture policy, as check --lane runner --policy does).

examples:
  dpsim mutate                                 newest release ({DEFAULT_RELEASE})
  dpsim mutate --target ./dp_utils.py --vllm 0.29.0 --workers 2
  dpsim mutate --vllm 0.33.0 --operators min-max all-any agreed-value
  dpsim mutate --vllm 0.33.0 --limit 40 --json
  dpsim mutate --vllm 0.33.0 --list            the mutants, not checked
  dpsim mutate --vllm 0.33.0 --runner v1       V1's coordinate_batch_across_dp
  dpsim mutate --vllm 0.33.0 --runner v1 --file caller
  dpsim mutate --lane runner --vllm 0.33.0 --file core --limit 20 --seconds 120
  dpsim mutate --lane runner --runner v1 --vllm 0.33.0 --file gpu_model_runner
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "mutate",
        help=HELP,
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_debug_argument(parser)
    add_target_arguments(parser)
    parser.add_argument(
        "--file",
        choices=tuple(dict.fromkeys((*SLOTS, *_ALL_RUNNER_SLOTS))),
        help="what to mutate: the runner's sync (dp_utils.py; default) or, "
        "V1 only, the caller method in gpu_model_runner.py; under --lane "
        f"runner one of {', '.join(RUNNER_SLOTS)} (--runner v1: "
        f"{', '.join(V1_RUNNER_SLOTS)}; default {DEFAULT_RUNNER_SLOT})",
    )
    parser.add_argument(
        "--operators",
        nargs="+",
        default=[],
        metavar="NAME",
        help="operators to apply (space- or comma-separated)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        metavar="N",
        help=f"cases per scenario and profile (default {DEFAULT_EXAMPLES}; "
        f"per mutant under --lane runner, default {DEFAULT_RUNNER_EXAMPLES})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes (default: one per core; 0 = in this process)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="check a seeded sample of N mutants (--lane runner: "
        f"{DEFAULT_RUNNER_LIMIT} unless --limit or --mutant is given)",
    )
    parser.add_argument(
        "--mutant",
        action="append",
        default=[],
        metavar="ID",
        help="check only this mutant (repeatable), e.g. a survivor after a fix",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=SEED_HELP)
    parser.add_argument(
        "--ranks",
        metavar="LO..HI",
        help="DP sizes to try (or one N; default 1..16, the runner lane's "
        "{}..{})".format(*DEFAULT_RUNNER_RANKS),
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="--lane runner: fix the capture policy (JSON/TOML), fitted to "
        "each engine drawn",
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        choices=PROFILES,
        help="generator profiles to run (default: both)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        metavar="S",
        help=f"wall-clock cap per mutant (default {DEFAULT_SECONDS:g})",
    )
    parser.add_argument(
        "--equivalent",
        action="append",
        default=[],
        metavar="FILE",
        help="another reviewed list of equivalent mutants (TOML)",
    )
    parser.add_argument(
        "--min-score",
        type=float,
        metavar="PCT",
        help="exit 0 when the score reaches PCT percent, survivors or not",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the mutants without checking them"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--out", metavar="DIR", help="write mutate.json and each survivor's diff here"
    )
    add_lane_argument(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    runner_lane = arguments.lane == "runner"
    if runner_lane:
        _refuse_for_runner_lane(arguments)
    else:
        if arguments.file in _ALL_RUNNER_SLOTS and arguments.file not in SLOTS:
            raise UsageError(
                f"--file {arguments.file}: a runner-lane file (--lane runner)"
            )
        if arguments.policy:
            raise UsageError("mutate --policy: the runner lane's (--lane runner)")
    arguments.file = arguments.file or (DEFAULT_RUNNER_SLOT if runner_lane else "sync")
    if arguments.out:
        check_output_directory(Path(arguments.out), "--out")
    operators = select_operators(
        name for value in arguments.operators for name in value.split(",") if name
    )
    if arguments.seconds <= 0:
        raise UsageError("--seconds must be positive")
    if arguments.min_score is not None and not 0 <= arguments.min_score <= 100:
        raise UsageError("--min-score must be a percentage, 0 to 100")
    if arguments.list:
        work = functools.partial(_list, arguments, operators)
    else:
        ranks = arguments.ranks or ("2..4" if runner_lane else "1..16")
        budget = Budget(
            examples=(DEFAULT_RUNNER_EXAMPLES if runner_lane else DEFAULT_EXAMPLES)
            if arguments.examples is None
            else arguments.examples,
            seed=arguments.seed,
            ranks=parse_ranks(ranks),
            profiles=()
            if runner_lane
            else tuple(dict.fromkeys(arguments.profile)) or PROFILES,
            seconds=arguments.seconds,
        )
        work = functools.partial(_mutate, arguments, operators, budget)
    # The original target runs in this command's process too (it is loaded,
    # listed and checked there): isolated, so that one which ends the process
    # is an error, never an exit 0 with nothing printed. No limits: the
    # mutants' workers inherit them (see allowances.NO_LIMITS).
    return run_isolated(work, allowance=NO_LIMITS, json_errors=arguments.json)


def _mutate(
    arguments: argparse.Namespace, operators: tuple[str, ...], budget: Budget
) -> int:
    progress = _Progress() if sys.stderr.isatty() and not arguments.json else None
    try:
        report = mutate(
            arguments.vllm,
            arguments.target,
            runner=arguments.runner,
            caller_file=arguments.caller_file,
            slot=arguments.file,
            operators=operators,
            budget=budget,
            workers=arguments.workers,
            limit=_limit(arguments),
            only=tuple(arguments.mutant),
            equivalent_lists=tuple(Path(path) for path in arguments.equivalent),
            progress=progress,
            lane=arguments.lane,
            policy=_policy(arguments),
        )
    finally:
        if progress is not None:
            progress.close()
    if arguments.out:
        write(report, Path(arguments.out))
    if arguments.json:
        print(json.dumps(summary(report), sort_keys=True))
    else:
        print(render(report))
    if not report.survived and not report.timeouts:
        return 0
    if arguments.min_score is not None and report.score is not None:
        return 0 if 100 * report.score >= arguments.min_score else 1
    return 1 if report.survived else 0


def _refuse_for_runner_lane(arguments: argparse.Namespace) -> None:
    """One line for what ``--lane runner`` cannot be combined with, before
    anything is fetched or run."""
    from dpsim.lanes.runner.commands import refuse_unsupported

    arguments.runner = lane_runner("runner", arguments.runner)
    slots = slots_of(arguments.runner)
    for given, flag in (
        (arguments.target, "--target"),
        (arguments.caller_file, "--caller-file"),
        (arguments.profile, "--profile"),
    ):
        if given:
            raise UsageError(f"mutate --lane runner: {flag} is the sync lane's")
    if arguments.file is not None and arguments.file not in slots:
        what = (
            "is the sync lane's"
            if arguments.file in SLOTS
            else f"is not a file the {arguments.runner.upper()} runner's lane runs"
        )
        raise UsageError(
            f"mutate --lane runner: --file {arguments.file} {what}; "
            f"expected one of {', '.join(slots)}"
        )
    if arguments.examples is not None and arguments.examples < 1:
        raise UsageError("--examples must be at least 1")
    refuse_unsupported(parse_target(arguments.vllm, runner=arguments.runner))


def _limit(arguments: argparse.Namespace) -> int | None:
    """The sample size: the runner lane's default keeps a run to minutes
    (its files have hundreds of mutants at seconds each)."""
    if arguments.limit is not None or arguments.mutant or arguments.lane != "runner":
        return arguments.limit
    return DEFAULT_RUNNER_LIMIT


def _policy(arguments: argparse.Namespace) -> CapturePolicy | None:
    """``--policy``'s capture policy (runner lane only), refused in one line
    when the runner lane does not model it."""
    if not arguments.policy:
        return None
    from dpsim.capture.policy_files import load_policy
    from dpsim.lanes.runner.commands import refuse_unmodelled

    policy = load_policy(Path(arguments.policy))
    refuse_unmodelled(policy, "--policy")
    return policy


def _list(arguments: argparse.Namespace, operators: tuple[str, ...]) -> int:
    if arguments.lane == "runner":
        target = runner_target(arguments.vllm, arguments.runner)
        mutated, _ = runner_mutated_file(target, arguments.file)
    else:
        target = load_target(
            arguments.vllm,
            arguments.target,
            runner=arguments.runner,
            caller_file=arguments.caller_file,
        )
        mutated = mutated_file(target, arguments.file)
    original = mutated.text
    mutants = generate(original, operators, mutated.functions)
    if arguments.json:
        listing = [
            {
                "id": mutant.id,
                "operator": mutant.operator,
                "function": mutant.function,
                "line": mutant.line,
                "description": mutant.description,
                "diff": mutant.diff(original, mutated.name),
            }
            for mutant in mutants
        ]
        print(
            json.dumps(
                {"target": target.label, "sha256": mutated.sha256, "mutants": listing},
                sort_keys=True,
            )
        )
    else:
        print(f"{target.label}: {len(mutants)} mutants (sha256 {mutated.sha256})")
        for mutant in mutants:
            print(f"  {mutant.id:<34} {mutant.function}: {mutant.description}")
    return 0


class _Progress:
    """One status line on a terminal."""

    def __init__(self) -> None:
        self.killed = 0
        self.refused = 0
        self.drawn = False

    def __call__(self, done: int, planned: int, outcome: MutantOutcome) -> None:
        self.killed += outcome.killed
        # The runner lane's no-verdict: neither killed nor survived.
        self.refused += outcome.status == REFUSED
        line = f"mutants {done}/{planned} · killed {self.killed} · " + (
            f"survived {done - self.killed - self.refused}"
        )
        if self.refused:
            line += f" · refused {self.refused}"
        sys.stderr.write("\r" + line.ljust(60))
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()
