"""Hypothesis' engine, given a failing choice sequence instead of finding one.

The fast loop finds a failing case by itself; shrinking it is Hypothesis'
job, done by the same engine and shrinker ``find()`` uses, from that case's
choices, with a seeded ``Random`` so the same seed shrinks to the same case.
The shrinker has one pass more than ``find()``'s (:func:`lower_counts`): the
fast loop's first failing case is a random one, often larger than the first
one Hypothesis' engine fails on (which starts from the simplest cases), and
from it the shrinker alone can stop at six ranks where ``find()`` reaches two.
The engine also owns the example database here exactly as under ``find()``:
it replays the stored examples first, and saves every failing case it runs
(the fast loop's first one included), so the next run replays it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from random import Random
from typing import Any, Generic, TypeVar

from hypothesis import settings as Settings
from hypothesis.errors import UnsatisfiedAssumption
from hypothesis.strategies import SearchStrategy

from dpsim.search.counted import SpanAt, recounts
from dpsim.search.draw import Choices, context
from dpsim.search.internals import (
    Chooser,
    ConjectureData,
    ConjectureRunner,
    InterestingOrigin,
    RunIsComplete,
    Shrinker,
    ShrinkPass,
    Status,
    StopTest,
    choice_from_index,
)

T = TypeVar("T")

#: Every failure is one bug to the engine: which property a case must fail
#: is the predicate's business (check.py chases the first one seen).
FAILED = InterestingOrigin(AssertionError, None, None, (), ())


class Shrinking(Generic[T]):
    """Hypothesis' engine over ``strategy`` and ``condition``, for one search."""

    def __init__(
        self,
        strategy: SearchStrategy[T],
        condition: Callable[[T], bool],
        settings: Settings,
        seed: int,
        database_key: bytes | None,
    ) -> None:
        self.strategy = strategy
        self.condition = condition
        #: The value the latest failing run drew (what ``find()`` returns).
        self.last: list[T] = []
        self.runner = _Runner(
            self._test_function,
            settings=settings,
            random=Random(seed),
            database_key=database_key if settings.database is not None else None,
        )
        # Stored choices are read with Hypothesis' own provider, as its
        # engine does in its reuse and shrink phases.
        self.runner._switch_to_hypothesis_provider = True

    def _test_function(self, data: ConjectureData) -> None:
        with context(data):
            value = data.draw(self.strategy)
            try:
                failed = self.condition(value)
            except UnsatisfiedAssumption:
                data.mark_invalid("the case was rejected")
        if failed:
            self.last[:] = [value]
            data.mark_interesting(FAILED)

    def replay_database(self) -> Choices | None:
        """Run the stored examples; the failing one to shrink, if any."""
        with _until_complete():
            self.runner.reuse_existing_test_cases()
        return self._best()

    def found(self, choices: Choices) -> None:
        """Record a failing case found elsewhere: rerun it through the engine
        (which saves it to the database) and fail loudly if it does not fail
        there, since a shrink from it would then mean nothing."""
        with _until_complete():
            result = self.runner.cached_test_function(choices)
            if result.status is not Status.INTERESTING:
                raise RuntimeError(
                    "the fast engine's failing case did not fail when Hypothesis' "
                    f"engine replayed its choices (status {result.status.name}): "
                    "rerun with --engine hypothesis and report this"
                )

    def shrink(self) -> None:
        """Shrink the failing case recorded, as ``find()``'s shrink phase does,
        with one more shrink pass (:func:`lower_counts`)."""
        with _until_complete():
            self.runner.shrink_interesting_test_cases()

    def minimal(self) -> T:
        """The smallest failing case, drawn again as ``find()`` does at its end."""
        choices = self._best()
        assert choices is not None, "no failing case was recorded"
        data = ConjectureData.for_choices(choices)
        try:
            self._test_function(data)
        except StopTest as stop:
            if stop.testcounter != data.testcounter:
                raise
        if data.status is not Status.INTERESTING:
            raise RuntimeError(
                "the shrunk case did not fail again when replayed (status "
                f"{data.status.name}): the target or a property is not deterministic"
            )
        return self.last[0]

    def _best(self) -> Choices | None:
        # One origin, so the engine keeps one case: the smallest seen.
        result = self.runner.interesting_test_cases.get(FAILED)
        return None if result is None else tuple(result.choices)


class _Runner(ConjectureRunner):
    """Hypothesis' engine, whose shrinker has :func:`lower_counts` too."""

    def new_shrinker(self, *args: Any, **kwargs: Any) -> Shrinker:
        shrinker = super().new_shrinker(*args, **kwargs)
        shrinker.shrink_passes.append(
            ShrinkPass(partial(lower_counts, shrinker), name="lower_counts")
        )
        return shrinker


def lower_counts(shrinker: Shrinker, chooser: Chooser) -> None:
    """A shrink pass: one integer choice lowered, to its simplest value or
    by one, with as many of what it may have counted deleted
    (:func:`dpsim.search.counted.recounts`), one candidate per step."""
    nodes = shrinker.nodes
    index = chooser.choose(
        range(len(nodes)),
        lambda at: nodes[at].type == "integer" and not nodes[at].trivial,
    )
    node = nodes[index]
    value = int(node.value)
    simplest = int(choice_from_index(0, node.type, node.constraints))
    lower = (simplest,) if simplest == value - 1 else (simplest, value - 1)
    spans = [
        SpanAt(span.label, span.start, span.end, span.parent) for span in shrinker.spans
    ]
    candidates = recounts(index, value, lower, spans)
    if not candidates:
        return
    chosen = candidates[chooser.choose(range(len(candidates)))]
    shrinker.consider_new_nodes(
        tuple(
            old.copy(with_value=chosen.value) if position == chosen.index else old
            for position, old in enumerate(nodes)
            if position not in chosen.deleted
        )
    )


@contextmanager
def _until_complete() -> Iterator[None]:
    """The engine ends a run by raising; its limits reached is not an error."""
    with suppress(RunIsComplete):
        yield
