"""``dpsim bench``: how fast the harness is, against what is physically possible.

``sim``    simulated rounds of the real sync (one call per rank) against the
           same calls made one after another with each collective answered
           instantly from a recorded run: the target's own cost. ``overhead``
           is simulated time / bare time (>= 1; the goal is <= 1.15 at 8
           ranks and <= 1.1 at 64, by CPU time). For the V1 runner a call
           is the release's caller method, which dispatches, syncs and
           dispatches again: the cost the simulator adds to.
``check``  cases per second end to end at a fixed DP size, and what one case
           costs in each part: generation (drawing it, and Hypothesis' engine
           under ``--engine hypothesis``), simulation (the target's run on the
           virtual ranks) and judging (the properties over the trace); a row
           per engine, each searched in a fresh process (see
           :func:`bench_check_fresh`).
``corpus`` seconds to the first counterexample for each faulty target of the
           corpus, and apart from it the seconds with shrinking.
``startup`` seconds from ``dpsim check`` starting to the end of a one-case
           check (its first case), and of that the imports alone.

Speed targets live here, never in timed tests.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

from dpsim import processes
from dpsim.check import CheckOptions, run_check
from dpsim.records.case import SyncInputs
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.sim import measure_overhead
from dpsim.targets.load import Target, load_spec
from dpsim.targets.spec import TargetSpec

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


def bench_check(
    target: Target, ranks: int, examples: int, engine: str = "hypothesis"
) -> dict[str, Any]:
    """The step scenario's search at ``ranks`` ranks, end to end and by part.

    ``generation`` is everything that is neither simulating nor judging a
    case: drawing it and, under ``engine`` ``hypothesis``, running
    Hypothesis' engine (what a check pays for its search). Also in process
    CPU seconds, which other processes on a busy machine disturb less than
    wall-clock ones.
    """
    options = CheckOptions(
        scenarios=("step",), ranks=(ranks, ranks), examples=examples, engine=engine
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    report = run_check(target, options)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    cases = report.examples
    judged = sum(run.judging_seconds for run in report.runs)
    simulation = sum(run.simulating_seconds for run in report.runs)
    parts = {
        "generation": seconds - judged,
        "simulation": simulation,
        "judging": judged - simulation,
    }
    return {
        "measure": "check",
        "target": target.label,
        "runner": target.runner,
        "engine": engine,
        "ranks": ranks,
        "cases": cases,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        **{f"{part}_s": value for part, value in parts.items()},
        **{f"{part}_us_per_case": value / cases * 1e6 for part, value in parts.items()},
        # Simulated and judged; Hypothesis' own generation time excluded.
        "cases_judged_per_s": cases / judged,
        # Everything, generation and shrinking included.
        "end_to_end_cases_per_s": cases / seconds,
        "end_to_end_cases_per_cpu_s": cases / cpu_seconds,
        "verdict": "pass" if report.passed else "fail",
    }


#: Cases per ``check`` row: about what a default ``dpsim check`` draws in its
#: first four scenario runs (300 each), so a row's warm-up weighs in it as it
#: does in a user's check.
CHECK_CASES = 1_000


def bench_check_fresh(
    spec: TargetSpec, ranks: int, examples: int, engine: str = "hypothesis"
) -> dict[str, Any]:
    """:func:`bench_check` in a spawned child that loads ``spec`` itself.

    A search leaves caches behind (strategies kept by the values they were
    built from, managers by policy, warmed allocators), so a row measured
    after others in one process read up to a third faster than the same row
    alone: the rows depended on their order. In a child of its own, each row
    pays its own warm-up, as a ``dpsim check`` does, and no row borrows from
    another. The target's load is not timed (``startup`` measures that).
    """
    receiver, sender = processes.SPAWN.Pipe(duplex=False)
    child = processes.start(_send_check, sender, spec, ranks, examples, engine)
    sender.close()
    try:
        try:
            row: dict[str, Any] = receiver.recv()
        except EOFError:
            child.join()
            raise RuntimeError(
                f"the check row's process ended with exit status {child.exitcode}"
            ) from None
    finally:
        receiver.close()
        processes.reap([child], patience=5.0)
    return row


def _send_check(
    sender: Connection, spec: TargetSpec, ranks: int, examples: int, engine: str
) -> None:
    sender.send(bench_check(load_spec(spec), ranks, examples, engine))


def corpus_entries(
    runner: str | None = None, engine: str = "hypothesis"
) -> list[tuple[str, Target, CheckOptions]]:
    """Each faulty target of the corpus (of ``runner``'s sync only, when
    given), with the check that should catch it, searched by ``engine``."""
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
            scenarios=(entry.scenario,),
            profile=entry.profile,
            policy=entry.policy,
            engine=engine,
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
    started = time.perf_counter()
    engines: set[str] = set()
    for name, target, options in entries:
        engines.add(options.engine)
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
    shrunk = [float(row["with_shrinking_s"]) for row in rows if row["caught"]]
    return {
        "measure": "corpus",
        "engine": ",".join(sorted(engines)),
        "targets": len(rows),
        "caught": len(times),
        "median_first_counterexample_s": statistics.median(times) if times else None,
        "median_with_shrinking_s": statistics.median(shrunk) if shrunk else None,
        "first_counterexamples_s": sum(times),
        "total_s": time.perf_counter() - started,
        "rows": rows,
    }


def startup_command(spec: str, runner: str) -> list[str]:
    """A fresh ``dpsim check`` of one case of the step scenario on 2 ranks."""
    return [
        sys.executable,
        "-c",
        "from dpsim.cli import run; run()",
        "check",
        "--vllm",
        spec,
        "--runner",
        runner,
        "--scenario",
        "step",
        "--examples",
        "1",
        "--ranks",
        "2..2",
    ]


#: Only the imports ``dpsim check`` makes before it parses its arguments.
IMPORTS_COMMAND = [
    sys.executable,
    "-c",
    "from dpsim.cli import build_parser; build_parser('check')",
]


def bench_startup(spec: str, runner: str, repeats: int = 3) -> dict[str, Any]:
    """Seconds from starting ``dpsim check`` to the end of its first case.

    Each is a new process, so nothing is warm but the OS's file cache; the
    release must be fetched already (the fetch is not startup). The imports'
    share is timed apart in processes that only build the parser; the rest
    is loading the target, building the strategies and the one case.
    Medians of ``repeats`` runs, interleaved.
    """
    checks: list[float] = []
    imports: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dpsim-startup-") as scratch:
        for _ in range(repeats):
            for command, times in (
                (startup_command(spec, runner), checks),
                (IMPORTS_COMMAND, imports),
            ):
                started = time.perf_counter()
                done = subprocess.run(
                    command, cwd=scratch, capture_output=True, text=True, check=False
                )
                times.append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise RuntimeError(
                        f"{' '.join(command[3:]) or 'the imports'} exited "
                        f"{done.returncode}: {done.stderr.strip()[-400:]}"
                    )
    return {
        "measure": "startup",
        "vllm": spec,
        "runner": runner,
        "repeats": repeats,
        "to_first_case_s": statistics.median(checks),
        "imports_s": statistics.median(imports),
    }
