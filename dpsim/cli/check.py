"""``dpsim check``: the property suite against one target.

Exit status: 0 when every property held, 1 when one failed (the shrunk
counterexample is printed and written under --out), 2 on a usage or target
error, including a target that ends or crashes the process or outgrows its
memory or CPU allowance (:mod:`dpsim.isolation`): no verdict is not a pass.
130 on Ctrl-C, after the summary so far and the counterexamples found so far
are printed and written; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

from dpsim import allowances
from dpsim.capture.policy_files import load_policy
from dpsim.cex.findings import write_counterexamples
from dpsim.check import (
    DEFAULT_EXAMPLES,
    CheckInterrupted,
    CheckOptions,
    CheckReport,
    ScenarioRun,
    run_check,
)
from dpsim.cli import add_command, check_output_directory
from dpsim.coverage import cli as coverage_cli
from dpsim.database import open_database
from dpsim.errors import UsageError
from dpsim.isolation import EXIT_INTERRUPTED, prints_to_stderr, run_isolated
from dpsim.lanes.runner.check import DEFAULT_RUNNER_EXAMPLES
from dpsim.lanes.runner.check import DEFAULT_RUNNER_RANKS as RUNNER_RANKS
from dpsim.limits import MAX_RANKS
from dpsim.options import (
    PROFILE_HELP,
    SEED_HELP,
    add_lane_argument,
    add_runner_argument,
    lane_runner,
    parse_ranks,
)
from dpsim.progress import StatusLine
from dpsim.properties import (
    ALL_PROPERTY_NAMES,
    PROPERTY_NAMES,
    RUNNER_LANE_PROPERTIES,
    not_run,
    select,
)
from dpsim.properties.base import Evidence
from dpsim.records.case import PROFILES
from dpsim.report import render_case_run
from dpsim.scenarios import SCENARIOS
from dpsim.search.options import add_engine_argument
from dpsim.targets import DEFAULT_RELEASE, TargetSpec, load_spec, parse_target
from dpsim.targets.load import Target
from dpsim.targets.spec import DEFAULT_V1_RELEASE

HELP = "run the property suite against a target (the main job)"
#: The sync lane's DP sizes when --ranks is not given.
DEFAULT_RANKS_TEXT = "2..16"
EPILOG = f"""\
scenarios:  {", ".join(SCENARIOS)} (default: all the target supports)
properties: {", ".join(PROPERTY_NAMES)} (default: all)
            runner lane: {", ".join(RUNNER_LANE_PROPERTIES)}
profiles:   caller = what vLLM's model runner passes;
            contract = everything the function's documented contract allows

examples:
  dpsim check                                  newest release ({DEFAULT_RELEASE}), all scenarios
  dpsim check --vllm 0.29.0 --ranks 2..8 --examples 1000
  dpsim check --target ./dp_utils.py --vllm 0.33.0 --property agreement
  dpsim check --runner v1 --vllm 0.33.0       the V1 model runner's coordination
  dpsim check --profile contract --scenario step --json
  dpsim check --lane runner --vllm 0.33.0     vLLM's real engine loop, runner, drafters
  dpsim check --lane runner --runner v1 --vllm 0.33.0
                                               the same with the V1 model runner and
                                               its EAGLE/MTP drafter

Each failing scenario's shrunk counterexample is printed as a per-rank table
and written to --out as JSON, with a pytest regression test beside it;
`dpsim replay FILE` reruns it. Ctrl-C stops early and still prints the summary
so far and writes what was found (exit 130); a second Ctrl-C stops at once.
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "check", HELP, EPILOG)
    add_target_arguments(parser)
    add_case_arguments(parser, ranks_default=None)
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME",
        choices=ALL_PROPERTY_NAMES,
        help="only this property (repeatable; default: all the lane judges)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=None,
        metavar="N",
        help=f"cases generated per scenario (default {DEFAULT_EXAMPLES}; the runner "
        f"lane's: {DEFAULT_RUNNER_EXAMPLES}); a failure is then shrunk, which runs "
        "more cases, counted apart",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=SEED_HELP)
    parser.add_argument(
        "--out", default="dpsim-out", metavar="DIR", help="where counterexamples go"
    )
    parser.add_argument(
        "--db",
        metavar="URL",
        help="shared example database, replayed first and added to (generation "
        "then ignores --seed, except under --engine fast): DIR, "
        "redis://HOST:PORT/N or github:OWNER/REPO",
    )
    parser.add_argument("--json", action="store_true", help="print one summary object")
    add_engine_argument(parser)
    coverage_cli.add_argument(parser)
    add_lane_argument(parser)
    allowances.add_arguments(parser)
    parser.set_defaults(run=run)


def add_case_arguments(
    parser: argparse.ArgumentParser, ranks_default: str | None = DEFAULT_RANKS_TEXT
) -> None:
    """What cases are drawn: scenarios, profile, DP sizes, a fixed policy.
    ``check`` leaves --ranks unset by default: its lanes default differently."""
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        choices=SCENARIOS,
        help="only this scenario (repeatable; default: all the target runs)",
    )
    parser.add_argument(
        "--profile", default="caller", choices=PROFILES, help=PROFILE_HELP
    )
    parser.add_argument(
        "--ranks",
        default=ranks_default,
        metavar="LO..HI",
        help=f"DP sizes to try (or one N; at most {MAX_RANKS:,}; default "
        f"{DEFAULT_RANKS_TEXT}"
        + (
            f", the runner lane's {RUNNER_RANKS[0]}..{RUNNER_RANKS[1]})"
            if ranks_default is None
            else ")"
        ),
    )
    parser.add_argument(
        "--policy", metavar="FILE", help="fix the capture policy (JSON/TOML)"
    )


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """What to check: ``--vllm``, ``--target``, ``--runner``, ``--caller-file``
    (see :func:`target_spec`)."""
    parser.add_argument(
        "--vllm",
        metavar="SPEC",
        help=(
            f"a release (default {DEFAULT_RELEASE}; {DEFAULT_V1_RELEASE}, the "
            "newest with a V1 runner, for --runner v1), source tree or vllm "
            "package dir"
        ),
    )
    parser.add_argument(
        "--target",
        metavar="FILE",
        help="a dp_utils.py to run against --vllm (V2's or V1's: the runner "
        "whose sync it defines)",
    )
    add_runner_argument(parser)
    parser.add_argument(
        "--caller-file",
        metavar="FILE",
        help="V1 runner only: a gpu_model_runner.py whose "
        "_determine_batch_execution_and_padding runs instead of --vllm's",
    )


def target_spec(arguments: argparse.Namespace) -> TargetSpec:
    """The spec :func:`add_target_arguments`' options name, resolved before
    anything runs, so a bad combination is refused in one line."""
    return parse_target(
        arguments.vllm,
        arguments.target,
        runner=arguments.runner,
        caller_file=arguments.caller_file,
    )


def run(arguments: argparse.Namespace) -> int:
    if arguments.examples is not None and arguments.examples < 1:
        raise UsageError("--examples must be at least 1")
    lane = getattr(arguments, "lane", "sync")
    if lane == "runner":
        if arguments.engine != "hypothesis":
            raise UsageError(
                f"--engine {arguments.engine}: the sync lane only (the runner "
                "lane's cases are drawn by its own Hypothesis test)"
            )
        return _run_runner_lane(arguments)
    if arguments.examples is None:
        arguments.examples = DEFAULT_EXAMPLES
    if arguments.ranks is None:
        arguments.ranks = DEFAULT_RANKS_TEXT
    parse_ranks(arguments.ranks)
    # Unknown names are refused here, before a release is fetched for them.
    select(arguments.property)
    check_output_directory(Path(arguments.out), "--out")
    allowance = allowances.from_arguments(arguments)
    spec = target_spec(arguments)
    return run_isolated(
        lambda: _check(arguments, spec), allowance=allowance, json_errors=arguments.json
    )


def _run_runner_lane(arguments: argparse.Namespace) -> int:
    """``--lane runner``: the real callers' check (:mod:`dpsim.cli.runner_lane`)."""
    from dpsim.lanes.runner import commands as runner_lane

    arguments.runner = lane_runner("runner", arguments.runner)
    runner_lane.check_options(arguments)  # refusals before anything runs
    check_output_directory(Path(arguments.out), "--out")
    allowance = allowances.from_arguments(arguments)
    spec = target_spec(arguments)
    runner_lane.refuse_unsupported(spec)
    return run_isolated(
        lambda: runner_lane.check(arguments, spec),
        allowance=allowance,
        json_errors=arguments.json,
    )


def _check(arguments: argparse.Namespace, spec: TargetSpec) -> int:
    """The check itself, in the child :func:`run_isolated` forks."""
    with prints_to_stderr():
        target = load_spec(spec)
        measurement = coverage_cli.sync_measurement(arguments, target)
        options = CheckOptions(
            scenarios=tuple(dict.fromkeys(arguments.scenario)),
            properties=tuple(dict.fromkeys(arguments.property)),
            profile=arguments.profile,
            ranks=parse_ranks(arguments.ranks),
            policy=load_policy(Path(arguments.policy)) if arguments.policy else None,
            examples=arguments.examples,
            seed=arguments.seed,
            database=open_database(arguments.db) if arguments.db else None,
            coverage=measurement,
            engine=arguments.engine,
        )
        progress = None if arguments.json else _Progress(target)
        try:
            report = run_check(target, options, progress)
        except CheckInterrupted as stopped:
            # Ctrl-C: report what was done; a second Ctrl-C ends it at once.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            report = stopped.report
        finally:
            if progress is not None:
                progress.close()
    written = write_counterexamples(report, Path(arguments.out))
    covered = None
    if measurement is not None:
        covered = coverage_cli.finish(
            measurement.result(target.version), Path(arguments.out), target.label
        )
    if arguments.json:
        data = summary(report, written)
        if covered is not None:
            data["coverage"] = covered[1]
        print(json.dumps(data, sort_keys=True))
    else:
        print(render_report(report, written))
        if covered is not None:
            print(covered[0])
    if report.interrupted:
        return EXIT_INTERRUPTED
    return 0 if report.passed else 1


def _verdict(report: CheckReport) -> str:
    """``fail`` once anything failed, else ``interrupted`` or ``pass``."""
    if report.failures:
        return "fail"
    return "interrupted" if report.interrupted else "pass"


def _run_verdict(run: ScenarioRun) -> str:
    if run.finding is not None:
        return "fail"
    return "interrupted" if run.interrupted else "pass"


def summary(report: CheckReport, written: dict[str, Path]) -> dict[str, Any]:
    """The ``--json`` object: the first failure at the top, every
    scenario's own verdict, counts and counterexample under ``scenarios``.

    ``examples`` counts every case run, shrink attempts included;
    ``generated`` and ``shrinking`` split it.
    """
    failed = report.first_failure
    finding = failed.finding if failed is not None else None
    scenarios: dict[str, Any] = {}
    for run in report.runs:
        found = run.finding
        scenarios[run.scenario] = {
            "verdict": _run_verdict(run),
            "examples": run.examples,
            "generated": run.generated,
            "shrinking": run.shrinking,
            "seconds": round(run.seconds, 3),
            "interrupted": run.interrupted,
            "property": found.primary.property if found else None,
            "message": str(found.primary) if found else None,
            "shrunk": found.shrunk if found else None,
            "counterexample": str(written[run.scenario])
            if run.scenario in written
            else None,
        }
        if run.stopped_early is not None:
            scenarios[run.scenario]["stopped_early"] = run.stopped_early
    for name in report.not_run:
        scenarios[name] = {"verdict": "not-run", "examples": 0}
    data = {
        "verdict": _verdict(report),
        "interrupted": report.interrupted,
        "target": report.target.label,
        "property": finding.primary.property if finding else None,
        "scenario": failed.scenario if failed else None,
        "message": str(finding.primary) if finding else None,
        "examples": report.examples,
        "generated": report.examples - report.shrinking,
        "shrinking": report.shrinking,
        "seconds": round(report.seconds, 3),
        "counterexample": str(written[failed.scenario])
        if failed is not None and failed.scenario in written
        else None,
        "failures": len(report.failures),
        "scenarios": scenarios,
    }
    skipped = _properties_not_run(report)
    if skipped:
        # Only where something was left out, so a V2 report keeps its bytes.
        data["properties_not_run"] = skipped
    if report.options.engine != "hypothesis":
        data["engine"] = report.options.engine
    return data


def _properties_not_run(report: CheckReport) -> dict[str, str]:
    """The properties this check left out because they do not apply to its
    target's runner (a named one is refused instead), with the reasons."""
    if report.options.properties:
        return {}
    return not_run(report.target.runner)


def _scenario_line(run: ScenarioRun) -> str:
    if run.finding is not None:
        status = f"FAIL  {run.finding.primary}"
        if not run.finding.shrunk:
            status += " (interrupted while shrinking)"
    else:
        status = _run_verdict(run)
    if run.stopped_early is not None:
        status += f" ({run.stopped_early})"
    return (
        f"  {run.scenario:<8} {run.generated:>6} examples + {run.shrinking:>5} "
        f"shrinking {run.seconds:6.1f}s  {status}"
    )


def render_report(report: CheckReport, written: dict[str, Path]) -> str:
    options = report.options
    low, high = options.ranks
    lines = [
        f"dpsim check: {report.target.label}, profile {options.profile}, "
        f"ranks {low}..{high}, {options.examples} examples per scenario, seed {options.seed}"
        # Named only when not the default, so a default report keeps its bytes.
        + (f", engine {options.engine}" if options.engine != "hypothesis" else "")
    ]
    skipped = _properties_not_run(report)
    if skipped:
        # A pass on this runner means less than on the other: say what it omits.
        lines.append(
            f"  not judged on the {report.target.runner.upper()} runner: "
            + "; ".join(f"{name} ({why})" for name, why in skipped.items())
        )
    lines.extend(_scenario_line(run) for run in report.runs)
    lines.extend(f"  {name:<8} not run (interrupted)" for name in report.not_run)
    for failed in report.failures:
        finding = failed.finding
        assert finding is not None
        how = "shrunk" if finding.shrunk else "interrupted while shrinking, not minimal"
        lines.append("")
        lines.append(
            render_case_run(
                f"counterexample ({how}): {finding.primary}",
                finding.case,
                Evidence(finding.case, finding.result),
            )
        )
        if len(finding.verdicts) > 1:
            lines.append("")
            lines.append("it also breaks:")
            lines.extend(f"  {verdict}" for verdict in finding.verdicts[1:])
        path = written.get(failed.scenario)
        lines.append("")
        lines.append(f"written: {path}")
        lines.append(f"replay:  dpsim replay {path}")
    lines.append("")
    chosen = len(report.runs) + len(report.not_run)
    held = sum(run.finding is None and not run.interrupted for run in report.runs)
    verdict = _verdict(report).upper()
    if report.interrupted and report.failures:
        verdict += " (interrupted)"
    stopped = ", interrupted by Ctrl-C" if report.interrupted else ""
    lines.append(
        f"result: {verdict}: {held} of {chosen} scenarios held every property{stopped} "
        f"({report.examples} cases, {report.shrinking} of them while shrinking, "
        f"{report.seconds:.1f}s)"
    )
    return "\n".join(lines)


class _Progress:
    """Where the search is, on stderr: on a terminal one status line redrawn at
    most five times a second; elsewhere (``2>&1 | tee``, CI logs) a line every
    30 seconds, so a long check still shows it is alive."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.line = StatusLine()

    def __call__(self, scenario: str, done: int, planned: int) -> None:
        self.line.show(
            f"checking {self.target.label} · {scenario} · {done}/{planned} cases"
        )

    def close(self) -> None:
        self.line.close()
