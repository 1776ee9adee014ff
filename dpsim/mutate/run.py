"""Checking one mutant: ``dpsim check``'s own search, leg by leg, until a
property fails.

A *leg* is one scenario under one generator profile. Every mutant runs the
same legs with the same seed, so until the mutant's behaviour departs from the
original's, it sees exactly the cases the original passed: a failure is the
mutation's doing, not a new draw. Legs run cheapest and likeliest first
(``step`` before the rest), and the first failure ends the mutant.

The original runs every leg first (:func:`baseline`). Where it already breaks
a property (0.33.0 has real bugs), the leg judges the mutant *against the
original*: a failing case kills only if its verdicts differ from the
original's on that same case. The original's own bug then neither kills every
mutant nor hides the property from the many cases where the original holds
it, which is where most mutants of the buggy branch show.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dpsim.check import DEFAULT_EXAMPLES as CHECK_EXAMPLES
from dpsim.check import CheckOptions, run_check
from dpsim.properties import PROPERTIES, PROPERTY_NAMES
from dpsim.records.case import PROFILES
from dpsim.scenarios.generate import DEFAULT_RANKS, scenarios_for
from dpsim.targets import load_target
from dpsim.targets.load import Target

if TYPE_CHECKING:
    from dpsim.mutate.runner import RunnerPlan

#: A mutant gets the budget ``dpsim check`` gives a target: the score says
#: what a default check would catch.
DEFAULT_EXAMPLES = CHECK_EXAMPLES
DEFAULT_SECONDS = 60.0

KILLED, SURVIVED, TIMEOUT = "killed", "survived", "timeout"
#: The runner lane could not drive the mutant (a stand-in was asked what it
#: does not know): no verdict, so neither killed nor scored.
REFUSED = "refused"
#: Killers that are not properties: the loader refused the mutant, dpsim itself
#: raised on it, or the worker process died.
LOAD, HARNESS, WORKER = "load", "harness", "worker"


@dataclass(frozen=True)
class Budget:
    """How hard each mutant is tried."""

    #: Cases per leg (scenario x profile), as ``dpsim check --examples``.
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    # One-rank DP included: the sync's dp_size == 1 path is code to mutate too.
    ranks: tuple[int, int] = (1, DEFAULT_RANKS[1])
    profiles: tuple[str, ...] = PROFILES
    #: Wall-clock cap per mutant: no leg starts past it (the mutant survives),
    #: and a worker still busy at twice it is terminated (a timeout).
    seconds: float = DEFAULT_SECONDS

    @property
    def hard_limit(self) -> float:
        return 2 * self.seconds + 30


@dataclass(frozen=True)
class Leg:
    scenario: str
    profile: str
    #: The original breaks some property here: judge mutants against it.
    relative: bool = False


@dataclass(frozen=True)
class Inherited:
    """A property the original already breaks in one leg."""

    scenario: str
    profile: str
    property: str
    message: str


@dataclass(frozen=True)
class Plan:
    """What every mutant runs: the base to load it on, and the legs."""

    vllm: str | None
    #: The original file mutated, the baseline of relative legs.
    original: str
    legs: tuple[Leg, ...]
    budget: Budget
    inherited: tuple[Inherited, ...] = ()
    #: Seconds the original took over every leg: what a survivor costs.
    baseline_seconds: float = 0.0
    #: The runner (None: the release's default).
    runner: str | None = None
    #: Which file a mutant replaces: ``sync`` (dp_utils.py, as ``--target``)
    #: or ``caller`` (V1's gpu_model_runner.py, as ``--caller-file``).
    slot: str = "sync"
    #: The ``--target`` and ``--caller-file`` the original ran with: a
    #: mutant replaces the one its slot names and keeps the other.
    sync_file: str | None = None
    caller_file: str | None = None
    #: Which lane judges the mutants (a runner-lane plan is
    #: :class:`dpsim.mutate.runner.RunnerPlan`).
    lane: str = "sync"

    def load(self, path: str) -> Target:
        """The target with ``path`` in this plan's slot."""
        if self.slot == "caller":
            return load_target(
                self.vllm, self.sync_file, runner=self.runner, caller_file=path
            )
        return load_target(
            self.vllm, path, runner=self.runner, caller_file=self.caller_file
        )


@dataclass(frozen=True)
class Job:
    mutant_id: str
    path: str
    plan: Plan | RunnerPlan


@dataclass(frozen=True)
class MutantOutcome:
    """What checking one mutant came to: killed (by what, where) or survived."""

    mutant_id: str
    status: str
    #: The property that failed first, or LOAD / HARNESS / WORKER.
    killer: str | None = None
    scenario: str | None = None
    profile: str | None = None
    message: str | None = None
    #: Seconds from loading the mutant to its first failing case.
    seconds: float | None = None
    #: Seconds spent on it in all (a killed one also shrank its case).
    elapsed: float = 0.0

    @property
    def killed(self) -> bool:
        return self.status in (KILLED, TIMEOUT)

    @classmethod
    def harness_tripped(
        cls, mutant_id: str, leg: Leg, error: Exception, elapsed: float
    ) -> MutantOutcome:
        """dpsim itself tripped over what the mutant did: any check run on
        this file fails, so the mutant does not go unnoticed."""
        return cls(
            mutant_id,
            KILLED,
            HARNESS,
            leg.scenario,
            leg.profile,
            f"{type(error).__name__}: {error}",
            elapsed,
            elapsed,
        )


def _options(leg: Leg, budget: Budget, original: Target | None = None) -> CheckOptions:
    return CheckOptions(
        scenarios=(leg.scenario,),
        profile=leg.profile,
        ranks=budget.ranks,
        examples=budget.examples,
        seed=budget.seed,
        shrink=False,  # a kill needs one failing case, not a small one
        baseline=original,
    )


def _order(scenarios: tuple[str, ...]) -> tuple[str, ...]:
    # step is the cheapest case and kills most mutants; the rest as listed.
    return tuple(sorted(scenarios, key=lambda name: name != "step"))


def baseline(
    target: Target,
    original: str,
    vllm: str | None,
    budget: Budget,
    *,
    runner: str | None = None,
    slot: str = "sync",
    sync_file: str | None = None,
    caller_file: str | None = None,
) -> Plan:
    """Every leg, marked relative where the original already breaks a property.

    A leg is rerun without each property it breaks until it passes, so that
    every property the original breaks there is reported, not just the first.
    ``runner``, ``slot``, ``sync_file`` and ``caller_file`` say how a mutant
    loads (see :class:`Plan`).
    """
    started = time.perf_counter()
    legs = []
    inherited: list[Inherited] = []
    # The properties run on this runner's traces (V1 has no DPSyncState to
    # judge), which a check refuses to be asked for by name otherwise.
    judged = tuple(
        name for name in PROPERTY_NAMES if PROPERTIES[name].applies_to(target.runner)
    )
    for scenario in _order(scenarios_for(target)):
        for profile in budget.profiles:
            properties = judged
            while properties:
                options = replace(
                    _options(Leg(scenario, profile), budget), properties=properties
                )
                run = run_check(target, options).runs[0]
                if run.finding is None:
                    break
                broken = {verdict.property for verdict in run.finding.verdicts}
                inherited.extend(
                    Inherited(scenario, profile, verdict.property, str(verdict))
                    for verdict in run.finding.verdicts
                )
                properties = tuple(name for name in properties if name not in broken)
            legs.append(Leg(scenario, profile, relative=properties != judged))
    return Plan(
        vllm=vllm,
        original=original,
        legs=tuple(legs),
        budget=budget,
        inherited=tuple(inherited),
        baseline_seconds=time.perf_counter() - started,
        runner=runner,
        slot=slot,
        sync_file=sync_file,
        caller_file=caller_file,
    )


@functools.lru_cache(maxsize=4)
def _load_original(plan: Plan) -> Target:
    # Once per worker process: every relative leg of every mutant uses it.
    return plan.load(plan.original)


def check_mutant(job: Job) -> MutantOutcome:
    """Run ``job``'s mutant through every leg until one fails.

    The wall-clock cap is checked between legs, never inside one: a leg cut
    short while it shrinks a failure would lose a kill. A leg is bounded by
    its examples (and each case by the simulator's step budget); a worker
    that still overruns is the pool's to stop.
    """
    if job.plan.lane == "runner":
        from dpsim.mutate.runner import check_runner_mutant

        return check_runner_mutant(job)
    plan = job.plan
    assert isinstance(plan, Plan)
    started = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - started

    try:
        target = plan.load(job.path)
    except Exception as error:
        message = f"{type(error).__name__}: {error}"
        return MutantOutcome(
            job.mutant_id, KILLED, LOAD, message=message, seconds=elapsed()
        )
    for leg in plan.legs:
        leg_started = elapsed()
        if leg_started > plan.budget.seconds:
            cap = f"wall-clock cap of {plan.budget.seconds:g}s reached"
            return MutantOutcome(
                job.mutant_id, SURVIVED, message=cap, elapsed=leg_started
            )
        try:
            original = _load_original(plan) if leg.relative else None
            run = run_check(target, _options(leg, plan.budget, original)).runs[0]
        except Exception as error:
            return MutantOutcome.harness_tripped(job.mutant_id, leg, error, elapsed())
        if run.finding is not None:
            primary = run.finding.primary
            return MutantOutcome(
                job.mutant_id,
                KILLED,
                primary.property,
                leg.scenario,
                leg.profile,
                str(primary),
                leg_started + (run.first_failure_seconds or run.seconds),
                elapsed(),
            )
    return MutantOutcome(job.mutant_id, SURVIVED, elapsed=elapsed())
