"""One mutation-testing run: mutants of a target's sync (or V1 caller), checked, scored.

Why mutation testing here: a property suite that passes says nothing about
the bugs it would miss. Planting small plausible bugs in the real sync
function, one at a time, and asking whether some property fails measures
that, and each mutant that survives points at a missing property or case.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dpsim.costs.figures import nearest_rank
from dpsim.errors import UsageError
from dpsim.mutate import equivalent
from dpsim.mutate.files import mutated_file
from dpsim.mutate.mutants import Mutant, generate, select_operators
from dpsim.mutate.pool import run_jobs
from dpsim.mutate.run import (
    KILLED,
    REFUSED,
    SURVIVED,
    TIMEOUT,
    Budget,
    Job,
    MutantOutcome,
    Plan,
    baseline,
    check_mutant,
)
from dpsim.mutate.runner import (
    RunnerPlan,
    runner_baseline,
    runner_mutated_file,
    runner_target,
)
from dpsim.records.policy import CapturePolicy
from dpsim.targets import load_target

#: Called as ``progress(done, planned, outcome)`` after each mutant.
Progress = Callable[[int, int, MutantOutcome], None]


@dataclass(frozen=True)
class Result:
    mutant: Mutant
    outcome: MutantOutcome
    #: The reviewed reason, when the mutant is listed as equivalent.
    equivalent: str | None = None


@dataclass(frozen=True)
class MutationReport:
    target: str
    #: The file mutated, and the SHA-256 of its text.
    file: str
    sha256: str
    original: str
    plan: Plan | RunnerPlan
    operators: tuple[str, ...]
    #: Mutants generated before --limit.
    generated: int
    results: tuple[Result, ...]
    workers: int
    seconds: float

    @property
    def equivalent(self) -> tuple[Result, ...]:
        return tuple(r for r in self.results if r.equivalent is not None)

    @property
    def scored(self) -> tuple[Result, ...]:
        """Neither listed as equivalent nor refused by the lane."""
        return tuple(
            r
            for r in self.results
            if r.equivalent is None and r.outcome.status != REFUSED
        )

    @property
    def refused(self) -> tuple[Result, ...]:
        """Mutants the runner lane could not drive: no verdict, not scored."""
        return tuple(
            r
            for r in self.results
            if r.equivalent is None and r.outcome.status == REFUSED
        )

    @property
    def killed(self) -> tuple[Result, ...]:
        return tuple(r for r in self.scored if r.outcome.killed)

    @property
    def survived(self) -> tuple[Result, ...]:
        return tuple(r for r in self.scored if r.outcome.status == SURVIVED)

    @property
    def timeouts(self) -> tuple[Result, ...]:
        return tuple(r for r in self.scored if r.outcome.status == TIMEOUT)

    @property
    def wrongly_equivalent(self) -> tuple[Result, ...]:
        """Listed as equivalent, yet killed: the list entry is wrong."""
        return tuple(r for r in self.equivalent if r.outcome.status == KILLED)

    @property
    def score(self) -> float | None:
        """Killed / non-equivalent; None when nothing was scored."""
        return len(self.killed) / len(self.scored) if self.scored else None

    def kill_seconds(self) -> dict[str, float | None]:
        times = sorted(
            r.outcome.seconds for r in self.killed if r.outcome.seconds is not None
        )
        if not times:
            return {"median": None, "p90": None, "max": None}
        return {
            "median": statistics.median(times),
            "p90": nearest_rank(times, 90),
            "max": times[-1],
        }

    def killed_by(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for result in self.killed:
            killer = result.outcome.killer or result.outcome.status
            counts[killer] = counts.get(killer, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def mutate(
    vllm: str | None,
    target_file: str | None = None,
    *,
    runner: str | None = None,
    caller_file: str | None = None,
    slot: str = "sync",
    operators: tuple[str, ...] | None = None,
    budget: Budget | None = None,
    workers: int = 1,
    limit: int | None = None,
    only: tuple[str, ...] = (),
    equivalent_lists: tuple[Path, ...] = (),
    progress: Progress | None = None,
    lane: str = "sync",
    policy: CapturePolicy | None = None,
) -> MutationReport:
    """Mutate the target's sync file (``slot`` ``sync``: its runner's
    dp_utils.py) or V1's caller method (``caller``: in gpu_model_runner.py,
    or ``caller_file``) and check every mutant.

    ``only`` keeps the mutants with those ids (re-checking survivors after a
    fix). ``workers`` 0 checks in this process (no hard time limit: for tests and
    debugging); N >= 1 uses N worker processes.

    ``lane`` ``runner`` mutates a file the runner lane runs (``slot`` one of
    :data:`~dpsim.mutate.runner.RUNNER_SLOTS`), each mutant judged by the
    runner lane's check (``policy``: its fixed capture policy); see
    :mod:`dpsim.mutate.runner`.
    """
    budget = budget or Budget()
    if workers < 0:
        raise UsageError("--workers must be at least 0")
    if limit is not None and limit < 1:
        raise UsageError("--limit must be at least 1")
    if budget.examples < 1:
        raise UsageError("--examples must be at least 1")
    started = time.perf_counter()
    chosen = select_operators(operators)
    relative = ""
    if lane == "runner":
        target = runner_target(vllm, runner or "v2")
        mutated, relative = runner_mutated_file(target, slot)
    else:
        target = load_target(vllm, target_file, runner=runner, caller_file=caller_file)
        mutated = mutated_file(target, slot)
    original = mutated.text
    mutants = generate(original, chosen, mutated.functions)
    generated = len(mutants)
    if only:
        known = {mutant.id for mutant in mutants}
        unknown = [mutant_id for mutant_id in only if mutant_id not in known]
        if unknown:
            raise UsageError(
                f"no mutant {unknown[0]!r} in {target.label} "
                "(dpsim mutate --list shows them)"
            )
        mutants = tuple(mutant for mutant in mutants if mutant.id in only)
    if limit is not None and limit < generated:
        # A seeded sample spread over the file, not the first N lines.
        picked = sorted(random.Random(budget.seed).sample(range(generated), limit))
        mutants = tuple(mutants[index] for index in picked)
    listed = equivalent.for_file(mutated.sha256, equivalent_lists)
    outcomes: dict[str, MutantOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="dpsim-mutants-") as directory:
        # Each mutant replaces that file on the same base the original ran on.
        plan: Plan | RunnerPlan
        if lane == "runner":
            plan = runner_baseline(
                vllm, target, mutated, relative, budget, policy, Path(directory)
            )
        else:
            plan = baseline(
                target,
                mutated.path,
                vllm,
                budget,
                runner=target.runner,
                slot=slot,
                sync_file=None if target_file is None else str(target_file),
                caller_file=None if caller_file is None else str(caller_file),
            )
        jobs = []
        for index, mutant in enumerate(mutants):
            path = Path(directory) / f"m{index:04d}_{mutated.name}"
            path.write_text(mutant.text)
            jobs.append(Job(mutant.id, str(path), plan))
        for outcome in _outcomes(jobs, workers, budget):
            outcomes[outcome.mutant_id] = outcome
            if progress is not None:
                progress(len(outcomes), len(jobs), outcome)
    results = tuple(
        Result(mutant, outcomes[mutant.id], listed.get(mutant.id)) for mutant in mutants
    )
    return MutationReport(
        target=target.label,
        file=mutated.path,
        sha256=mutated.sha256,
        original=original,
        plan=plan,
        operators=chosen,
        generated=generated,
        results=results,
        workers=workers,
        seconds=time.perf_counter() - started,
    )


def _outcomes(jobs: list[Job], workers: int, budget: Budget) -> Iterator[MutantOutcome]:
    if workers == 0:
        for job in jobs:
            yield check_mutant(job)
    elif jobs:
        yield from run_jobs(jobs, workers, budget.hard_limit)
