"""``dpsim replay``: rerun a counterexample file, simulated or on real process groups.

Exit status: 0 when every property holds now (the bug is gone on this
target), 1 when a property fails (the failure reproduces, or fails anew),
2 on a usage error, a lane that could not run, or a real lane that disagrees
with the simulator (a dpsim bug: its verdict cannot be trusted).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsim import allowances, cex
from dpsim.cli import add_command
from dpsim.cli.check import add_target_arguments
from dpsim.errors import UsageError
from dpsim.isolation import prints_to_stderr, run_isolated
from dpsim.lanes.runner.case import is_runner_file
from dpsim.properties import Evidence
from dpsim.records.case import Case
from dpsim.replay import (
    BACKENDS,
    HOLDS,
    REPRODUCED,
    SAME_VERDICTS,
    Chosen,
    LaneRun,
    Rerun,
    check_recorded_sources,
    choose,
    compare,
    disagreements,
    load_chosen,
    replay_in_sim,
    run_lane,
)
from dpsim.replay.lane import DEFAULT_TIMEOUT_S
from dpsim.replay.render import lane_summary, render_processes
from dpsim.report import render_case_run
from dpsim.targets.buildable import rules_of
from dpsim.targets.load import Target
from dpsim.terminal import printable

HELP = "rerun a counterexample file (simulated, or on real gloo/NCCL processes)"
EPILOG = """\
The target is the one the file records, unless --vllm / --target / --runner /
--caller-file name another (each but --vllm alone keeps the recorded vLLM
under it); the runner is the recorded one (a file without one is a V2 file)
unless --runner names the other. Before anything runs, the recorded target's
source files are hashed (read, not executed): if one differs from the file's
record, replay refuses (exit 2) unless those options name the target
explicitly, which is how a fix is verified. A path the file names that is not
on the command line (a --target or --caller-file file, a source tree) is said
on stderr before it runs.

backends:
  sim    the simulator, with the recorded scheduling choices: on the recorded
         target it reproduces verdict and per-rank diagnosis byte for byte
  gloo   one real process per rank on this host, gloo process groups; a hang
         is real and ends at --timeout; compared with the simulator
  nccl   as gloo, with the forward pass's groups on NCCL, one GPU per rank

exit status: 0 the properties hold now, 1 a property fails, 2 an error
(including a real lane that disagrees with the simulator: a dpsim bug).

examples:
  dpsim replay dpsim-out/step-no-hang-5e8bb81b48.json
  dpsim replay FILE --vllm 0.32.0          is the bug in another release?
  dpsim replay FILE --runner v1            ... in the same release's V1 runner?
  dpsim replay FILE --backend gloo --timeout 5
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "replay", HELP, EPILOG)
    parser.add_argument(
        "file",
        metavar="FILE",
        help="a counterexample JSON file, or a runner lane case file",
    )
    add_target_arguments(parser)
    parser.add_argument(
        "--backend",
        default="sim",
        choices=("sim", *BACKENDS),
        help="where the case reruns (default sim; see backends below)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"real lanes: how long a stuck collective waits (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one summary object")
    allowances.add_arguments(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    data = cex.files.load_json(Path(arguments.file))
    if is_runner_file(data):
        return _replay_runner_case(arguments, data)
    counterexample = cex.read(Path(arguments.file))
    chosen = choose(
        counterexample,
        arguments.vllm,
        arguments.target,
        arguments.runner,
        arguments.caller_file,
    )
    check_recorded_sources(counterexample, chosen)
    if chosen.unasked:
        print(
            "dpsim: replay will execute "
            + " and ".join(printable(path) for path in chosen.unasked)
            + ", named by the counterexample, not on this command line",
            file=sys.stderr,
        )
    if arguments.backend != "sim":
        return _replay(arguments, counterexample, chosen)
    # Only the simulator runs the target in this process: isolated, so that a
    # target that exits or crashes it cannot end the replay as "holds now".
    return run_isolated(
        lambda: _replay(arguments, counterexample, chosen),
        allowance=allowances.from_arguments(arguments),
        json_errors=arguments.json,
    )


def _replay_runner_case(arguments: argparse.Namespace, data: Any) -> int:
    """A runner-lane case file: rerun through the release's real callers."""
    from dpsim.lanes.runner import commands

    return run_isolated(
        lambda: commands.replay(arguments, data),
        allowance=allowances.from_arguments(arguments),
        json_errors=arguments.json,
    )


def _replay(
    arguments: argparse.Namespace, counterexample: cex.Counterexample, chosen: Chosen
) -> int:
    with prints_to_stderr():
        target = load_chosen(counterexample, chosen).target
        rerun = replay_in_sim(counterexample, target)
        status = compare(counterexample, rerun)
        unbuildable = _unbuildable(counterexample.case, target)
    lane: LaneRun | None = None
    differences: tuple[str, ...] = ()
    if arguments.backend != "sim":
        lane = run_lane(
            counterexample.case,
            vllm=chosen.vllm,
            target_file=chosen.target_file,
            runner=chosen.runner,
            caller_file=chosen.caller_file,
            properties=counterexample.properties,
            backend=arguments.backend,
            timeout_s=arguments.timeout,
            expected_files={item.module: item.sha256 for item in target.files},
        )
        differences = disagreements(
            rerun.result, rerun.verdicts, lane.result, lane.verdicts
        ) + tuple(f"source: {line}" for line in lane.source_mismatch)
    replayed = Replayed(
        arguments.file,
        arguments.backend,
        counterexample,
        rerun,
        status,
        lane,
        differences,
        unbuildable,
    )
    if arguments.json:
        print(json.dumps(_summary(replayed), sort_keys=True))
    else:
        print(_render(replayed))
    if differences:
        return 2
    failing = lane.verdicts if lane is not None else rerun.verdicts
    return 1 if failing else 0


@dataclass(frozen=True)
class Replayed:
    """One ``dpsim replay`` run, as rendered (text) or summarised (JSON)."""

    file: str
    backend: str
    counterexample: cex.Counterexample
    rerun: Rerun
    status: str
    lane: LaneRun | None
    differences: tuple[str, ...]
    #: Why the target's release would not build the policy of a case that
    #: claims the caller profile; None when it would (or the case is contract).
    unbuildable: str | None = None


def _unbuildable(case: Case, target: Target) -> str | None:
    """Why ``target``'s release would not build a caller-profile case's policy.

    Files written before the caller profile drew only buildable tables may
    claim it for a table vLLM never builds: a failure there is not a finding
    of the caller profile, and the reader is told so.
    """
    if case.profile != "caller":
        return None
    try:
        return rules_of(target).unbuildable(case.policy)
    except UsageError as error:
        return f"cannot tell whether it builds the policy: {error}"


_STATUS_LINES = {
    REPRODUCED: "the failure reproduces: same verdicts and per-rank diagnosis, byte for byte",
    SAME_VERDICTS: "the bug is still there: the same verdicts (the trace differs, as "
    "another target's does)",
    HOLDS: "every property holds now: the bug is not there on this target",
}


def _render(replayed: Replayed) -> str:
    counterexample, rerun, lane = replayed.counterexample, replayed.rerun, replayed.lane
    recorded = counterexample.verdicts[0] if counterexample.verdicts else None
    # The file's label and messages, and a target's, are shown escaped.
    lines = [
        f"dpsim replay: {printable(replayed.file)}",
        f"  recorded on {printable(counterexample.target.get('label'))}: "
        + printable(
            f"{recorded['property']}: {recorded['message']}"
            if recorded
            else counterexample.outcome
        ),
        f"  rerun on    {printable(rerun.target.label)} (simulator)"
        + (", recorded choices did not fit: default order" if rerun.diverged else ""),
        "",
        render_case_run(
            _title(rerun.verdicts), rerun.case, Evidence(rerun.case, rerun.result)
        ),
        "",
        _STATUS_LINES.get(
            replayed.status,
            "a property still fails, but not as recorded: "
            + printable("; ".join(str(verdict) for verdict in rerun.verdicts)),
        ),
    ]
    if replayed.unbuildable is not None:
        lines.append(
            f"note: the case claims the caller profile, but {printable(rerun.target.label)} "
            f"would not build its policy ({printable(replayed.unbuildable)}): "
            "read it as a contract-profile case"
        )
    if lane is not None:
        lines.extend(["", *_render_lane(lane, replayed.differences)])
    return "\n".join(lines)


def _title(verdicts: Any) -> str:
    if not verdicts:
        return "simulated: every property holds"
    return "simulated: " + str(verdicts[0])


def _render_lane(lane: LaneRun, differences: tuple[str, ...]) -> list[str]:
    return [
        render_case_run(
            f"real {lane.backend}, {lane.case.dp_size} processes: "
            + (str(lane.verdicts[0]) if lane.verdicts else "every property holds"),
            lane.case,
            Evidence(lane.case, lane.result),
        ),
        "",
        *render_processes(lane, differences),
    ]


def _summary(replayed: Replayed) -> dict[str, Any]:
    counterexample, rerun, lane = replayed.counterexample, replayed.rerun, replayed.lane
    summary: dict[str, Any] = {
        "file": replayed.file,
        "recorded_target": counterexample.target.get("label"),
        "target": rerun.target.label,
        "runner": rerun.target.runner,
        "backend": replayed.backend,
        "status": replayed.status,
        "verdict": "pass" if rerun.holds else "fail",
        "outcome": rerun.result.outcome.value,
        "verdicts": [verdict.to_dict() for verdict in rerun.verdicts],
        "diverged": rerun.diverged,
        "caller_policy_unbuildable": replayed.unbuildable,
    }
    if lane is not None:
        summary["lane"] = lane_summary(lane, replayed.differences)
    return summary
