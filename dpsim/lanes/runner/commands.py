"""The runner lane's side of ``dpsim check``, ``replay`` and ``versions``.

``check --lane runner`` draws runner cases (:mod:`dpsim.lanes.runner.check`),
prints a progress line as the sync lane's check does, and writes a failing
case, shrunk, as a runner case file (:mod:`dpsim.lanes.runner.case`) under
``--out``. ``replay`` reruns such a file on the recorded target (or the one
named) and says whether the failure reproduces byte for byte. Exit status as
the sync lane's: 0 every property held, 1 one failed, 2 a usage or target
error, including a release or case the lane cannot drive.

They live with the lane, not in :mod:`dpsim.cli` (whose every module is
imported to find its commands): ``check`` and ``replay`` import this module
only when a runner-lane run or file asks for it. ``versions --lane runner``
runs one check per release and writes a row each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import dpsim
from dpsim.errors import UsageError
from dpsim.lanes.runner import case as runner_case
from dpsim.lanes.runner.case import RunnerCase, RunnerCaseFile
from dpsim.lanes.runner.check import (
    DEFAULT_RUNNER_EXAMPLES,
    DEFAULT_RUNNER_RANKS,
    RunnerCheckOptions,
    RunnerCheckReport,
    run_runner_check,
)
from dpsim.lanes.runner.processes import (
    RunnerLaneRun,
    lane_differences,
    run_runner_lane,
)
from dpsim.lanes.runner.run import RunnerResult, run_runner_case, sources_for
from dpsim.lanes.runner.sources import (
    OLDEST_RUNNER_LANE,
    OLDEST_V1_RUNNER_LANE,
    check_runner_lane_release,
    lane_modules,
)
from dpsim.options import parse_ranks
from dpsim.progress import StatusLine
from dpsim.properties import (
    NOT_FOR_RUNNER_LANE,
    Evidence,
    Verdict,
    judge,
    select_for_runner_lane,
)
from dpsim.records.policy import CapturePolicy
from dpsim.records.trace import SimResult
from dpsim.replay.render import lane_summary, render_processes
from dpsim.report import describe_policy, phase_table
from dpsim.sim.render import render_table
from dpsim.targets import TargetSpec, load_spec
from dpsim.targets.load import Target
from dpsim.targets.spec import V1_REMOVED, ReleaseSpec
from dpsim.terminal import printable

#: Sync-lane options that mean nothing to the runner lane's check.
_SYNC_ONLY_OPTIONS = (
    ("scenario", "--scenario"),
    ("db", "--db"),
    ("caller_file", "--caller-file"),
)


def refuse_sync_only_options(arguments: argparse.Namespace, command: str) -> None:
    for name, flag in _SYNC_ONLY_OPTIONS:
        if getattr(arguments, name, None):
            raise UsageError(f"{command} --lane runner: {flag} is the sync lane's")
    if getattr(arguments, "profile", "caller") != "caller":
        raise UsageError(f"{command} --lane runner: --profile is the sync lane's")


def check_options(arguments: argparse.Namespace) -> RunnerCheckOptions:
    """The runner check's options from ``check``'s arguments (its own
    defaults where the sync lane's flags were left unset)."""
    refuse_sync_only_options(arguments, "check")
    ranks = parse_ranks(arguments.ranks) if arguments.ranks else DEFAULT_RUNNER_RANKS
    if ranks[0] < 1:
        raise UsageError("--ranks: at least 1")
    select_for_runner_lane(arguments.property)  # unknown names: one line, now
    policy = None
    if arguments.policy:
        from dpsim.capture.policy_files import load_policy

        policy = load_policy(Path(arguments.policy))
        refuse_unmodelled(policy, "--policy")
    return RunnerCheckOptions(
        runner=arguments.runner or "v2",
        policy=policy,
        properties=tuple(dict.fromkeys(arguments.property)),
        ranks=ranks,
        examples=arguments.examples
        if arguments.examples is not None
        else DEFAULT_RUNNER_EXAMPLES,
        seed=arguments.seed,
    )


def refuse_unsupported(spec: TargetSpec) -> None:
    """Refuse, before anything is fetched, a release the lane cannot drive
    with the spec's model runner."""
    if isinstance(spec.base, ReleaseSpec):
        check_runner_lane_release(spec.base.version, spec.runner)


def refuse_unmodelled(policy: CapturePolicy, flag: str) -> None:
    """Refuse, in one line, a policy the lane's model runner does not model."""
    for present, what in (
        (policy.microbatching is not None, "microbatching"),
        (policy.lora_capture_cases is not None, "LoRA capture cases"),
        (policy.encoder_decoder, "an encoder-decoder model"),
    ):
        if present:
            raise UsageError(
                f"{flag}: the runner lane does not model {what}; drop it from the policy"
            )


def check(arguments: argparse.Namespace, spec: TargetSpec) -> int:
    """``dpsim check --lane runner``, in the child process ``run_isolated`` forks."""
    options = check_options(arguments)
    target = load_spec(spec)
    measurement = None
    if getattr(arguments, "coverage", False):
        from dpsim.coverage import measure
        from dpsim.coverage.targets import runner_lane_scopes

        measurement = measure(runner_lane_scopes(target))
        options = replace(options, coverage=measurement)
    line = None if arguments.json else StatusLine()

    def progress(done: int, planned: int) -> None:
        assert line is not None
        line.show(f"checking {target.label} · runner lane · {done}/{planned} cases")

    try:
        report = run_runner_check(target, options, progress if line else None)
    finally:
        if line is not None:
            line.close()
    written = None
    if report.finding is not None:
        written = save(target, report, Path(arguments.out))
    covered = None
    if measurement is not None:
        from dpsim.coverage.cli import finish

        covered = finish(
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
    return 0 if report.passed else 1


def target_record(target: Target) -> dict[str, Any]:
    """The target as a runner case file records it: as a counterexample
    does, plus the SHA-256 of every runner-lane file the target has (those
    its model runner's lane reads)."""
    sources = sources_for(target)
    lane_files = {}
    for module in lane_modules(target.runner):
        if module.endswith(".*"):
            continue  # packages: their modules are recorded by name below
        found = sources.file_of(module)
        if found is not None:
            lane_files[module] = hashlib.sha256(found.read_bytes()).hexdigest()
    return {
        "label": target.label,
        "spec": target.spec.to_dict(),
        "version": target.version,
        "files": {loaded.module: loaded.sha256 for loaded in target.files},
        "lane_files": lane_files,
    }


def save(target: Target, report: RunnerCheckReport, out: Path) -> Path:
    finding = report.finding
    assert finding is not None
    return RunnerCaseFile(
        target=target_record(target),
        case=finding.case,
        properties=tuple(prop.name for prop in report.properties),
        verdicts=tuple(verdict.to_dict() for verdict in finding.verdicts),
        outcome=finding.run.result.outcome.value,
        trace=finding.run.result.to_dict(),
        dpsim_version=dpsim.__version__,
    ).write(out)


def summary(report: RunnerCheckReport, written: Path | None) -> dict[str, Any]:
    finding = report.finding
    return {
        "lane": "runner",
        "verdict": "pass" if report.passed else "fail",
        "target": report.target.label,
        "property": finding.primary.property if finding else None,
        "message": str(finding.primary) if finding else None,
        "examples": report.examples,
        "generated": report.examples - report.shrinking,
        "shrinking": report.shrinking,
        "seconds": round(report.seconds, 3),
        "counterexample": str(written) if written else None,
        "properties_not_run": dict(NOT_FOR_RUNNER_LANE),
    }


def _runner_note(runner: str) -> str:
    """How reports name a model runner other than the lane's default V2."""
    return " (V1 model runner)" if runner == "v1" else ""


def render_case(title: str, case: RunnerCase, run: RunnerResult) -> str:
    """A runner case, its syncs per forward step, and where each rank stood."""
    options = case.options
    speculator = (
        f", speculator {options.speculator} k={options.num_speculative_tokens}"
        if options.speculator
        else ""
    )
    lines = [
        printable(title),
        f"  runner lane{_runner_note(case.runner)}, {case.dp_size} ranks, "
        f"seed {case.seed}"
        + (", async scheduling" if options.async_scheduling else "")
        + (f", {options.executor} executor" if options.executor != "uni" else "")
        + speculator,
        f"  engine: max_num_seqs {options.max_num_seqs}, max_num_batched_tokens "
        f"{options.max_num_batched_tokens}, max_model_len {options.max_model_len}, "
        f"dp_sync_interval {options.dp_sync_interval}",
        f"  policy: {describe_policy(case.policy)}",
        "",
        "requests (rank: id arrival prompt+output [kv wait] [accepted]):",
    ]
    for rank, stream in enumerate(case.streams):
        shown = [
            f"{r.req_id}@{r.arrival} {r.prompt_len}+{r.output_len}"
            + (f" kv{r.kv_wait}" if r.kv_wait else "")
            + (f" acc{list(r.accepted)}" if r.accepted else "")
            for r in stream.requests
        ]
        lines.append(f"  {rank}: " + (", ".join(shown) if shown else "(idle)"))
    lines.append("")
    evidence = Evidence(case, run.result)
    for phase in evidence.phases:
        lines.append(f"{printable(phase.name)}:")
        lines.extend("  " + row for row in phase_table(phase).splitlines())
        lines.append("")
    lines.append("where each rank stands:")
    lines.extend("  " + row for row in render_table(run.result).splitlines())
    stood = [
        f"  rank {rank}: " + " <- ".join(stack[:4])
        for rank, stack in enumerate(run.stood_at)
        if stack
    ]
    if stood:
        lines.append("")
        lines.append("in vLLM (innermost first):")
        lines.extend(printable(line) for line in stood)
    return "\n".join(lines)


def render_report(report: RunnerCheckReport, written: Path | None) -> str:
    options = report.options
    low, high = options.ranks
    lines = [
        f"dpsim check --lane runner{_runner_note(options.runner)}: "
        f"{report.target.label}, ranks {low}..{high}, "
        f"{options.examples} examples, seed {options.seed}",
        "  not judged on the runner lane: "
        + "; ".join(f"{name} ({why})" for name, why in NOT_FOR_RUNNER_LANE.items()),
    ]
    if options.policy is not None:
        lines.append(
            f"  policy fixed: {describe_policy(options.policy)} (fitted to each "
            "engine's max_num_seqs, decode length and token budget)"
        )
    finding = report.finding
    status = f"FAIL  {finding.primary}" if finding else "pass"
    lines.append(
        f"  runner   {report.examples - report.shrinking:>6} examples + "
        f"{report.shrinking:>5} shrinking {report.seconds:6.1f}s  {status}"
    )
    if finding is not None:
        lines.append("")
        lines.append(
            render_case(
                f"counterexample (shrunk): {finding.primary}", finding.case, finding.run
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
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"result: {verdict}: {report.examples} runner cases, {report.shrinking} of "
        f"them while shrinking ({report.seconds:.1f}s)"
    )
    return "\n".join(lines)


# -- replay -----------------------------------------------------------------------


def replay(arguments: argparse.Namespace, data: Any) -> int:
    """``dpsim replay`` of a runner case file (already parsed as JSON)."""
    path = Path(arguments.file)
    recorded = runner_case.parse(data, path)
    backend = getattr(arguments, "backend", "sim")
    if backend not in ("sim", "gloo"):
        raise UsageError(
            f"replay --backend {backend}: runner case files replay on the simulator "
            "or on real gloo processes (the stood-in model computes nothing on a GPU)"
        )
    runner = recorded.case.runner
    if arguments.runner and arguments.runner != runner:
        raise UsageError(
            f"replay --runner {arguments.runner}: this runner case drives the "
            f"{runner.upper()} model runner (recorded in the file); drop --runner"
        )
    if arguments.target or arguments.caller_file:
        raise UsageError(
            "replay of a runner case: --target and --caller-file are the sync lane's; "
            "name another vLLM with --vllm"
        )
    spec = recorded.target["spec"]
    vllm = arguments.vllm or str(spec["base"])
    from dpsim.targets import parse_target

    target = load_spec(parse_target(vllm, spec.get("dp_utils_file"), runner=runner))
    if arguments.vllm is None:
        _check_recorded(recorded, target)
    run = run_runner_case(target, recorded.case)
    properties = select_for_runner_lane(recorded.properties)
    verdicts = judge(recorded.case, run.result, properties)
    same = _same(recorded, run.result, verdicts)
    lane = None
    differences: tuple[str, ...] = ()
    if backend == "gloo":
        lane = run_runner_lane(
            target, recorded.case, properties, timeout_s=arguments.timeout
        )
        differences = lane_differences(run.result, verdicts, lane)
    if arguments.json:
        print(
            json.dumps(
                {
                    "file": str(path),
                    "lane": "runner",
                    "recorded_target": recorded.target.get("label"),
                    "target": target.label,
                    "status": same,
                    "verdict": "fail" if verdicts else "pass",
                    "outcome": run.result.outcome.value,
                    "verdicts": [verdict.to_dict() for verdict in verdicts],
                    **(
                        {}
                        if lane is None
                        else {"lane": lane_summary(lane, differences)}
                    ),
                },
                sort_keys=True,
            )
        )
    else:
        first = recorded.verdicts[0] if recorded.verdicts else None
        print(
            "\n".join(
                [
                    f"dpsim replay: {printable(path)} (runner lane)",
                    f"  recorded on {printable(recorded.target.get('label'))}: "
                    + printable(
                        f"{first['property']}: {first['message']}"
                        if first
                        else recorded.outcome
                    ),
                    f"  rerun on    {printable(target.label)} (simulator)",
                    "",
                    render_case(_title(verdicts), recorded.case, run),
                    "",
                    _STATUS[same],
                    *([] if lane is None else _render_lane(lane, differences)),
                ]
            )
        )
    if differences:
        return 2  # the real lane disagrees with the simulator: a dpsim bug
    return 1 if (lane.verdicts if lane is not None else verdicts) else 0


def _render_lane(lane: RunnerLaneRun, differences: tuple[str, ...]) -> list[str]:
    return [
        "",
        render_case(
            f"real gloo, {lane.case.dp_size} processes: "
            + (str(lane.verdicts[0]) if lane.verdicts else "every property holds"),
            lane.case,
            RunnerResult(lane.result),
        ),
        "",
        *render_processes(lane, differences),
    ]


_STATUS = {
    "reproduced": "the failure reproduces: same verdicts and trace, byte for byte",
    "same-verdicts": "the bug is still there: the same verdicts (the trace differs)",
    "holds": "every property holds now: the bug is not there on this target",
    "different": "a property still fails, but not as recorded",
}


def _title(verdicts: list[Verdict]) -> str:
    return "simulated: " + (str(verdicts[0]) if verdicts else "every property holds")


def _same(recorded: RunnerCaseFile, result: SimResult, verdicts: list[Verdict]) -> str:
    now = [verdict.to_dict() for verdict in verdicts]
    if not verdicts:
        return "holds"
    if now != list(recorded.verdicts):
        return "different"
    canonical = json.dumps(result.to_dict(), indent=1, sort_keys=True)
    if canonical == json.dumps(recorded.trace, indent=1, sort_keys=True):
        return "reproduced"
    return "same-verdicts"


def _check_recorded(recorded: RunnerCaseFile, target: Target) -> None:
    """Refuse a recorded target whose sources changed (hashes only)."""
    files = dict(recorded.target.get("files", {}))
    loaded = {item.module: item.sha256 for item in target.files}
    lane = recorded.target.get("lane_files", {})
    now_lane = target_record(target)["lane_files"] if lane else {}
    for module, digest in [*files.items(), *lane.items()]:
        now = loaded.get(module, now_lane.get(module))
        if now != digest:
            raise UsageError(
                f"the runner case's target changed: {printable(module)} differs from "
                "the record; pass --vllm explicitly to run it anyway: that is how a "
                "fix is verified"
            )


# -- versions -----------------------------------------------------------------------

#: The releases ``versions --lane runner`` checks by default, per model
#: runner: the first of each minor the lane drives with it (V1's until the
#: release that removed that runner).
RUNNER_LANE_RELEASES = {
    runner: tuple(f"0.{minor}.0" for minor in range(oldest[1], last[1]))
    for runner, oldest, last in (
        ("v2", OLDEST_RUNNER_LANE, (0, 35)),
        ("v1", OLDEST_V1_RUNNER_LANE, V1_REMOVED),
    )
}
#: Model runners in the report's order (the lane's default first).
_LANE_RUNNERS = ("v2", "v1")


def versions(arguments: argparse.Namespace) -> int:
    """``dpsim versions --lane runner``: one runner check per release (or
    tree) and model runner (both, or ``--runner``'s), one row each, written
    to ``--out/report.md`` and printed; a release the lane cannot drive with
    a runner gets an ``error`` row with its refusal."""
    from dpsim.isolation import run_isolated
    from dpsim.targets import parse_target

    if arguments.target:
        raise UsageError(
            "versions --lane runner: --target FILE@SPEC is the sync lane's"
        )
    if arguments.profile != "caller":
        raise UsageError("versions --lane runner: --profile is the sync lane's")
    runners = (arguments.runner,) if arguments.runner else _LANE_RUNNERS
    requests: list[tuple[str, str]] = []
    for runner in runners:
        names = arguments.specs or list(RUNNER_LANE_RELEASES[runner])
        requests.extend((name, runner) for name in names)
    if arguments.specs:
        # The user's order, each release's runners together.
        order = {name: index for index, name in enumerate(arguments.specs)}
        requests.sort(key=lambda request: order[request[0]])
    parsed: list[TargetSpec | UsageError] = []
    for name, runner in requests:
        try:
            parsed.append(parse_target(name, runner=runner))
        except UsageError as error:  # that runner's row says why
            parsed.append(error)
    if not arguments.runner:
        # Unasked, a runner the release removed (0.34.0 has no V1) gets no
        # row, as in the sync lane's report.
        kept = [
            index
            for index, (name, runner) in enumerate(requests)
            if not (runner == "v1" and _lacks_v1_runner(name))
        ]
        requests = [requests[index] for index in kept]
        parsed = [parsed[index] for index in kept]
    specs = parsed
    if arguments.examples is not None and arguments.examples < 1:
        raise UsageError("--examples must be at least 1")
    options = RunnerCheckOptions(
        ranks=parse_ranks(arguments.ranks) if arguments.ranks else DEFAULT_RUNNER_RANKS,
        examples=arguments.examples or DEFAULT_RUNNER_EXAMPLES,
        seed=arguments.seed,
    )
    out = Path(arguments.out)
    from dpsim import allowances

    return run_isolated(
        lambda: _versions(requests, specs, options, out),
        allowance=allowances.from_environment(),
    )


def _lacks_v1_runner(name: str) -> bool:
    from dpsim.targets.spec import lacks_v1_runner, parse_base

    try:
        return lacks_v1_runner(parse_base(name))
    except UsageError:
        return False  # its row says what is wrong with the name


def _versions(
    requests: list[tuple[str, str]],
    specs: list[TargetSpec | UsageError],
    options: RunnerCheckOptions,
    out: Path,
) -> int:
    rows: list[tuple[str, str, str, str, str]] = []
    failed = errors = False
    for (name, runner), spec in zip(requests, specs, strict=True):
        try:
            if isinstance(spec, UsageError):
                raise spec
            refuse_unsupported(spec)
            target = load_spec(spec)
            report = run_runner_check(target, replace(options, runner=runner))
        except UsageError as error:
            rows.append((name, runner, "error", printable(error), ""))
            errors = True
            continue
        finding = report.finding
        if finding is None:
            rows.append((target.label, runner, "pass", f"{report.examples} cases", ""))
            continue
        failed = True
        # One folder per row: the same case found on two releases (or both
        # runners) is two files.
        folder = re.sub(r"[^A-Za-z0-9._-]", "_", name) + (
            "-v1" if runner == "v1" else ""
        )
        written = save(target, report, out / folder)
        rows.append(
            (
                target.label,
                runner,
                finding.primary.property,
                printable(finding.primary),
                str(written),
            )
        )
    lines = [
        f"runner lane, ranks {options.ranks[0]}..{options.ranks[1]}, "
        f"{options.examples} examples, seed {options.seed}",
        "",
        "| vLLM | runner | verdict | what | counterexample |",
        "|---|---|---|---|---|",
        *(f"| {' | '.join(cell.replace('|', '/') for cell in row)} |" for row in rows),
    ]
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    print(text, end="")
    print(f"written: {out / 'report.md'}")
    # A property failed: 1; otherwise a row with no verdict: 2.
    return 1 if failed else 2 if errors else 0
