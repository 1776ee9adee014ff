"""``dpsim check``'s engine: generate cases, run them, judge them, shrink failures.

For each scenario, Hypothesis draws cases (:mod:`dpsim.scenarios.generate`),
each case runs on the simulator and the chosen properties judge its trace.
The first failure fixes *which* property is being chased; shrinking then keeps
only cases that fail that same property, so a coverage bug does not shrink
into an unrelated crash. Generation is seeded, and no example database is read
unless one is given, so the same target, options and seed give the same
counterexample byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

from hypothesis import HealthCheck, Phase, find, reject, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import NoSuchExample, Unsatisfiable

from dpsim.capture.policy import CapturePolicy
from dpsim.errors import UsageError
from dpsim.properties import Property, Verdict, judge, select
from dpsim.scenarios import Case, PolicyRefused, run_case
from dpsim.scenarios.generate import (
    DEFAULT_RANKS,
    cases,
    scenarios_for,
    seeded_draws_only,
)
from dpsim.sim import SimResult
from dpsim.sim.workers import reset_pool
from dpsim.targets.load import Target

DEFAULT_EXAMPLES = 300

#: Called as ``progress(scenario, examples_run, examples_planned)``.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CheckOptions:
    scenarios: tuple[str, ...] = ()
    properties: tuple[str, ...] = ()
    profile: str = "caller"
    ranks: tuple[int, int] = DEFAULT_RANKS
    policy: CapturePolicy | None = None
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    #: Shrink a failing case to a small one. Mutation testing only needs to
    #: know that a mutant fails, and skips it.
    shrink: bool = True
    database: ExampleDatabase | None = field(default=None, compare=False)
    #: Judge relative to this target: a verdict it gives too, word for word, on
    #: the same case is the baseline's own failure and fails nothing here.
    #: Mutation testing judges a mutant against its original this way, so a
    #: bug the original already has neither kills every mutant nor hides the
    #: property from the cases where the original holds it.
    baseline: Target | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Finding:
    """A shrunk counterexample and what it showed."""

    case: Case
    result: SimResult
    verdicts: tuple[Verdict, ...]

    @property
    def primary(self) -> Verdict:
        return self.verdicts[0]


@dataclass(frozen=True)
class ScenarioRun:
    scenario: str
    examples: int
    seconds: float
    finding: Finding | None
    #: Seconds until the first failing case was seen (before shrinking).
    first_failure_seconds: float | None = None
    #: Seconds spent simulating and judging cases (the rest is generation).
    judging_seconds: float = 0.0


@dataclass(frozen=True)
class CheckReport:
    target: Target
    options: CheckOptions
    runs: tuple[ScenarioRun, ...]

    @property
    def passed(self) -> bool:
        return all(run.finding is None for run in self.runs)

    @property
    def first_failure(self) -> ScenarioRun | None:
        return next((run for run in self.runs if run.finding is not None), None)

    @property
    def examples(self) -> int:
        return sum(run.examples for run in self.runs)

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)


def evaluate(
    target: Target,
    case: Case,
    properties: tuple[Property, ...],
    baseline: Target | None = None,
) -> tuple[SimResult, list[Verdict]]:
    """Run one case and judge it, less the verdicts ``baseline`` shares on it.

    Raises PolicyRefused when vLLM refuses the policy.
    """
    result = run_case(target, case)
    verdicts = judge(case, result, properties)
    if verdicts and baseline is not None:
        shared = judge(case, run_case(baseline, case), properties)
        verdicts = [verdict for verdict in verdicts if verdict not in shared]
    return result, verdicts


def run_check(
    target: Target,
    options: CheckOptions,
    progress: Progress | None = None,
) -> CheckReport:
    properties = select(options.properties)
    available = scenarios_for(target)
    chosen = options.scenarios or available
    for name in chosen:
        if name not in available:
            raise UsageError(
                f"{target.label} has no {name!r} scenario; it runs: {', '.join(available)}"
            )
    reset_pool()  # see its docstring: pooled workers stay within one search
    runs = tuple(
        _check_scenario(target, name, properties, options, progress) for name in chosen
    )
    return CheckReport(target, options, runs)


def _check_scenario(
    target: Target,
    scenario: str,
    properties: tuple[Property, ...],
    options: CheckOptions,
    progress: Progress | None,
) -> ScenarioRun:
    strategy = cases(
        target,
        scenario=scenario,
        profile=options.profile,
        ranks=options.ranks,
        policy=options.policy,
    )
    chased: list[str] = []
    examples = 0
    started = time.perf_counter()
    first_failure: list[float] = []
    judging = 0.0

    def fails(case: Case) -> bool:
        nonlocal examples, judging
        examples += 1
        if progress is not None:
            progress(scenario, examples, options.examples)
        judged = time.perf_counter()
        try:
            _, verdicts = evaluate(target, case, properties, options.baseline)
        except PolicyRefused:
            reject()
        finally:
            judging += time.perf_counter() - judged
        if not verdicts:
            return False
        if not chased:
            chased.append(verdicts[0].property)
            first_failure.append(time.perf_counter() - started)
        return any(verdict.property == chased[0] for verdict in verdicts)

    config = settings(
        max_examples=options.examples,
        database=options.database,
        deadline=None,
        # reuse: a database given is replayed first (a no-op without one).
        phases=(Phase.reuse, Phase.generate)
        + ((Phase.shrink,) if options.shrink else ()),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    try:
        with seeded_draws_only():
            minimal = find(
                strategy,
                fails,
                settings=config,
                # Hypothesis turns the database off for a seeded search; with one,
                # its stored examples come first and generation is not pinned.
                random=Random(options.seed) if options.database is None else None,
                database_key=_database_key(target, scenario, options)
                if options.database is not None
                else None,
            )
    except (NoSuchExample, Unsatisfiable):
        return ScenarioRun(
            scenario, examples, time.perf_counter() - started, None, None, judging
        )
    result, verdicts = evaluate(target, minimal, properties, options.baseline)
    # The chased property first, the others it also broke after it.
    ordered = sorted(verdicts, key=lambda verdict: verdict.property != chased[0])
    finding = Finding(minimal, result, tuple(ordered))
    return ScenarioRun(
        scenario,
        examples,
        time.perf_counter() - started,
        finding,
        first_failure[0],
        judging,
    )


def _database_key(target: Target, scenario: str, options: CheckOptions) -> bytes:
    hashes = ",".join(loaded.sha256 for loaded in target.files)
    return f"dpsim:{hashes}:{scenario}:{options.profile}".encode()
