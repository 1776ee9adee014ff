"""``dpsim fuzz``: run the property suite continuously across N processes.

Exit status: 0 when nothing failed, 1 when a property failed (each
counterexample is written under --out), 2 on a usage or target error or when a
worker broke or could not drive the target (no verdict), 130 when Ctrl-C stopped it (after the summary, and the files of
what was found): a campaign cut short is not a pass. Ctrl-C stops cleanly; a
second Ctrl-C stops at once.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from dpsim.cli import add_command, check_output_directory
from dpsim.cli.check import (
    DEFAULT_RANKS_TEXT,
    add_case_arguments,
    add_target_arguments,
)
from dpsim.coverage import cli as coverage_cli
from dpsim.database import LOCAL_DIRECTORY
from dpsim.fuzz import CampaignOptions, Tally, parse_duration, run_campaign
from dpsim.fuzz.campaign import DEFAULT_BATCH, DEFAULT_GRACE
from dpsim.isolation import EXIT_INTERRUPTED
from dpsim.lanes.runner.check import DEFAULT_RUNNER_RANKS
from dpsim.options import add_lane_argument
from dpsim.progress import StatusLine
from dpsim.suite.config import SuiteOptions

#: DP sizes per lane when --ranks is not given (the runner lane runs whole
#: engines per rank: fewer ranks, as check and the pytest plugin draw).
RANKS_DEFAULT = {
    "sync": DEFAULT_RANKS_TEXT,
    "runner": "{}..{}".format(*DEFAULT_RUNNER_RANKS),
}

HELP = "fuzz the property suite continuously, N processes sharing one database"
EPILOG = f"""\
examples:
  dpsim fuzz --for 10m                       every core, newest release
  dpsim fuzz --vllm ~/src/vllm --workers 8 --db /shared/dpsim-db
  dpsim fuzz --vllm 0.33.0 --db redis://fuzz-db:6379/0     one of a fleet
  dpsim fuzz --lane runner --vllm 0.33.0 --for 15m          vLLM's real engines
  dpsim fuzz --lane runner --runner v1 --vllm 0.33.0 --for 15m   ... with the V1 runner

Every worker runs the same Hypothesis tests as `pytest --pyargs dpsim.suite`,
under the same database keys: a failure any worker (or CI run) saved is
replayed first by all the others. The database defaults to {LOCAL_DIRECTORY},
Hypothesis' own, so a later pytest run in this directory replays what the
campaign found. Each new counterexample is written to --out.
With --lane runner every worker runs the runner lane's one test (`pytest
--dpsim-lane runner`'s: vLLM's real engine loop, worker, model runner and
speculators per rank; DP sizes 2..4 by default) and writes a failure as a
runner case file; --scenario, --profile, --target and --caller-file are the
sync lane's.
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "fuzz", HELP, EPILOG)
    add_target_arguments(parser)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="worker processes (default: one per core)",
    )
    parser.add_argument(
        "--for",
        dest="duration",
        metavar="DURATION",
        help="stop after this long: 90s, 15m, 2h (default: until Ctrl-C)",
    )
    parser.add_argument(
        "--db",
        default=str(LOCAL_DIRECTORY),
        metavar="URL",
        help="shared example database: DIR, redis://HOST:PORT/N or "
        f"github:OWNER/REPO (default {LOCAL_DIRECTORY})",
    )
    parser.add_argument(
        "--out", default="dpsim-out", metavar="DIR", help="where counterexamples go"
    )
    add_case_arguments(parser, ranks_default=None)
    parser.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"examples per round before a worker moves on (default {DEFAULT_BATCH})",
    )
    parser.add_argument("--json", action="store_true", help="print one summary object")
    coverage_cli.add_argument(parser)
    add_lane_argument(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    check_output_directory(Path(arguments.out), "--out")
    options = CampaignOptions(
        suite=SuiteOptions(
            vllm=arguments.vllm,
            target=arguments.target,
            runner=arguments.runner,
            caller_file=arguments.caller_file,
            policy=arguments.policy,
            profile=arguments.profile,
            ranks=arguments.ranks or RANKS_DEFAULT[arguments.lane],
            out=arguments.out,
            lane=arguments.lane,
        ),
        database=arguments.db,
        workers=arguments.workers,
        scenarios=tuple(dict.fromkeys(arguments.scenario)),
        duration=parse_duration(arguments.duration) if arguments.duration else None,
        batch=max(1, arguments.batch),
        grace=DEFAULT_GRACE,
        coverage=arguments.coverage,
    )
    status = StatusLine()
    try:
        tally = run_campaign(
            options,
            lambda text: status.announce(f"dpsim fuzz: {text}"),
            lambda tally: status.show(lambda: status_text(tally)),
        )
    finally:
        status.close()
    covered = None
    if tally.coverage:
        from dpsim.coverage import suite as coverage_suite

        covered = coverage_suite.summary(tally.coverage, arguments.out, tally.target)
    if arguments.json:
        data = summary(tally)
        if covered is not None:
            data["coverage"] = covered[1]
        print(json.dumps(data, sort_keys=True))
    else:
        print(render(tally))
        if covered is not None:
            print(covered[0])
    if tally.stopping == "interrupted":
        return EXIT_INTERRUPTED
    return 1 if tally.failures else 2 if tally.errors else 0


def verdict(tally: Tally) -> str:
    """``fail`` once a property failed; else ``error`` once a worker broke or
    could not drive the target (no verdict); else ``interrupted`` or ``pass``."""
    if tally.failures:
        return "fail"
    if tally.errors:
        return "error"
    return "interrupted" if tally.stopping == "interrupted" else "pass"


def status_text(tally: Tally) -> str:
    elapsed = tally.elapsed
    clock = _clock(elapsed) + (
        f"/{_clock(tally.duration)}" if tally.duration is not None else ""
    )
    rate = tally.total / elapsed if elapsed > 0 else 0.0
    covered = sum(1 for name in tally.scenarios if tally.examples.get(name))
    per_scenario = " ".join(
        f"{name} {tally.examples.get(name, 0):,}" for name in tally.scenarios
    )
    holding, pairs = tally.checks
    return (
        f"fuzz {clock} · {tally.workers} workers · {tally.total:,} examples "
        f"({rate:.0f}/s) · scenarios {covered}/{len(tally.scenarios)} "
        f"({per_scenario}) · properties holding {holding}/{pairs} · "
        f"failures {len(tally.failures)}"
    )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def render(tally: Tally) -> str:
    reason = {
        "deadline": "stopped at the deadline",
        "interrupted": "stopped on Ctrl-C",
        "finished": "every scenario failed or broke",
    }.get(tally.stopping or "", "stopped")
    lines = [
        f"dpsim fuzz: {tally.target}, {tally.workers} workers, "
        f"{tally.total:,} examples in {tally.elapsed:.1f}s, {reason}"
    ]
    failed = {failure.scenario: failure for failure in tally.failures}
    for name in tally.scenarios:
        failure = failed.get(name)
        state = f"FAIL  {failure.message}" if failure else "held"
        lines.append(f"  {name:<8} {tally.examples.get(name, 0):>9,} examples  {state}")
    for failure in tally.failures:
        if failure.path is not None:
            lines.append(f"written: {failure.path}")
            lines.append(f"replay:  dpsim replay {failure.path}")
    lines.extend(f"error: {error}" for error in tally.errors)
    word = verdict(tally).upper()
    if word in ("FAIL", "ERROR") and tally.stopping == "interrupted":
        word += " (interrupted)"
    lines.append(
        f"result: {word}: {len(tally.failures)} failure(s), "
        f"{len(tally.errors)} error(s)"
    )
    return "\n".join(lines)


def summary(tally: Tally) -> dict[str, Any]:
    return {
        "verdict": verdict(tally),
        "target": tally.target,
        "workers": tally.workers,
        "pids": tally.pids,
        "stopped": tally.stopping,
        "seconds": round(tally.elapsed, 3),
        "examples": tally.total,
        "scenarios": {name: tally.examples.get(name, 0) for name in tally.scenarios},
        "failures": [
            {
                "scenario": failure.scenario,
                "property": failure.property,
                "message": failure.message,
                "counterexample": str(failure.path) if failure.path else None,
            }
            for failure in tally.failures
        ],
        "errors": tally.errors,
    }
