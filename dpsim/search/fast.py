"""``--engine fast``: a search that draws its own cases and lets Hypothesis shrink.

Hypothesis' engine spends more per case than dpsim's whole simulation of it
(its data tree, spans and mutation of earlier cases), so this loop draws
each case itself (:mod:`dpsim.search.draw`: Hypothesis' strategies and
provider, so the same distribution and edge bias) from ``Random(seed)``,
and runs the same predicate ``find()`` would. What it gives up is the
engine's steering: no mutation of earlier cases beyond starting some cases
with an earlier case's first part (see ``REUSE_SHARE``), no novel-prefix
search, no structural-coverage targeting. The first failing case's choices then go to
Hypothesis' engine (:mod:`dpsim.search.shrink`), which shrinks them as
``find()`` would have, deterministically.

:func:`find` has ``hypothesis.find``'s contract (the minimal failing value,
or NoSuchExample / Unsatisfiable) so check.py can swap engines in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import TypeVar

from hypothesis import Phase
from hypothesis import settings as Settings
from hypothesis.errors import NoSuchExample, Unsatisfiable, UnsatisfiedAssumption
from hypothesis.strategies import SearchStrategy

from dpsim.search.draw import Choices, FastData, context, draw_in
from dpsim.search.shrink import Shrinking

T = TypeVar("T")

#: Draws that run no case (rejected, or a duplicate of an earlier case)
#: allowed before the search stops: this many, plus ``WASTED_PER_CASE`` per
#: case run. As generous as Hypothesis' own bound on invalid cases, so a
#: strategy that rejects often still runs; a tiny space whose every case has
#: run ends here instead of drawing duplicates forever.
WASTED_BASE = 500
WASTED_PER_CASE = 100

#: The share of cases that start with an earlier case's first part (its
#: policy, for dpsim's cases) instead of a new one, and how many recent first
#: parts are kept to pick from. A new policy builds a new manager (vLLM's own
#: table set-up, about a sync's cost for a small table and several for a
#: large one), and drawing it is about a third of a case's choices, while a
#: replayed first part costs next to nothing to draw. Drawing a new policy
#: for every case made this engine's cases 1.7x as costly to simulate as
#: Hypothesis' engine's. Seven in eight (about 50 policies in 400 cases, each
#: run about eight times with other ranks, steps and batches) costs a quarter
#: less CPU per 8-rank case than two in three did, and catches the corpus and
#: the mutation sample as two in three did.
REUSE_SHARE = 7 / 8
REUSE_POOL = 8


@dataclass
class Tally:
    """What the loop drew, for the report and the tests."""

    run: int = 0
    rejected: int = 0
    duplicates: int = 0
    #: Why the loop stopped before running ``max_examples`` cases, if it did.
    stopped_early: str | None = None


def find(
    strategy: SearchStrategy[T],
    condition: Callable[[T], bool],
    *,
    settings: Settings,
    seed: int,
    database_key: bytes | None = None,
    tally: Tally | None = None,
) -> T:
    """The minimal value of ``strategy`` that satisfies ``condition``.

    ``settings`` as for ``hypothesis.find``: ``max_examples`` cases are run
    at most, the database (when given, with ``database_key``) is replayed
    first and saved to, and ``Phase.shrink`` decides whether a failing case
    is shrunk. Unlike a seeded ``hypothesis.find``, ``seed`` pins generation
    with a database too: stored examples come first, then the seed's cases.
    ``condition`` may raise ``UnsatisfiedAssumption`` (``reject()``): that
    case does not count.
    """
    strategy.validate()
    tally = tally if tally is not None else Tally()
    shrinking = Shrinking(strategy, condition, settings, seed, database_key)
    failing = None
    if Phase.reuse in settings.phases:
        failing = shrinking.replay_database()
    if failing is None and Phase.generate in settings.phases:
        failing = search(strategy, condition, settings.max_examples, seed, tally)
        if failing is not None:
            shrinking.found(failing)
    if failing is None:
        if tally.run == 0 and tally.stopped_early is not None:
            raise Unsatisfiable(tally.stopped_early)
        raise NoSuchExample(repr(condition))
    # As Hypothesis does: a stored case that fails again was shrunk already.
    if (
        Phase.shrink in settings.phases
        and not shrinking.runner.reused_previously_shrunk_test_case
    ):
        shrinking.shrink()
    return shrinking.minimal()


def search(
    strategy: SearchStrategy[T],
    condition: Callable[[T], bool],
    max_examples: int,
    seed: int,
    tally: Tally,
) -> Choices | None:
    """Run up to ``max_examples`` distinct cases; the first failing one's choices."""
    random = Random(seed)
    seen: set[Choices] = set()
    #: First parts of recent cases that drew theirs anew, newest last.
    pool: list[Choices] = []
    while tally.run < max_examples:
        if (
            tally.rejected + tally.duplicates
            > WASTED_BASE + WASTED_PER_CASE * tally.run
        ):
            tally.stopped_early = (
                f"stopped after {tally.run} cases: {tally.rejected} draws were "
                f"rejected and {tally.duplicates} repeated an earlier case"
            )
            return None
        replay: Choices = ()
        if pool and random.random() < REUSE_SHARE:
            replay = pool[random.randrange(len(pool))]
        data = FastData(random, replay)
        # One build context for the draw and the case's test, as Hypothesis
        # runs them (entering one cost a twentieth of drawing a case).
        with context(data):
            drawn = draw_in(data, strategy)
            if drawn is None:
                tally.rejected += 1
                continue
            value, choices = drawn
            if not replay and data.first_part:
                pool.append(choices[: data.first_part])
                del pool[:-REUSE_POOL]
            if choices in seen:
                tally.duplicates += 1
                continue
            seen.add(choices)
            try:
                failed = condition(value)
            except UnsatisfiedAssumption:
                tally.rejected += 1
                continue
        tally.run += 1
        if failed:
            return choices
    return None
