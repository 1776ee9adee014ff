"""``dpsim diff``'s engine: the same cases on both sides, then shrink each kind.

Cases are drawn once per scenario, seeded, from ONE side's generators: the
base's by default. The base is the reference (the release before an upgrade,
the tree before a pull request), so its caller profile is what "the batches
vLLM sends" means, and the question is what the new side does with them.
``cases_from="new"`` draws from the new side's instead, to exercise what it
adds (an input, a scenario's feature); cases that use it are then ones the
base cannot run. Only scenarios both sides run are drawn. A case the other
side cannot run at all (:func:`~dpsim.scenarios.run.why_not_runnable`: an
input it lacks) or whose policy either side's vLLM refuses (``PolicyRefused``)
is rejected, as ``check`` rejects a refused policy, and counted apart with
the reason: it is no difference.

The survey runs ``--examples`` cases per scenario on both sides and tallies
each kind of difference (:mod:`dpsim.diff.outcome`). Then, per kind not
declared expected, a second seeded search replays the survey's draws (same
seed, same answers up to there, so the same cases: the survey's verdicts are
kept per case and not simulated again) until a case shows that kind, and
Hypothesis shrinks it keeping only cases that still show that kind: the
smallest case of a padding change, not of whatever else the first case also
showed. Same sides, options and seed: the same report, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

from hypothesis import HealthCheck, Phase, find, reject, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable
from hypothesis.strategies import SearchStrategy

from dpsim.boundary import searching, stops_the_search
from dpsim.check import DEFAULT_EXAMPLES, evaluate
from dpsim.errors import UsageError
from dpsim.properties import PROPERTIES, Verdict
from dpsim.records.case import Case
from dpsim.records.policy import CapturePolicy
from dpsim.records.trace import SimResult
from dpsim.scenarios import PolicyRefused
from dpsim.scenarios.generate import (
    DEFAULT_RANKS,
    cases,
    scenarios_for,
    seeded_draws_only,
)
from dpsim.scenarios.run import preflight, why_not_runnable
from dpsim.search.bounded import bounded_shrinking
from dpsim.sim.workers import reset_pool
from dpsim.targets.load import Target

from .outcome import Observed, differences, ordered

#: Called as ``progress(what, scenario, cases_run, cases_planned)``; ``what``
#: is "survey" or the kind being shrunk.
Progress = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class DiffOptions:
    scenarios: tuple[str, ...] = ()
    profile: str = "caller"
    ranks: tuple[int, int] = DEFAULT_RANKS
    policy: CapturePolicy | None = None
    examples: int = DEFAULT_EXAMPLES
    seed: int = 0
    #: Kinds the user expects: counted apart, not shrunk, not a failure.
    expected: frozenset[str] = field(default_factory=frozenset)
    #: Whose generators draw the cases: "base" or "new".
    cases_from: str = "base"


@dataclass(frozen=True)
class SideRun:
    """One case on one side."""

    result: SimResult
    verdicts: tuple[Verdict, ...]
    observed: Observed


@dataclass(frozen=True)
class Group:
    """Every case that showed one kind of difference, and its smallest one."""

    kind: str
    #: Cases of the survey showing it, per scenario (in the order run).
    counts: tuple[tuple[str, int], ...]
    expected: bool
    #: The shrunk case (None for an expected kind: not shrunk).
    case: Case | None = None
    base: SideRun | None = None
    new: SideRun | None = None
    #: Every kind the shrunk case shows (``kind`` among them).
    kinds: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return sum(count for _, count in self.counts)


@dataclass(frozen=True)
class Tally:
    """One scenario's survey."""

    scenario: str
    #: Cases run on both sides.
    ran: int = 0
    #: Cases with a difference not declared expected.
    differed: int = 0
    #: Cases whose only differences were declared expected.
    expected_only: int = 0
    #: Cases drawn that a side could not run, by reason ("the new side
    #: cannot run it: ..."), most frequent first.
    apart: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class DiffReport:
    base: Target
    new: Target
    options: DiffOptions
    #: The properties whose verdicts are compared (those both runners run).
    compared: tuple[str, ...]
    tallies: tuple[Tally, ...]
    groups: tuple[Group, ...]

    @property
    def ran(self) -> int:
        return sum(tally.ran for tally in self.tallies)

    @property
    def differed(self) -> int:
        return sum(tally.differed for tally in self.tallies)

    @property
    def unexpected(self) -> tuple[Group, ...]:
        return tuple(group for group in self.groups if not group.expected)


def shared_scenarios(
    base: Target, new: Target, asked: tuple[str, ...]
) -> tuple[str, ...]:
    """The scenarios both sides run (``asked`` of them when given); a scenario
    asked for that a side lacks is a one-line refusal naming the side."""
    mine, theirs = scenarios_for(base), scenarios_for(new)
    both = tuple(name for name in mine if name in theirs)
    for name in asked:
        for side, target, has in (("base", base, mine), ("new", new, theirs)):
            if name not in has:
                raise UsageError(
                    f"the {side} side ({target.label}) has no {name!r} scenario; "
                    f"both sides run: {', '.join(both) or 'none'}"
                )
    chosen = tuple(name for name in both if not asked or name in asked)
    if not chosen:
        raise UsageError(
            f"{base.label} and {new.label} share no scenario to run the same cases on"
        )
    return chosen


class _Refused(Exception):
    """The case cannot run on one side; the message says why, for the tally."""


class _Pair:
    """Runs a case on both sides and remembers which kinds it showed."""

    def __init__(self, base: Target, new: Target, cases_from: str) -> None:
        self.base = base
        self.new = new
        self.other = "new" if cases_from == "base" else "base"
        self.compared = frozenset(
            prop.name
            for prop in PROPERTIES.values()
            if prop.applies_to(base.runner) and prop.applies_to(new.runner)
        )
        #: Per case run, its kinds, or why a side could not run it.
        self.seen: dict[Case, frozenset[str] | str] = {}

    def run(self, case: Case) -> tuple[SideRun, SideRun]:
        """Both sides' runs of ``case``; :class:`_Refused` if one cannot."""
        other = self.new if self.other == "new" else self.base
        why = why_not_runnable(other, case)
        if why is not None:
            raise _Refused(f"the {self.other} side cannot run it: {why}")
        return self._side(self.base, case, "base"), self._side(self.new, case, "new")

    @staticmethod
    def _side(target: Target, case: Case, side: str) -> SideRun:
        try:
            result, verdicts = evaluate(target, case, tuple(PROPERTIES.values()))
        except PolicyRefused:
            # The message names the case's numbers: one reason for the tally.
            raise _Refused(f"the {side} side's vLLM refuses the policy") from None
        return SideRun(result, tuple(verdicts), Observed.of(case, result, verdicts))

    def kinds(self, case: Case) -> frozenset[str]:
        """The kinds ``case`` shows, run once per case; :class:`_Refused` again
        for a case a side could not run."""
        known = self.seen.get(case)
        if known is None:
            try:
                base, new = self.run(case)
                known = differences(base.observed, new.observed, self.compared)
            except _Refused as refused:
                known = str(refused)
            self.seen[case] = known
        if isinstance(known, str):
            # A fresh exception each time: one raised again keeps growing
            # its traceback.
            raise _Refused(known)
        return known


def _settings(examples: int, shrink: bool) -> settings:
    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )


def run_diff(
    base: Target,
    new: Target,
    options: DiffOptions,
    progress: Progress | None = None,
) -> DiffReport:
    chosen = shared_scenarios(base, new, options.scenarios)
    reset_pool()  # as check does: pooled workers stay within one search
    for side in (base, new):
        preflight(side)  # a side whose code does not fit: one line, now
    if options.cases_from not in ("base", "new"):
        raise UsageError(
            f"cases come from the base or the new side, not {options.cases_from!r}"
        )
    pair = _Pair(base, new, options.cases_from)
    strategies = {
        name: cases(
            base if options.cases_from == "base" else new,
            scenario=name,
            profile=options.profile,
            ranks=options.ranks,
            policy=options.policy,
        )
        for name in chosen
    }
    tallies = []
    counts: dict[str, dict[str, int]] = {}
    for name in chosen:
        tallies.append(_survey(pair, name, strategies[name], options, counts, progress))
    groups = []
    for kind in ordered(counts):
        per_scenario = tuple(counts[kind].items())
        if kind in options.expected:
            groups.append(Group(kind, per_scenario, expected=True))
            continue
        scenario = per_scenario[0][0]
        groups.append(
            _shrunk(pair, kind, per_scenario, strategies[scenario], options, progress)
        )
    return DiffReport(
        base,
        new,
        options,
        tuple(name for name in PROPERTIES if name in pair.compared),
        tuple(tallies),
        tuple(groups),
    )


def _survey(
    pair: _Pair,
    scenario: str,
    strategy: SearchStrategy[Case],
    options: DiffOptions,
    counts: dict[str, dict[str, int]],
    progress: Progress | None,
) -> Tally:
    ran = differed = expected_only = 0
    apart: dict[str, int] = {}

    def observe(case: Case) -> bool:
        nonlocal ran, differed, expected_only
        try:
            kinds = pair.kinds(case)
        except _Refused as refused:
            apart[str(refused)] = apart.get(str(refused), 0) + 1
            reject()
        ran += 1
        if progress is not None:
            progress("survey", scenario, ran, options.examples)
        for kind in kinds:
            counts.setdefault(kind, {}).setdefault(scenario, 0)
            counts[kind][scenario] += 1
        if kinds - options.expected:
            differed += 1
        elif kinds:
            expected_only += 1
        return False

    try:
        with seeded_draws_only(), searching():
            find(
                strategy,
                stops_the_search(observe),
                settings=_settings(options.examples, shrink=False),
                random=Random(options.seed),
            )
    except (NoSuchExample, Unsatisfiable):
        pass
    return Tally(
        scenario,
        ran,
        differed,
        expected_only,
        tuple(sorted(apart.items(), key=lambda item: (-item[1], item[0]))),
    )


def _shrunk(
    pair: _Pair,
    kind: str,
    counts: tuple[tuple[str, int], ...],
    strategy: SearchStrategy[Case],
    options: DiffOptions,
    progress: Progress | None,
) -> Group:
    tried = 0

    def shows(case: Case) -> bool:
        nonlocal tried
        tried += 1
        if progress is not None:
            progress(f"shrinking {kind}", counts[0][0], tried, options.examples)
        try:
            return kind in pair.kinds(case)
        except _Refused:
            reject()

    with seeded_draws_only(), bounded_shrinking(), searching():
        smallest = find(
            strategy,
            stops_the_search(shows),
            settings=_settings(options.examples, shrink=True),
            random=Random(options.seed),
        )
    base, new = pair.run(smallest)
    kinds = differences(base.observed, new.observed, pair.compared)
    return Group(kind, counts, False, smallest, base, new, ordered(kinds))
