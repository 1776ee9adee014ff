"""``dpsim policy``: see and judge a capture-size policy before deploying it.

``show`` prints the table a version builds from a policy; ``validate`` asks
whether policies are safe with DP (the property suite, policy fixed) and
what they cost under a workload (padding, graph modes, graphs captured),
side by side, with plots and an HTML report. Exit status of ``validate``: 0
when no policy broke a property, 1 when one did, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpsim import allowances
from dpsim.capture.policy_files import load_policy
from dpsim.capture.table import capture_table
from dpsim.cex.findings import write_counterexamples
from dpsim.cli import add_command, add_debug_argument, check_output_directory
from dpsim.cli.check import (
    add_target_arguments,
    render_report,
    summary,
    target_spec,
)
from dpsim.costs import (
    BUILTIN_WORKLOADS,
    Comparison,
    NamedPolicy,
    Workload,
    compare,
    graph_count,
    load_trace,
    resolve_workload,
)
from dpsim.costs.compare import NothingMeasured
from dpsim.costs.report import comparison_dict, render_comparison
from dpsim.costs.safety import SafetyRun, check_policy, unsafe_policies
from dpsim.costs.suggest import suggest_policy
from dpsim.costs.workload import decode_query_len_for, trace_path
from dpsim.errors import UsageError
from dpsim.isolation import prints_to_stderr, run_isolated
from dpsim.limits import MAX_RANKS, int_problem
from dpsim.options import SEED_HELP, add_runner_argument
from dpsim.records.case import PROFILES
from dpsim.records.policy import CapturePolicy, ManagerConfig
from dpsim.report import describe_policy
from dpsim.scenarios.run import PolicyRefused, manager_for, tables_for
from dpsim.targets import DEFAULT_RELEASE, TargetSpec, load_spec, parse_target
from dpsim.targets.load import Target

HELP = "show a policy's capture table, or validate policies: safety and cost"
EPILOG = f"""\
The table is built by the version's own CudaGraphManager from the policy, so
it is exactly what that vLLM would capture. Policy files are JSON or TOML;
see docs/reference/policy-files.md for the format.

examples:
  dpsim policy show my-policy.toml
  dpsim policy show my-policy.json --vllm 0.29.0 --dp 8

(default --vllm: {DEFAULT_RELEASE})
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "policy", HELP, EPILOG)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="print the capture table, one descriptor per row",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_debug_argument(show)
    show.add_argument("policy", metavar="POLICY", help="a policy file (.json/.toml)")
    show.add_argument("--vllm", metavar="SPEC", help="release, tree or package dir")
    add_runner_argument(show)
    show.add_argument(
        "--dp", type=int, default=2, metavar="N", help="DP size (default 2)"
    )
    show.set_defaults(run=run_show)
    _add_validate(actions)


def run_show(arguments: argparse.Namespace) -> int:
    problem = int_problem(arguments.dp, 1, MAX_RANKS)
    if problem is not None:
        raise UsageError(f"--dp {problem}")
    policy = load_policy(Path(arguments.policy))
    spec = parse_target(arguments.vllm, runner=arguments.runner)
    # The target's code runs to build its managers: isolated, as in check.
    return run_isolated(
        functools.partial(_show, spec, policy, arguments.dp),
        allowance=allowances.from_environment(),
    )


def _show(spec: TargetSpec, policy: CapturePolicy, dp_size: int) -> int:
    with prints_to_stderr():
        tables = render_tables(load_spec(spec), policy, dp_size)
    print(tables)
    return 0


def render_tables(target: Target, policy: CapturePolicy, dp_size: int) -> str:
    tables = tables_for(target, policy, dp_size)
    sections = [
        _section(
            f"target table on {target.label}",
            target,
            tables.target,
            describe_policy(policy),
        )
    ]
    if policy.drafter is not None:
        drafter = describe_policy(policy.drafter)
        sections.append(
            _section(
                f"drafter prefill table (decode length {policy.decode_query_len}, "
                "as the target's)",
                target,
                tables.drafter_prefill,
                drafter,
            )
        )
        sections.append(
            _section(
                f"drafter decode table (one token per request, "
                f"{tables.drafter_decode.cudagraph_mode} as vLLM's speculator builds it)",
                target,
                tables.drafter_decode,
                drafter,
            )
        )
    return "\n\n".join(sections)


def _section(title: str, target: Target, config: ManagerConfig, policy: str) -> str:
    lines = [title, f"  policy: {policy}"]
    try:
        table = capture_table(manager_for(target, config))
    except PolicyRefused as refused:
        lines.append(f"  refused by this vLLM's manager: {refused}")
        return "\n".join(lines)
    lines.append("")
    lines.extend("  " + line for line in table.render().splitlines())
    return "\n".join(lines)


# -- validate ------------------------------------------------------------------

VALIDATE_HELP = "is a policy safe with DP, and what does it cost under a workload?"
VALIDATE_EPILOG = f"""\
For each policy: the property suite with the policy fixed, under the caller
and contract profiles (scenarios the policy turns on: step and profile
always, drafter when decode_query_len > 1, ubatch when it microbatches);
then the workload runs step by step through the real sync at each DP size,
and the figures are set side by side, best value per row marked.

workloads: {", ".join(BUILTIN_WORKLOADS)}, or a JSONL trace, one line per step:
  {{"ranks": [[1, 1, 1], [1, 1, 37], []]}}           query lengths per rank ([] idle)
  {{"ranks": [{{"num_reqs": 3, "num_tokens": 3}}, {{"query_lens": [5]}}]}}
A trace runs at its own DP size unless --ranks is given (its per-rank
batches are then dealt N to a step).

examples:
  dpsim policy validate default.toml pow2.toml
  dpsim policy validate mine.toml --workload bursty --ranks 2,8,32 --steps 400
  dpsim policy validate mine.toml --workload my-trace.jsonl --suggest 40
  dpsim policy validate mine.toml --examples 0 --json     costs only

Files under --out: padding.png, modes.png, report.html (self-contained),
costs.json, and any counterexample (replay with `dpsim replay FILE`).
"""


def _add_validate(actions: Any) -> None:
    validate = actions.add_parser(
        "validate",
        help="check policies for DP safety and compare their costs",
        description=VALIDATE_HELP,
        epilog=VALIDATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_debug_argument(validate)
    validate.add_argument(
        "policies", nargs="+", metavar="POLICY", help="policy files (.json/.toml)"
    )
    add_target_arguments(validate)
    validate.add_argument(
        "--ranks",
        metavar="N[,N...]",
        help="DP sizes to cost at (default 4,16; a trace: its own size)",
    )
    validate.add_argument(
        "--workload",
        default="decode-heavy",
        metavar="NAME|FILE",
        help=f"{', '.join(BUILTIN_WORKLOADS)} or a .jsonl trace (default decode-heavy)",
    )
    validate.add_argument(
        "--steps", type=int, default=200, metavar="N", help="steps (default 200)"
    )
    validate.add_argument("--seed", type=int, default=0, metavar="N", help=SEED_HELP)
    validate.add_argument(
        "--examples",
        type=int,
        default=40,
        metavar="N",
        help="safety cases per scenario and profile (default 40; 0 skips safety)",
    )
    validate.add_argument(
        "--profile",
        action="append",
        default=[],
        choices=PROFILES,
        help="generator profile for safety (default: both)",
    )
    validate.add_argument(
        "--suggest",
        type=int,
        metavar="GRAPHS",
        help="also propose sizes for the workload within this many graphs",
    )
    validate.add_argument(
        "--out",
        default="dpsim-out/policy-report",
        metavar="DIR",
        help="report directory (default dpsim-out/policy-report)",
    )
    validate.add_argument("--json", action="store_true", help="print one JSON object")
    validate.set_defaults(run=run_validate)


def _parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(dict.fromkeys(int(part) for part in text.split(",")))
    except ValueError:
        raise UsageError(
            f"--ranks {text!r}: expected N or N,N,..., e.g. 4,16"
        ) from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--ranks {text!r}: every DP size must be >= 1")
    if max(sizes) > MAX_RANKS:
        raise UsageError(f"--ranks {text!r}: at most {MAX_RANKS:,} ranks")
    return sizes


def _named_policies(paths: list[str]) -> list[NamedPolicy]:
    named = []
    stems = [Path(path).stem for path in paths]
    for path, stem in zip(paths, stems, strict=True):
        # A name per column: the file's stem, or its path when stems clash.
        name = stem if stems.count(stem) == 1 else path
        named.append(NamedPolicy(name, load_policy(Path(path)), path))
    return named


def _workloads(
    arguments: argparse.Namespace, policies: list[NamedPolicy]
) -> list[Workload]:
    spec = arguments.workload
    if arguments.steps < 1:
        raise UsageError("--steps must be at least 1")
    if arguments.ranks is not None:
        sizes = _parse_sizes(arguments.ranks)
    elif spec in BUILTIN_WORKLOADS:
        sizes = (4, 16)
    else:
        sizes = (load_trace(trace_path(spec)).dp_size,)
    max_reqs = min(named.policy.max_num_seqs for named in policies)
    query_len = decode_query_len_for(
        spec, {named.name: named.policy.decode_query_len for named in policies}
    )
    return [
        resolve_workload(
            spec, size, arguments.steps, arguments.seed, max_reqs, query_len
        )
        for size in sizes
    ]


def _suggested(
    target: Target, base: NamedPolicy, workloads: list[Workload], budget: int
) -> NamedPolicy:
    query_len = base.policy.decode_query_len
    # Every rank of a graph step pads to the graph covering the step's
    # largest batch; an idle rank's batch is vLLM's dummy of one decode.
    # Steps where every rank is idle are not run (see Workload.working_steps).
    batch_sizes = [
        (max(sum(lengths) or query_len for lengths in step), workload.dp_size)
        for workload in workloads
        for step in workload.working_steps
    ]
    dp_size = workloads[0].dp_size

    def graphs_of(policy: CapturePolicy) -> int:
        try:
            return graph_count(target, policy, dp_size)
        except PolicyRefused:
            return budget + 1

    policy = suggest_policy(base.policy, batch_sizes, budget, graphs_of)
    return NamedPolicy(
        "suggested",
        policy,
        f"{base.name} with sizes {list(policy.capture_sizes)}, chosen for this "
        f"workload within {budget} graphs",
    )


def _safety(
    target: Target,
    arguments: argparse.Namespace,
    policies: list[NamedPolicy],
    dp_sizes: tuple[int, ...],
) -> list[SafetyRun]:
    if arguments.examples < 0:
        raise UsageError("--examples must be >= 0")
    if arguments.examples == 0:
        return []
    ranks = (max(2, min(dp_sizes)), max(2, max(dp_sizes)))
    profiles = tuple(dict.fromkeys(arguments.profile)) or PROFILES
    runs: list[SafetyRun] = []
    for named in policies:
        runs.extend(
            check_policy(
                target,
                named.name,
                named.policy,
                profiles=profiles,
                ranks=ranks,
                examples=arguments.examples,
                seed=arguments.seed,
            )
        )
    return runs


def _render_safety(runs: list[SafetyRun], written: dict[int, dict[str, Path]]) -> str:
    if not runs:
        return "safety: skipped (--examples 0)"
    options = runs[0].report.options
    low, high = options.ranks
    lines = [
        f"safety on {runs[0].report.target.label}: ranks {low}..{high}, "
        f"{options.examples} examples per scenario and profile, seed {options.seed}"
    ]
    details = []
    known: dict[int, str] = {}
    for index, run in enumerate(runs):
        scenarios = ", ".join(r.scenario for r in run.report.runs)
        failing = run.failing()
        explained = run.known()
        for finding in explained.values():
            known[finding.number] = finding.describe(run.report.target)
        if not failing:
            verdict = f"pass ({scenarios})"
        else:
            broken = ", ".join(
                f"{prop} in {sc}"
                + (f" (known bug {explained[sc].number})" if sc in explained else "")
                for sc, prop in failing.items()
            )
            verdict = f"FAIL {broken}"
            if run.only_known:
                verdict += ": only known bugs of this vLLM"
        lines.append(f"  {run.policy:<16} {run.profile:<9} {verdict}")
        if run.finding is not None:
            details.append(render_report(run.report, written[index]))
    lines.extend(f"  {text}" for _, text in sorted(known.items()))
    for detail in details:
        lines.append("")
        lines.append(detail)
    return "\n".join(lines)


def run_validate(arguments: argparse.Namespace) -> int:
    if arguments.suggest is not None and arguments.suggest < 1:
        raise UsageError("--suggest: the budget must be at least 1 graph")
    check_output_directory(Path(arguments.out), "--out")
    policies = _named_policies(arguments.policies)
    # Before the target is even named: a workload refused is refused at once,
    # whatever --vllm says.
    workloads = _workloads(arguments, policies)
    spec = target_spec(arguments)
    # The target's code runs here as in check: isolated, so that one which
    # ends the process is an error, never an exit 0 with nothing printed.
    return run_isolated(
        functools.partial(_validate, arguments, spec, policies, workloads),
        allowance=allowances.from_environment(),
        json_errors=arguments.json,
    )


def _validate(
    arguments: argparse.Namespace,
    spec: TargetSpec,
    policies: list[NamedPolicy],
    workloads: list[Workload],
) -> int:
    from dpsim.costs.plots import write_html, write_plots

    with prints_to_stderr():
        target = load_spec(spec)
        if arguments.suggest is not None:
            policies.append(
                _suggested(target, policies[0], workloads, arguments.suggest)
            )
        dp_sizes = tuple(workload.dp_size for workload in workloads)
        runs = _safety(target, arguments, policies, dp_sizes)
    out = Path(arguments.out)
    out.mkdir(parents=True, exist_ok=True)
    written = {
        index: write_counterexamples(run.report, out) for index, run in enumerate(runs)
    }
    safety_text = _render_safety(runs, written)
    failed = any(run.finding is not None for run in runs)
    try:
        with prints_to_stderr():
            measured = compare(target, policies, workloads)
        comparison: Comparison = replace(measured, unsafe=unsafe_policies(runs))
    except NothingMeasured as nothing:
        if not failed:
            raise
        # The safety failure is the answer; say why there are no costs.
        print(safety_text)
        print(f"\nno costs: {nothing}\nresult: FAIL")
        return 1
    images = write_plots(comparison, out)
    page = write_html(comparison, safety_text, images, out)
    costs = comparison_dict(comparison)
    (out / "costs.json").write_text(json.dumps(costs, indent=1, sort_keys=True) + "\n")
    files = [str(path) for path in (*images, page, out / "costs.json")]
    if arguments.json:
        print(
            json.dumps(
                {
                    "verdict": "fail" if failed else "pass",
                    "safety": [
                        {
                            "policy": run.policy,
                            "profile": run.profile,
                            "failing": run.failing(),
                            # Scenario -> its number in docs/findings.md.
                            "known": {
                                scenario: finding.number
                                for scenario, finding in run.known().items()
                            },
                            "only_known": run.only_known,
                            **summary(run.report, written[index]),
                        }
                        for index, run in enumerate(runs)
                    ],
                    **costs,
                    "files": files,
                },
                sort_keys=True,
            )
        )
    else:
        print(safety_text)
        print()
        print(render_comparison(comparison))
        print()
        print("written: " + ", ".join(files))
        print(f"result: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0
