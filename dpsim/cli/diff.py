"""``dpsim diff BASE NEW``: what a change does to DP behaviour, on the same cases.

Exit status: 0 when no case differed (or only in kinds declared with
``--expect``), 1 when one did, 2 on bad input (one line, before anything
runs or is written) or a side that ends or crashes the process, as ``check``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from textwrap import fill
from typing import Any

from dpsim import allowances
from dpsim.capture.policy_files import load_policy
from dpsim.check import DEFAULT_EXAMPLES
from dpsim.cli import add_command, check_output_directory
from dpsim.cli.check import add_case_arguments
from dpsim.diff import KINDS, DiffOptions, Sides, parse_sides, run_diff
from dpsim.diff.report import exit_status, render, summary, write_case_files
from dpsim.errors import UsageError
from dpsim.isolation import prints_to_stderr, run_isolated
from dpsim.options import RUNNER_HELP, RUNNERS, SEED_HELP, parse_ranks
from dpsim.progress import StatusLine
from dpsim.targets import load_spec

HELP = "run the same generated cases on two targets and report what changed"
EPILOG = f"""\
BASE and NEW are each a release, a vLLM source tree or installed vllm package
directory, or a .py sync file (then --vllm names the rest of vLLM it runs
against; --base-vllm / --new-vllm where the two files need different ones).
Cases are drawn once, seeded, from the base side's generators (--cases-from
new: the new side's), for the scenarios both sides run, and each runs on both
sides. Per rank it compares what each sync chose (mode, padding, requests,
split and the other descriptor fields), what the ranks agreed
(agreement.FIELD), the collectives issued per group (op, shape, dtype, in
order), the simulator's outcome and the properties broken (those both
runners run). Across runners a field either side leaves unset is not
compared. A case that a side cannot run (an input or a policy it refuses) is
counted apart, never as a difference.

Each kind of difference is shrunk to its smallest case, shown side by side per
rank and written under --out as a counterexample file: `dpsim replay FILE`
reruns it on the base side, and with the printed --vllm/--runner options on
the new one.

kinds: {fill(", ".join(KINDS), 72, subsequent_indent="       ")}
       (syncs: a sync one side makes and the other not; error: a sync raised
       on one side, or with another message; agreement: agreed nothing on one
       side. --expect KIND counts a kind apart: neither shrunk nor a failure)
lane:  only `sync` (the simulated sync, as check runs it); diff is not wired
       to the runner lane yet, and any other --lane is refused

examples:
  dpsim diff ~/src/vllm-main ~/src/vllm-pr         a reviewer: what does the PR change?
  dpsim diff 0.29.0 0.33.0 --scenario step         what an upgrade changes
  dpsim diff 0.29.0 0.33.0 --cases-from new        ... on the batches 0.33 takes
  dpsim diff --base-runner v1 --new-runner v2 0.33.0 0.33.0
  dpsim diff 0.29.0 ./dp_utils.py --vllm 0.29.0 --expect agreement.num_reqs
  dpsim diff 0.33.0 0.33.0 --json                  a release against itself: no difference

exit status: 0 no difference (or expected ones only), 1 a difference, 2 bad input.
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "diff", HELP, EPILOG)
    parser.add_argument("base", metavar="BASE", help="the reference side")
    parser.add_argument("new", metavar="NEW", help="the changed side")
    parser.add_argument(
        "--vllm",
        metavar="SPEC",
        help="the rest of vLLM for a .py side (a release, tree or package dir)",
    )
    parser.add_argument("--base-vllm", metavar="SPEC", help="--vllm, base side only")
    parser.add_argument("--new-vllm", metavar="SPEC", help="--vllm, new side only")
    parser.add_argument("--runner", choices=RUNNERS, help=RUNNER_HELP)
    parser.add_argument("--base-runner", choices=RUNNERS, help="--runner, base only")
    parser.add_argument("--new-runner", choices=RUNNERS, help="--runner, new only")
    parser.add_argument(
        "--lane",
        default="sync",
        metavar="LANE",
        help="only `sync` exists (the default); any other is refused",
    )
    add_case_arguments(parser)
    parser.add_argument(
        "--cases-from",
        default="base",
        choices=("base", "new"),
        help="whose generators draw the cases (default base; new exercises "
        "what the new side adds, and cases the base cannot run are counted apart)",
    )
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="KIND",
        help="a kind of difference you expect (repeatable): counted apart",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"cases per scenario (default {DEFAULT_EXAMPLES}); shrinking each "
        "kind runs more",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=SEED_HELP)
    parser.add_argument(
        "--out", default="dpsim-out", metavar="DIR", help="where case files go"
    )
    parser.add_argument("--json", action="store_true", help="print one summary object")
    allowances.add_arguments(parser)
    parser.set_defaults(run=run)


def expected_kinds(names: list[str]) -> frozenset[str]:
    for name in names:
        if name not in KINDS:
            raise UsageError(
                f"--expect {name!r}: not a kind of difference; kinds: {', '.join(KINDS)}"
            )
    return frozenset(names)


def run(arguments: argparse.Namespace) -> int:
    if arguments.lane != "sync":
        raise UsageError(
            f"--lane {arguments.lane!r}: diff runs the sync lane only; it is not "
            "wired to the runner lane yet (`dpsim check --lane runner` runs it)"
        )
    if arguments.examples < 1:
        raise UsageError("--examples must be at least 1")
    parse_ranks(arguments.ranks)
    expected = expected_kinds(arguments.expect)
    check_output_directory(Path(arguments.out), "--out")
    allowance = allowances.from_arguments(arguments)
    sides = parse_sides(
        arguments.base,
        arguments.new,
        vllm=arguments.vllm,
        base_vllm=arguments.base_vllm,
        new_vllm=arguments.new_vllm,
        runner=arguments.runner,
        base_runner=arguments.base_runner,
        new_runner=arguments.new_runner,
    )
    if arguments.policy:
        load_policy(Path(arguments.policy))  # refused here, before any fork
    return run_isolated(
        lambda: _diff(arguments, sides, expected),
        allowance=allowance,
        json_errors=arguments.json,
    )


def _diff(arguments: argparse.Namespace, sides: Sides, expected: frozenset[str]) -> int:
    """The diff itself, in the child :func:`run_isolated` forks."""
    with prints_to_stderr():
        base = load_spec(sides.base)
        new = load_spec(sides.new)
        options = DiffOptions(
            scenarios=tuple(dict.fromkeys(arguments.scenario)),
            profile=arguments.profile,
            ranks=parse_ranks(arguments.ranks),
            policy=load_policy(Path(arguments.policy)) if arguments.policy else None,
            examples=arguments.examples,
            seed=arguments.seed,
            expected=expected,
            cases_from=arguments.cases_from,
        )
        progress = None if arguments.json else _Progress()
        try:
            report = run_diff(base, new, options, progress)
        finally:
            if progress is not None:
                progress.close()
    written = write_case_files(report, Path(arguments.out))
    if arguments.json:
        print(json.dumps(summary(report, written), sort_keys=True))
    else:
        print(render(report, written))
    return exit_status(report)


class _Progress:
    """Where the diff is, on stderr: one line redrawn on a terminal, else a
    line every 30 seconds (so a long run in CI still shows it is alive)."""

    def __init__(self) -> None:
        self.line = StatusLine()

    def __call__(self, what: str, scenario: str, done: int, planned: int) -> None:
        self.line.show(f"diff · {scenario} · {what} · {done}/{planned} cases")

    def close(self) -> None:
        self.line.close()
