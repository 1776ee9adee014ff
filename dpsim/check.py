"""``dpsim check``'s engine: generate cases, run them, judge them, shrink failures.

For each scenario, Hypothesis draws cases (:mod:`dpsim.scenarios.generate`;
with ``--engine fast``, :mod:`dpsim.search.fast` draws them from the same
strategies without Hypothesis' engine, and hands the first failing one to that
engine to shrink), each case runs on the simulator and the chosen properties
judge its trace.
The first failure fixes *which* property is being chased; shrinking then keeps
only cases that fail that same property, so a coverage bug does not shrink
into an unrelated crash. Generation is seeded, and no example database is read
unless one is given, so the same target, options and seed give the same
counterexample byte for byte.

Ctrl-C: :func:`run_check` stops the search and raises :class:`CheckInterrupted`
carrying what it had: the scenarios already finished, the one in progress
(with its cases so far, and the smallest failing case it had when a failure
was being shrunk), and the ones not reached. A Ctrl-C is never lost: a
``KeyboardInterrupt`` can land where Python swallows it (a gc callback such as
Hypothesis' own, a ``__del__``, a greenlet torn down by the collector) and
only print "Exception ignored in ...", so the handler installed for the
search also counts the signal, and the next case refuses to start. The same
handler restores the default one, so a second Ctrl-C stops the process at
once.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from random import Random
from types import FrameType
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, Phase, find, reject, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import NoSuchExample, Unsatisfiable

from dpsim.boundary import searching, stops_the_search
from dpsim.collector import frozen_heap
from dpsim.errors import UsageError
from dpsim.properties import Property, Verdict, judge, select
from dpsim.records.case import Case
from dpsim.records.policy import CapturePolicy
from dpsim.records.trace import SimResult
from dpsim.scenarios import PolicyRefused, run_case
from dpsim.scenarios.generate import (
    DEFAULT_RANKS,
    cases,
    scenarios_for,
    seeded_draws_only,
)
from dpsim.scenarios.run import preflight
from dpsim.search.bounded import bounded_shrinking
from dpsim.search.options import ENGINES
from dpsim.sim.workers import reset_pool
from dpsim.targets.load import Target

if TYPE_CHECKING:
    from dpsim.coverage import Measurement

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
    #: Target coverage (``--coverage``): each case's run of the target is
    #: traced inside ``coverage.running(scenario, profile)``; generating and
    #: judging it are not.
    coverage: Measurement | None = field(default=None, compare=False)
    #: How cases are drawn (``--engine``, :data:`dpsim.search.options.ENGINES`):
    #: ``hypothesis`` is Hypothesis' own engine (``find()``); ``fast`` is
    #: :mod:`dpsim.search.fast`, which draws from the same strategies without
    #: that engine and hands the first failing case to it to shrink.
    engine: str = "hypothesis"


@dataclass(frozen=True)
class Finding:
    """A shrunk counterexample and what it showed."""

    case: Case
    result: SimResult
    verdicts: tuple[Verdict, ...]
    #: False when Ctrl-C stopped the shrinking: a failing case, not a minimal one.
    shrunk: bool = True

    @property
    def primary(self) -> Verdict:
        return self.verdicts[0]


@dataclass(frozen=True)
class ScenarioRun:
    scenario: str
    #: Every case run: generated ones and, after a failure, those tried while
    #: shrinking it (``shrinking`` of them).
    examples: int
    seconds: float
    finding: Finding | None
    #: Seconds until the first failing case was seen (before shrinking).
    first_failure_seconds: float | None = None
    #: Seconds spent simulating and judging cases (the rest is generation).
    judging_seconds: float = 0.0
    #: Cases run while shrinking a failure, after the first failing case.
    shrinking: int = 0
    #: Ctrl-C stopped this scenario's search before it ended.
    interrupted: bool = False
    #: Of ``judging_seconds``, those spent simulating (the rest is judging).
    simulating_seconds: float = 0.0
    #: Why the fast engine stopped drawing before ``--examples`` cases (too
    #: many draws rejected or repeating earlier cases); None when it did not.
    stopped_early: str | None = None

    @property
    def generated(self) -> int:
        """Cases the search drew up to its first failure (at most --examples)."""
        return self.examples - self.shrinking


@dataclass(frozen=True)
class CheckReport:
    target: Target
    options: CheckOptions
    runs: tuple[ScenarioRun, ...]
    #: Scenarios chosen but never started, because Ctrl-C came first.
    not_run: tuple[str, ...] = ()

    @property
    def interrupted(self) -> bool:
        return bool(self.not_run) or any(run.interrupted for run in self.runs)

    @property
    def passed(self) -> bool:
        """Every chosen scenario ran to its end, and no property failed."""
        return not self.interrupted and not self.failures

    @property
    def failures(self) -> tuple[ScenarioRun, ...]:
        """Every scenario that found a counterexample, in the order run."""
        return tuple(run for run in self.runs if run.finding is not None)

    @property
    def first_failure(self) -> ScenarioRun | None:
        return next(iter(self.failures), None)

    @property
    def examples(self) -> int:
        return sum(run.examples for run in self.runs)

    @property
    def shrinking(self) -> int:
        return sum(run.shrinking for run in self.runs)

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)


class CheckInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_check`, carrying the report of what was done.

    A ``KeyboardInterrupt``, so a caller that does not look for it still stops.
    """

    def __init__(self, report: CheckReport) -> None:
        super().__init__("interrupted")
        self.report = report


class _Interrupted(Exception):
    """A scenario's search stopped by Ctrl-C, with the run it had so far."""

    def __init__(self, run: ScenarioRun) -> None:
        super().__init__(run.scenario)
        self.run = run


class _Interrupts:
    """The SIGINT handler of a search: raise, count, and give the next one back.

    Counting is what makes a swallowed ``KeyboardInterrupt`` still stop the
    run: :meth:`check` raises it again before the next case.
    """

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        # A second Ctrl-C ends the process at once, whatever it is doing.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.count:
            raise KeyboardInterrupt


@contextmanager
def _catching_interrupts() -> Iterator[_Interrupts]:
    """Install :class:`_Interrupts` for the block, where Python's own handler is.

    Elsewhere (a thread; a process that ignores SIGINT, as fuzz workers do;
    a caller's own handler) the signal is left as it was.
    """
    interrupts = _Interrupts()
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield interrupts
        return
    signal.signal(signal.SIGINT, interrupts)
    try:
        yield interrupts
    finally:
        # Back to Python's handler (also after a Ctrl-C: the caller reports
        # what was done, and a Ctrl-C there still stops it).
        signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class Stopwatch:
    """Seconds a search spent simulating its cases (``dpsim bench`` splits them)."""

    simulating: float = 0.0


def evaluate(
    target: Target,
    case: Case,
    properties: tuple[Property, ...],
    baseline: Target | None = None,
    traced: AbstractContextManager[None] | None = None,
    stopwatch: Stopwatch | None = None,
) -> tuple[SimResult, list[Verdict]]:
    """Run one case and judge it, less the verdicts ``baseline`` shares on it.

    ``traced`` (target coverage) is entered around the target's run only:
    judging and the baseline's run are dpsim's own code, and tracing them
    would only cost.

    Raises PolicyRefused when vLLM refuses the policy.
    """
    started = time.perf_counter()
    try:
        if traced is None:
            result = run_case(target, case)
        else:
            with traced:
                result = run_case(target, case)
    finally:
        if stopwatch is not None:
            stopwatch.simulating += time.perf_counter() - started
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
    if options.engine not in ENGINES:
        raise UsageError(
            f"unknown engine {options.engine!r}; expected one of {', '.join(ENGINES)}"
        )
    properties = select(options.properties, target.runner)
    available = scenarios_for(target)
    chosen = options.scenarios or available
    for name in chosen:
        if name not in available:
            raise UsageError(
                f"{target.label} has no {name!r} scenario; it runs: {', '.join(available)}"
            )
    reset_pool()  # see its docstring: pooled workers stay within one search
    # A release whose code does not fit is refused now, in one line (on this
    # search's own pool: a previous search's workers must not run it).
    preflight(target)
    runs: list[ScenarioRun] = []
    # The collector's full collections leave the heap the search starts with
    # alone (dpsim.collector: about a quarter of a check's CPU otherwise).
    with frozen_heap(), _catching_interrupts() as interrupts:
        for index, name in enumerate(chosen):
            try:
                runs.append(
                    _check_scenario(
                        target, name, properties, options, progress, interrupts
                    )
                )
                # A Ctrl-C swallowed after the scenario's last case.
                interrupts.check()
            except _Interrupted as stopped:
                runs.append(stopped.run)
                not_run = tuple(chosen[index + 1 :])
                raise CheckInterrupted(
                    CheckReport(target, options, tuple(runs), not_run)
                ) from None
            except KeyboardInterrupt:
                not_run = tuple(chosen[index + (0 if len(runs) == index else 1) :])
                raise CheckInterrupted(
                    CheckReport(target, options, tuple(runs), not_run)
                ) from None
    return CheckReport(target, options, tuple(runs))


def _check_scenario(
    target: Target,
    scenario: str,
    properties: tuple[Property, ...],
    options: CheckOptions,
    progress: Progress | None,
    interrupts: _Interrupts,
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
    stopwatch = Stopwatch()
    generated = 0
    #: The latest case that failed the chased property: the shrink's best so far.
    latest: list[Finding] = []

    def fails(case: Case) -> bool:
        nonlocal examples, judging, generated
        interrupts.check()
        examples += 1
        if progress is not None:
            progress(scenario, examples, options.examples)
        judged = time.perf_counter()
        try:
            result, verdicts = evaluate(
                target,
                case,
                properties,
                options.baseline,
                None
                if options.coverage is None
                else options.coverage.running(scenario, options.profile),
                stopwatch,
            )
        except PolicyRefused:
            reject()
        finally:
            judging += time.perf_counter() - judged
        if not verdicts:
            return False
        if not chased:
            # Hypothesis stops generating at the first failure (no
            # report_multiple_bugs): every later case is a shrink attempt.
            generated = examples
            chased.append(verdicts[0].property)
            first_failure.append(time.perf_counter() - started)
        if not any(verdict.property == chased[0] for verdict in verdicts):
            return False
        latest[:] = [Finding(case, result, _chased_first(verdicts, chased[0]), False)]
        return True

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

    def so_far() -> ScenarioRun:
        return ScenarioRun(
            scenario,
            examples,
            time.perf_counter() - started,
            latest[0] if latest else None,
            first_failure[0] if first_failure else None,
            judging,
            examples - generated if chased else 0,
            interrupted=True,
            simulating_seconds=stopwatch.simulating,
        )

    database_key = (
        _database_key(target, scenario, options)
        if options.database is not None
        else None
    )
    tally = None
    try:
        # A shrink bounded by work, not the clock, under either engine; a
        # case dpsim cannot drive stops the search at once (dpsim.boundary).
        with seeded_draws_only(), bounded_shrinking(), searching():
            if options.engine == "fast":
                from dpsim.search import fast

                tally = fast.Tally()
                minimal = fast.find(
                    strategy,
                    stops_the_search(fails),
                    settings=config,
                    seed=options.seed,
                    database_key=database_key,
                    tally=tally,
                )
            else:
                minimal = find(
                    strategy,
                    stops_the_search(fails),
                    settings=config,
                    # Hypothesis turns the database off for a seeded search; with
                    # one, its stored examples come first and generation is not
                    # pinned.
                    random=Random(options.seed) if options.database is None else None,
                    database_key=database_key,
                )
    except (NoSuchExample, Unsatisfiable):
        return ScenarioRun(
            scenario,
            examples,
            time.perf_counter() - started,
            None,
            None,
            judging,
            simulating_seconds=stopwatch.simulating,
            stopped_early=None if tally is None else tally.stopped_early,
        )
    except KeyboardInterrupt:
        raise _Interrupted(so_far()) from None
    try:
        result, verdicts = evaluate(target, minimal, properties, options.baseline)
    except KeyboardInterrupt:
        raise _Interrupted(so_far()) from None
    finding = Finding(minimal, result, _chased_first(verdicts, chased[0]))
    return ScenarioRun(
        scenario,
        examples,
        time.perf_counter() - started,
        finding,
        first_failure[0],
        judging,
        examples - generated,
        simulating_seconds=stopwatch.simulating,
    )


def _chased_first(verdicts: list[Verdict], chased: str) -> tuple[Verdict, ...]:
    """The chased property first, the others the case also broke after it."""
    return tuple(sorted(verdicts, key=lambda verdict: verdict.property != chased))


def _database_key(target: Target, scenario: str, options: CheckOptions) -> bytes:
    hashes = ",".join(loaded.sha256 for loaded in target.files)
    return f"dpsim:{hashes}:{scenario}:{options.profile}".encode()
