"""What the runner lane runs of a release for real, and how fast.

:func:`lane_coverage` runs a fixed set of small cases (a busy rank beside an
idle one, without a speculator and with each one the release ships the lane
drives, sync and async scheduling) under
:class:`~dpsim.lanes.runner.where.LineCoverage` scoped to every class the lane
rebuilds from the release's files (engine, model runner, speculators): per
function, the lines that can run and those that ran. What is stood in for is
said where each part builds it (the docstrings of
:mod:`~dpsim.lanes.runner.engine`, :mod:`~dpsim.lanes.runner.model_runner`,
:mod:`~dpsim.lanes.runner.worker`, :mod:`~dpsim.lanes.runner.speculators`,
:mod:`~dpsim.lanes.runner.forward`; the scheduler is modelled:
:mod:`~dpsim.lanes.runner.scheduler`), and any stand-in asked something it
does not know refuses the case, named in the report.

:func:`measure` times runner cases at 4 ranks x 8 iterations (cases drawn as
the check draws them, with every request arriving within 8 engine-loop
iterations) and, from one profiled pass, the share of the time spent in
vLLM's own code (functions compiled from the release's files).
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Iterable
from dataclasses import dataclass
from random import Random
from types import CodeType
from typing import Any

from hypothesis import HealthCheck, Phase, find, settings

from dpsim.errors import TargetError
from dpsim.records.policy import CapturePolicy
from dpsim.scenarios.generate import seeded_draws_only
from dpsim.targets.load import Target

from .case import RunnerCase
from .check import runner_cases
from .extract import Origin
from .run import run_runner_case, sources_for
from .stream import EngineOptions, RankStream, RequestScript, speculators_of
from .where import FunctionCoverage, LineCoverage, is_vllm_file

#: The parts whose real classes the coverage covers, with where their
#: stand-ins are documented.
STOOD_IN = (
    "engine: executor, input/output queues, coordinator (dpsim.lanes.runner.engine)",
    "scheduler: modelled, not vLLM's (dpsim.lanes.runner.scheduler)",
    "model runner, worker: GPU/triton work, collaborators "
    "(dpsim.lanes.runner.model_runner, .worker)",
    "forwards: fake models and captured graphs issuing the EP collectives "
    "(dpsim.lanes.runner.forward)",
    "speculators: triton launchers, draft model (dpsim.lanes.runner.speculators)",
)
#: The same on the V1 model runner (its own worker, runner and drafter modules).
V1_STOOD_IN = (
    *STOOD_IN[:2],
    "model runner, worker: GPU buffers, input preparation, sampler, "
    "collaborators (dpsim.lanes.runner.v1.model_runner, .v1.worker)",
    STOOD_IN[3],
    "drafter: draft model, attention metadata, triton kernels "
    "(dpsim.lanes.runner.v1.proposer)",
)


def stood_in(runner: str) -> tuple[str, ...]:
    """What the lane stands in for on ``runner``'s model runner, and where."""
    return V1_STOOD_IN if runner == "v1" else STOOD_IN


@dataclass(frozen=True)
class Coverage:
    """A release's lane coverage: per function, and the cases it refused."""

    functions: tuple[FunctionCoverage, ...]
    ran: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]


def coverage_cases(runner: str = "v2") -> tuple[tuple[str, RunnerCase], ...]:
    """Small cases of ``runner``'s model runner reaching the lane's paths:
    named, busy rank 0, idle rank 1, each of the runner's speculators."""
    named = []
    for name, speculator, k, asynchronous in (
        ("plain", None, 0, False),
        ("async scheduling", None, 0, True),
        *((f"{kind} k=2", kind, 2, False) for kind in speculators_of(runner)),
    ):
        options = EngineOptions(
            async_scheduling=asynchronous,
            speculator=speculator,
            num_speculative_tokens=k,
            dp_sync_interval=4,
        )
        policy = CapturePolicy(
            capture_sizes=(1, 2, 4, 8, 16),
            max_num_seqs=options.max_num_seqs,
            decode_query_len=options.decode_query_len,
        )
        busy = RankStream(
            (RequestScript("a", 0, 20, 3), RequestScript("b", 1, 4, 2, kv_wait=1))
        )
        named.append(
            (name, RunnerCase(policy, options, (busy, RankStream()), runner=runner))
        )
    return tuple(named)


def _codes(target: Target) -> list[CodeType]:
    """Every function of every class the lane rebuilds for ``target``."""
    codes: list[CodeType] = []
    for origin in lane_origins(target):
        codes.extend(origin.codes())
    return codes


def lane_origins(target: Target) -> list[Origin]:
    """Where every class the lane rebuilds for ``target`` came from (file,
    class, the methods kept): what it runs of the release for real, which
    ``dpsim mutate --lane runner`` mutates."""
    from .engine import engine_classes

    sources = sources_for(target)
    origins = list(engine_classes(sources).origins)
    classes = (
        _v1_classes(sources, target)
        if target.runner == "v1"
        else _v2_classes(sources, target)
    )
    seen: set[int] = set()
    for klass in classes:
        for base in klass.__mro__:
            origin = base.__dict__.get("DPSIM_ORIGIN")
            if origin is not None and id(origin) not in seen:
                seen.add(id(origin))
                origins.append(origin)
    return origins


def _v2_classes(sources: Any, target: Target) -> list[type]:
    """The V2 model runner and its speculators' classes."""
    from .model_runner import runner_kit
    from .speculators import speculator_classes

    classes: list[type] = [runner_kit(sources, target).runner_class]
    try:
        speculators = speculator_classes(sources, target)
        classes.extend(
            dict.fromkeys((speculators.draft_model, *speculators.kinds.values()))
        )
    except TargetError:
        pass  # a release without them: its cases say so
    return classes


def _v1_classes(sources: Any, target: Target) -> list[type]:
    """The V1 worker's, model runner's and drafter's classes (:mod:`.v1`)."""
    from .v1 import real_classes

    return list(real_classes(sources, target))


def lane_coverage(target: Target) -> Coverage:
    """Run :func:`coverage_cases` on ``target`` under line coverage."""
    ran: list[str] = []
    refused: list[tuple[str, str]] = []
    cases = coverage_cases(target.runner)
    # Build the classes first (a case refused before they exist is fine).
    for name, case in cases[:1]:
        try:
            run_runner_case(target, case)
        except TargetError as error:
            return Coverage((), (), ((name, str(error)),))
    with LineCoverage(_codes(target)) as coverage:
        for name, case in cases:
            try:
                run_runner_case(target, case)
                ran.append(name)
            except TargetError as error:
                refused.append((name, str(error)))
    return Coverage(tuple(coverage.functions()), tuple(ran), tuple(refused))


def render_coverage(target: Target, found: Coverage) -> str:
    model = " (V1 model runner)" if target.runner == "v1" else ""
    lines = [f"{target.label}: runner lane{model}"]
    lines.append("  cases run: " + (", ".join(found.ran) or "none"))
    for name, why in found.refused:
        lines.append(f"  refused {name}: {why}")
    lines.append("  real (executed/executable lines):")
    for function in found.functions:
        if not function.executable:
            continue
        share = len(function.executed) / len(function.executable)
        lines.append(
            f"    {len(function.executed):>4}/{len(function.executable):<4} "
            f"{share:4.0%}  {function.shown}"
        )
    lines.append("  stood in (strict):")
    lines.extend(f"    {part}" for part in stood_in(target.runner))
    return "\n".join(lines)


def coverage_json(target: Target, found: Coverage) -> dict[str, Any]:
    return {
        "target": target.label,
        "lane": "runner",
        "runner": target.runner,
        "ran": list(found.ran),
        "refused": {name: why for name, why in found.refused},
        "functions": [
            {
                "function": function.shown,
                "executable": len(function.executable),
                "executed": len(function.executed),
            }
            for function in found.functions
        ],
        "stood_in": list(stood_in(target.runner)),
    }


# -- speed --------------------------------------------------------------------


def bench_cases(count: int, seed: int = 0, runner: str = "v2") -> list[RunnerCase]:
    """``count`` runner cases of 4 ranks of ``runner``'s model runner, drawn
    as the check draws them."""
    drawn: list[RunnerCase] = []

    def keep(case: RunnerCase) -> bool:
        drawn.append(case)
        return len(drawn) >= count

    with seeded_draws_only():
        find(
            runner_cases(ranks=(4, 4), runner=runner),
            keep,
            settings=settings(
                max_examples=count,
                database=None,
                deadline=None,
                phases=(Phase.generate,),
                suppress_health_check=list(HealthCheck),
            ),
            random=Random(seed),
        )
    return drawn[:count]


def measure(target: Target, count: int = 20, passes: int = 3) -> dict[str, Any]:
    """Runner cases per second at 4 ranks x 8 iterations, and the share of
    time in vLLM's own code (one profiled pass over the same cases).

    The rate is the best of ``passes`` timed passes over the same cases (as
    ``timeit`` reports): a pass is under a second, and on a shared machine
    one pass can run at half speed while other processes take the cores.
    """
    cases = bench_cases(count, runner=target.runner)
    usable = []
    for case in cases:  # warm up (class builds) and drop refused cases
        try:
            run_runner_case(target, case)
            usable.append(case)
        except TargetError:
            pass
    timed = []
    for _ in range(passes):
        started = time.perf_counter()
        for case in usable:
            run_runner_case(target, case)
        timed.append(time.perf_counter() - started)
    seconds = min(timed)
    profile = cProfile.Profile()
    profile.enable()
    for case in usable:
        run_runner_case(target, case)
    profile.disable()
    return {
        "measure": "runner",
        "target": target.label,
        "runner": target.runner,
        "ranks": 4,
        "iterations": 8,
        "cases": len(usable),
        "refused": len(cases) - len(usable),
        "seconds": round(seconds, 3),
        "passes": passes,
        "cases_per_s": round(len(usable) / seconds, 2) if seconds else None,
        "vllm_share": round(_vllm_share(pstats.Stats(profile).stats.items()), 3),  # type: ignore[attr-defined]
    }


def _vllm_share(stats: Iterable[tuple[tuple[str, int, str], Any]]) -> float:
    """Own time in functions compiled from vLLM's files, over all own time."""
    total = vllm = 0.0
    for (filename, _, _), (_, _, own, _, _) in stats:
        total += own
        if is_vllm_file(filename):
            vllm += own
    return vllm / total if total else 0.0
