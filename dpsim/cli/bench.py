"""``dpsim bench``: measure the harness (see :mod:`dpsim.bench`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dpsim import bench
from dpsim.cli import add_command
from dpsim.errors import UsageError
from dpsim.limits import MAX_RANKS
from dpsim.options import add_runner_argument
from dpsim.scenarios.run import preflight
from dpsim.search.options import ENGINES, add_engine_argument
from dpsim.targets import load_target
from dpsim.targets.spec import parse_target

HELP = "measure simulator overhead, check throughput and time to counterexample"
EPILOG = """\
measures:
  sim     simulated rounds/s of the real sync vs. the bare calls (overhead)
  check   cases per second end to end, and per case the microseconds of
          generation, simulation and judging; a row per --engine (default
          both: Hypothesis' engine, and the fast one), each a search of
          --cases cases in a fresh process (its warm-up included, as in a
          dpsim check; the target's load and imports are startup's)
  corpus  seconds to the first counterexample on each faulty target, and
          with shrinking (under --engine, default hypothesis)
  startup seconds from starting dpsim check to the end of its first case
          (a fresh process; the imports' share apart)
  runner  runner-lane cases/s at 4 ranks x 8 iterations, and the share of
          time in vLLM's own code (only when named; the V2 runner, 0.26+,
          or with --runner v1 the V1 runner)

sim and check run each model runner of --vllm (V2's dispatch_cg_and_sync_dp,
V1's coordinate_batch_across_dp under its real caller), one row each, unless
--runner names one; corpus runs every faulty target (of --runner's sync, if
given), each on its own runner.

examples:
  dpsim bench                         all measures, default sizes
  dpsim bench --vllm 0.29.0 --ranks 8 --json
  dpsim bench --measure sim --ranks 8 --ranks 64 --ranks 256
  dpsim bench --measure sim --runner v1 --vllm 0.33.0
  dpsim bench --measure runner --vllm 0.33.0
  dpsim bench --measure runner --runner v1 --vllm 0.33.0
"""
MEASURES = ("sim", "check", "corpus", "startup")
#: The runner lane's measure: run only when named (its cases drive whole engines).
RUNNER_MEASURE = "runner"
#: The runners measured side by side when --runner names none and the
#: release has both, V2 first.
RUNNERS_BESIDE = ("v2", "v1")


def register(commands: Any) -> None:
    parser = add_command(commands, "bench", HELP, EPILOG)
    parser.add_argument(
        "--vllm",
        default="0.29.0",
        metavar="SPEC",
        help="the release, tree or package dir measured (default 0.29.0)",
    )
    add_runner_argument(parser)
    parser.add_argument(
        "--ranks",
        type=int,
        action="append",
        metavar="N",
        help=f"DP sizes (repeatable; at most {MAX_RANKS:,})",
    )
    parser.add_argument(
        "--rounds", type=int, metavar="N", help="simulated rounds per size"
    )
    parser.add_argument(
        "--measure",
        action="append",
        choices=(*MEASURES, RUNNER_MEASURE),
        help="what to measure (repeatable; runner only when named)",
    )
    parser.add_argument(
        "--cases",
        type=int,
        default=bench.CHECK_CASES,
        metavar="N",
        help=f"cases per check row (default {bench.CHECK_CASES:,}); each row "
        "searches in a fresh process, so none borrows another's warm caches",
    )
    add_engine_argument(parser, repeatable=True)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    measures = arguments.measure or (
        ["sim"] if arguments.ranks and arguments.rounds else list(MEASURES)
    )
    if arguments.cases < 1:
        raise UsageError("--cases must be at least 1")
    if arguments.ranks and any(ranks < 1 for ranks in arguments.ranks):
        raise UsageError("--ranks must be at least 1")
    if arguments.ranks and max(arguments.ranks) > MAX_RANKS:
        raise UsageError(f"--ranks {max(arguments.ranks)}: at most {MAX_RANKS:,} ranks")
    if RUNNER_MEASURE in measures:
        return _runner_measure(arguments, measures)
    runners: tuple[str, ...] = (arguments.runner,)
    if not arguments.runner:
        # V2's releases from 0.18 to 0.33 have V1's sync too; older ones only
        # V1's, and 0.34.0 on only V2's (it removed the V1 runner).
        runners = tuple(
            runner for runner in RUNNERS_BESIDE if _has_runner(arguments.vllm, runner)
        ) or (parse_target(arguments.vllm).runner,)
    # Every runner refused before any is measured: a bad one costs nothing.
    targets = [load_target(arguments.vllm, runner=runner) for runner in runners]
    for target in targets:
        preflight(target)  # a release whose code does not fit: one line, now
    results: list[dict[str, Any]] = []
    if "sim" in measures:
        for ranks in arguments.ranks or (8, 64, 256):
            rounds = arguments.rounds or max(10, 3200 // ranks)
            for target in targets:
                results.append(bench.bench_sim(target, ranks, rounds))
                _emit(results[-1], arguments.json)
    if "check" in measures:
        for ranks in arguments.ranks or (4, 8):
            for target in targets:
                for engine in arguments.engine or ENGINES:
                    results.append(
                        bench.bench_check_fresh(
                            target.spec, ranks, arguments.cases, engine
                        )
                    )
                    _emit(results[-1], arguments.json)
    if "corpus" in measures:
        # The corpus is long: the default engine only, unless others are named.
        for engine in arguments.engine or ENGINES[:1]:
            entries = bench.corpus_entries(arguments.runner, engine)
            results.append(bench.bench_corpus(entries))
            _emit(results[-1], arguments.json)
    if "startup" in measures:
        for target in targets:
            results.append(bench.bench_startup(arguments.vllm, target.runner))
            _emit(results[-1], arguments.json)
    return 0


def _has_runner(vllm: str | None, runner: str) -> bool:
    try:
        parse_target(vllm, runner=runner)
    except UsageError:
        return False
    return True


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
        return
    kind = result["measure"]
    if kind == "sim":
        print(
            f"sim     {result['runner']}  {result['ranks']:>4} ranks  "
            f"{result['rounds_per_s']:9.1f} rounds/s  "
            f"bare {result['bare_rounds_per_s']:9.1f}/s  overhead {result['overhead']:.2f}"
            + (
                f" (CPU time {result['cpu_overhead']:.2f})"
                if result["cpu_overhead"] is not None
                else ""
            ),
            flush=True,
        )
    elif kind == "check":
        print(
            f"check   {result['runner']}  {result['engine']:<10} "
            f"{result['ranks']:>4} ranks  "
            f"{result['end_to_end_cases_per_s']:7.1f} cases/s end to end "
            f"({result['end_to_end_cases_per_cpu_s']:.1f} per CPU second; "
            f"{result['cases']} cases; per case: generation "
            f"{result['generation_us_per_case']:.0f}us, simulation "
            f"{result['simulation_us_per_case']:.0f}us, judging "
            f"{result['judging_us_per_case']:.0f}us; "
            f"{result['cases_judged_per_s']:.1f} simulated and judged/s)",
            flush=True,
        )
    elif kind == "startup":
        print(
            f"startup {result['runner']}  dpsim check to its first case "
            f"{result['to_first_case_s']:.2f}s, of which imports "
            f"{result['imports_s']:.2f}s (median of {result['repeats']})",
            flush=True,
        )
    else:
        _emit_corpus(result)


def _emit_corpus(result: dict[str, Any]) -> None:
    for row in result["rows"]:
        seconds = row["first_counterexample_s"]
        shown = (
            f"{seconds:6.2f}s  (with shrinking {row['with_shrinking_s']:6.2f}s)"
            if seconds is not None
            else "NOT CAUGHT"
        )
        print(
            f"corpus  {row['name']:<36} {shown}  {row['property'] or ''}",
            flush=True,
        )
    median = result["median_first_counterexample_s"]
    print(
        f"corpus  engine {result['engine']}: caught {result['caught']}/"
        f"{result['targets']}, median time to first "
        f"counterexample {median:.2f}s (with shrinking "
        f"{result['median_with_shrinking_s']:.2f}s); all first counterexamples "
        f"{result['first_counterexamples_s']:.1f}s, the whole corpus "
        f"{result['total_s']:.1f}s"
        if median is not None
        else "corpus  none caught",
        flush=True,
    )


def _runner_measure(arguments: argparse.Namespace, measures: list[str]) -> int:
    """``--measure runner`` (:func:`dpsim.lanes.runner.report.measure`)."""
    if measures != [RUNNER_MEASURE]:
        raise UsageError("--measure runner goes alone (it measures another lane)")
    runner = arguments.runner or "v2"  # the runner lane's default
    if arguments.ranks or arguments.rounds:
        raise UsageError(
            "--measure runner: 4 ranks x 8 iterations; no --ranks/--rounds"
        )
    from dpsim.lanes.runner.commands import refuse_unsupported
    from dpsim.lanes.runner.report import measure

    spec = parse_target(arguments.vllm, runner=runner)
    refuse_unsupported(spec)
    result = measure(load_target(arguments.vllm, runner=runner))
    if arguments.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"runner lane{' (V1 runner)' if runner == 'v1' else ''} on "
            f"{result['target']}: {result['cases_per_s']} cases/s at "
            f"{result['ranks']} ranks x {result['iterations']} iterations "
            f"({result['cases']} cases in {result['seconds']}s, the best of "
            f"{result['passes']} passes), "
            f"{result['vllm_share']:.0%} of the time in vLLM's own code"
        )
    return 0
