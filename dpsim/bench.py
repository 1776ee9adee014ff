"""``dpsim bench``: how fast the harness is, against what is physically possible.

``sim``    simulated rounds of the real sync (one call per rank) against the
           same calls made one after another with each collective answered
           instantly from a recorded run: the target's own cost. ``overhead``
           is simulated time / bare time (>= 1; the goal is <= 1.3). For the
           V1 runner a call is the release's caller method, which dispatches,
           syncs and dispatches again: the cost the simulator adds to.
``check``  cases simulated and judged per second at a fixed DP size (and,
           separately, end to end with Hypothesis' generation included).
``corpus`` seconds to the first counterexample for each faulty target of the
           corpus (and total seconds including shrinking).

Speed targets live here, never in timed tests.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from dpsim.check import CheckOptions, run_check
from dpsim.records.case import SyncInputs
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.sim import measure_overhead
from dpsim.targets.load import Target

#: A realistic table: vLLM's default-like sizes up to 512, FULL and PIECEWISE.
BENCH_POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)),
    cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
    max_num_seqs=256,
)


def sync_program(target: Target, ranks: int) -> Callable[[int], Any]:
    """Each rank makes one sync with a decode batch of its own size."""
    manager = target.build_manager(BENCH_POLICY.manager_config(ranks))
    # One per rank: V1's caller reads its own rank from it.
    configs = [target.parallel_config(ranks, rank, None) for rank in range(ranks)]
    inputs = [
        SyncInputs(
            num_reqs=1 + rank % 7,
            num_tokens=1 + rank % 7,
            uniform_token_count=1,
            max_query_len=1 if target.api.has("max_query_len") else None,
        )
        for rank in range(ranks)
    ]
    api = target.api

    def program(rank: int) -> int:
        native, _ = api.call(
            manager, inputs[rank], ranks, rank, parallel_config=configs[rank]
        )
        return int(api.describe(native).num_tokens)

    return program


def bench_sim(target: Target, ranks: int, rounds: int) -> dict[str, Any]:
    figures = measure_overhead(sync_program(target, ranks), ranks, rounds)
    return {
        "measure": "sim",
        "target": target.label,
        "runner": target.runner,
        **figures,
    }


def bench_check(target: Target, ranks: int, examples: int) -> dict[str, Any]:
    started = time.perf_counter()
    report = run_check(
        target,
        CheckOptions(scenarios=("step",), ranks=(ranks, ranks), examples=examples),
    )
    seconds = time.perf_counter() - started
    judging = sum(run.judging_seconds for run in report.runs)
    return {
        "measure": "check",
        "target": target.label,
        "runner": target.runner,
        "ranks": ranks,
        "cases": report.examples,
        "seconds": seconds,
        # Simulated and judged; Hypothesis' own generation time excluded.
        "cases_judged_per_s": report.examples / judging,
        # Everything, generation and shrinking included.
        "end_to_end_cases_per_s": report.examples / seconds,
        "verdict": "pass" if report.passed else "fail",
    }


def corpus_entries(
    runner: str | None = None,
) -> list[tuple[str, Target, CheckOptions]]:
    """Each faulty target of the corpus (of ``runner``'s sync only, when
    given), with the check that should catch it."""
    import tempfile
    from pathlib import Path

    from dpsim import corpus
    from dpsim.targets import load_target

    directory = Path(tempfile.mkdtemp(prefix="dpsim-corpus-"))
    entries = []
    for entry in corpus.CORPUS:
        if runner is not None and entry.runner != runner:
            continue
        path = corpus.materialize(entry, directory)
        options = CheckOptions(
            scenarios=(entry.scenario,), profile=entry.profile, policy=entry.policy
        )
        target = load_target(entry.vllm, path, runner=entry.runner)
        entries.append((entry.name, target, options))
    return entries


def bench_corpus(
    entries: Iterable[tuple[str, Target, CheckOptions]] | None = None,
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    if entries is None:
        entries = corpus_entries()
    for name, target, options in entries:
        report = run_check(target, options)
        failed = report.first_failure
        rows.append(
            {
                "name": name,
                "caught": failed is not None,
                "property": failed.finding.primary.property
                if failed is not None and failed.finding is not None
                else None,
                "first_counterexample_s": failed.first_failure_seconds
                if failed
                else None,
                "with_shrinking_s": failed.seconds if failed else None,
            }
        )
    times = [float(row["first_counterexample_s"]) for row in rows if row["caught"]]
    return {
        "measure": "corpus",
        "targets": len(rows),
        "caught": len(times),
        "median_first_counterexample_s": statistics.median(times) if times else None,
        "rows": rows,
    }
