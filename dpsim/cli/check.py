"""``dpsim check``: the property suite against one target.

Exit status: 0 when every property held, 1 when one failed (the shrunk
counterexample is printed and written under --out), 2 on a usage or target
error, including a target that ends or crashes the process or outgrows its
memory or CPU allowance (:mod:`dpsim.isolation`): no verdict is not a pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dpsim import allowances, cex
from dpsim.capture.policy import load_policy
from dpsim.check import DEFAULT_EXAMPLES, CheckOptions, CheckReport, run_check
from dpsim.cli import add_command, check_output_directory
from dpsim.database import open_database
from dpsim.errors import UsageError
from dpsim.isolation import prints_to_stderr, run_isolated
from dpsim.limits import MAX_RANKS
from dpsim.properties import PROPERTY_NAMES
from dpsim.properties.base import Evidence
from dpsim.report import render_case_run
from dpsim.scenarios import PROFILES, SCENARIOS
from dpsim.targets import DEFAULT_RELEASE, TargetSpec, load_spec, parse_target
from dpsim.targets.load import Target

HELP = "run the property suite against a target (the main job)"
EPILOG = f"""\
scenarios:  {", ".join(SCENARIOS)} (default: all the target supports)
properties: {", ".join(PROPERTY_NAMES)} (default: all)
profiles:   caller = what vLLM's model runner passes;
            contract = everything the function's documented contract allows

examples:
  dpsim check                                  newest release ({DEFAULT_RELEASE}), all scenarios
  dpsim check --vllm 0.29.0 --ranks 2..8 --examples 1000
  dpsim check --target ./dp_utils.py --vllm 0.33.0 --property agreement
  dpsim check --profile contract --scenario step --json

A failure prints the shrunk counterexample as a per-rank table and writes it
to --out as JSON; `dpsim replay FILE` reruns it.
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "check", HELP, EPILOG)
    add_target_arguments(parser)
    add_case_arguments(parser)
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME",
        choices=PROPERTY_NAMES,
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"cases per scenario (default {DEFAULT_EXAMPLES})",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N")
    parser.add_argument(
        "--out", default="dpsim-out", metavar="DIR", help="where counterexamples go"
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="shared example database, replayed first and added to (generation "
        "then ignores --seed): DIR, redis://HOST:PORT/N or github:OWNER/REPO",
    )
    parser.add_argument("--json", action="store_true", help="print one summary object")
    allowances.add_arguments(parser)
    parser.set_defaults(run=run)


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """What cases are drawn: scenarios, profile, DP sizes, a fixed policy."""
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        choices=SCENARIOS,
        help="only this scenario (repeatable; default: all the target runs)",
    )
    parser.add_argument("--profile", default="caller", choices=PROFILES)
    parser.add_argument(
        "--ranks",
        default="2..16",
        metavar="LO..HI",
        help=f"DP sizes to try (or one N; at most {MAX_RANKS:,})",
    )
    parser.add_argument(
        "--policy", metavar="FILE", help="fix the capture policy (JSON/TOML)"
    )


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vllm",
        metavar="SPEC",
        help=f"a release (default {DEFAULT_RELEASE}), source tree or vllm package dir",
    )
    parser.add_argument(
        "--target", metavar="FILE", help="a dp_utils.py to run against --vllm"
    )


def parse_ranks(text: str) -> tuple[int, int]:
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
        else:
            low = high = int(text)
    except ValueError:
        raise UsageError(
            f"--ranks {text!r}: expected N or LO..HI, e.g. 2..16"
        ) from None
    if not 1 <= low <= high:
        raise UsageError(f"--ranks {text!r}: need 1 <= LO <= HI")
    if high > MAX_RANKS:
        raise UsageError(f"--ranks {text!r}: at most {MAX_RANKS:,} ranks")
    return low, high


def run(arguments: argparse.Namespace) -> int:
    if arguments.examples < 1:
        raise UsageError("--examples must be at least 1")
    parse_ranks(arguments.ranks)
    check_output_directory(Path(arguments.out), "--out")
    allowance = allowances.from_arguments(arguments)
    spec = parse_target(arguments.vllm, arguments.target)
    return run_isolated(
        lambda: _check(arguments, spec), allowance=allowance, json_errors=arguments.json
    )


def _check(arguments: argparse.Namespace, spec: TargetSpec) -> int:
    """The check itself, in the child :func:`run_isolated` forks."""
    with prints_to_stderr():
        target = load_spec(spec)
        options = CheckOptions(
            scenarios=tuple(dict.fromkeys(arguments.scenario)),
            properties=tuple(dict.fromkeys(arguments.property)),
            profile=arguments.profile,
            ranks=parse_ranks(arguments.ranks),
            policy=load_policy(Path(arguments.policy)) if arguments.policy else None,
            examples=arguments.examples,
            seed=arguments.seed,
            database=open_database(arguments.db) if arguments.db else None,
        )
        progress = (
            _Progress(target) if sys.stderr.isatty() and not arguments.json else None
        )
        try:
            report = run_check(target, options, progress)
        finally:
            if progress is not None:
                progress.close()
    written = _write_counterexample(report, Path(arguments.out))
    if arguments.json:
        print(json.dumps(summary(report, written), sort_keys=True))
    else:
        print(render_report(report, written))
    return 0 if report.passed else 1


def _write_counterexample(report: CheckReport, out: Path) -> Path | None:
    failed = report.first_failure
    if failed is None or failed.finding is None:
        return None
    finding = failed.finding
    written = cex.save(
        report.target,
        finding.case,
        finding.result,
        finding.verdicts,
        report.options.properties or PROPERTY_NAMES,
        out,
    )
    # A pytest file beside it that fails while the bug is there (dpsim.cex.regression).
    cex.write_regression_test(written)
    return written


def summary(report: CheckReport, written: Path | None) -> dict[str, Any]:
    failed = report.first_failure
    finding = failed.finding if failed is not None else None
    return {
        "verdict": "pass" if report.passed else "fail",
        "target": report.target.label,
        "property": finding.primary.property if finding else None,
        "scenario": failed.scenario if failed else None,
        "message": str(finding.primary) if finding else None,
        "examples": report.examples,
        "seconds": round(report.seconds, 3),
        "counterexample": str(written) if written else None,
        "scenarios": {
            run.scenario: {
                "verdict": "pass" if run.finding is None else "fail",
                "examples": run.examples,
                "seconds": round(run.seconds, 3),
            }
            for run in report.runs
        },
    }


def render_report(report: CheckReport, written: Path | None) -> str:
    options = report.options
    low, high = options.ranks
    lines = [
        f"dpsim check: {report.target.label}, profile {options.profile}, "
        f"ranks {low}..{high}, {options.examples} examples per scenario, seed {options.seed}"
    ]
    for run in report.runs:
        status = "pass" if run.finding is None else f"FAIL  {run.finding.primary}"
        lines.append(
            f"  {run.scenario:<8} {run.examples:>6} examples {run.seconds:6.1f}s  {status}"
        )
    failed = report.first_failure
    if failed is not None and failed.finding is not None:
        finding = failed.finding
        lines.append("")
        lines.append(
            render_case_run(
                f"counterexample (shrunk): {finding.primary}",
                finding.case,
                Evidence(finding.case, finding.result),
            )
        )
        if len(finding.verdicts) > 1:
            lines.append("")
            lines.append("it also breaks:")
            lines.extend(f"  {verdict}" for verdict in finding.verdicts[1:])
        lines.append("")
        lines.append(f"written: {written}")
        lines.append(f"replay:  dpsim replay {written}")
    lines.append("")
    failures = sum(run.finding is not None for run in report.runs)
    lines.append(
        f"result: {'PASS' if report.passed else 'FAIL'}: "
        f"{len(report.runs) - failures} of {len(report.runs)} scenarios held every property "
        f"({report.examples} cases, {report.seconds:.1f}s)"
    )
    return "\n".join(lines)


class _Progress:
    """One status line on a terminal, redrawn at most five times a second."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.last = 0.0
        self.drawn = False

    def __call__(self, scenario: str, done: int, planned: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.2:
            return
        self.last = now
        line = f"checking {self.target.label} · {scenario} · {done}/{planned} cases"
        sys.stderr.write("\r" + line[:100].ljust(100))
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()
