"""``dpsim bench``: measure the harness (see :mod:`dpsim.bench`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dpsim import bench
from dpsim.cli import add_command
from dpsim.errors import UsageError
from dpsim.limits import MAX_RANKS
from dpsim.targets import load_target

HELP = "measure simulator overhead, check throughput and time to counterexample"
EPILOG = """\
measures:
  sim     simulated rounds/s of the real sync vs. the bare calls (overhead)
  check   cases simulated and judged per second
  corpus  seconds to the first counterexample on each faulty target

examples:
  dpsim bench                         all measures, default sizes
  dpsim bench --vllm 0.29.0 --ranks 8 --json
  dpsim bench --measure sim --ranks 8 --ranks 64 --ranks 256
"""
MEASURES = ("sim", "check", "corpus")


def register(commands: Any) -> None:
    parser = add_command(commands, "bench", HELP, EPILOG)
    parser.add_argument("--vllm", default="0.29.0", metavar="SPEC")
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
        choices=MEASURES,
        help="what to measure (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    measures = arguments.measure or (
        ["sim"] if arguments.ranks and arguments.rounds else list(MEASURES)
    )
    if arguments.ranks and any(ranks < 1 for ranks in arguments.ranks):
        raise UsageError("--ranks must be at least 1")
    if arguments.ranks and max(arguments.ranks) > MAX_RANKS:
        raise UsageError(f"--ranks {max(arguments.ranks)}: at most {MAX_RANKS:,} ranks")
    target = load_target(arguments.vllm)
    results: list[dict[str, Any]] = []
    if "sim" in measures:
        for ranks in arguments.ranks or (8, 64, 256):
            rounds = arguments.rounds or max(10, 3200 // ranks)
            results.append(bench.bench_sim(target, ranks, rounds))
            _emit(results[-1], arguments.json)
    if "check" in measures:
        for ranks in arguments.ranks or (4, 8):
            results.append(bench.bench_check(target, ranks, 400))
            _emit(results[-1], arguments.json)
    if "corpus" in measures:
        results.append(bench.bench_corpus())
        _emit(results[-1], arguments.json)
    return 0


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True), flush=True)
        return
    kind = result["measure"]
    if kind == "sim":
        print(
            f"sim     {result['ranks']:>4} ranks  {result['rounds_per_s']:9.1f} rounds/s  "
            f"bare {result['bare_rounds_per_s']:9.1f}/s  overhead {result['overhead']:.2f}",
            flush=True,
        )
    elif kind == "check":
        print(
            f"check   {result['ranks']:>4} ranks  {result['cases_judged_per_s']:7.1f} cases "
            f"judged/s  ({result['end_to_end_cases_per_s']:.1f}/s with generation, "
            f"{result['cases']} cases)",
            flush=True,
        )
    else:
        for row in result["rows"]:
            seconds = row["first_counterexample_s"]
            shown = f"{seconds:6.2f}s" if seconds is not None else "NOT CAUGHT"
            print(
                f"corpus  {row['name']:<36} {shown}  {row['property'] or ''}",
                flush=True,
            )
        median = result["median_first_counterexample_s"]
        print(
            f"corpus  caught {result['caught']}/{result['targets']}, median time to first "
            f"counterexample {median:.2f}s"
            if median is not None
            else "corpus  none caught",
            flush=True,
        )
