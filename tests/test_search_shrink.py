"""The fast engine's shrink: Hypothesis' shrinker, plus a count lowered with what it counted.

A case that draws a count (ranks, steps) and then that many draws, and fails
because of its last draw, is where Hypothesis' shrinker stops early: lowering
the count alone drops the failing draw. These tests start the fast engine's
shrink from such a case and check it reaches the smallest one, that the
candidates delete what the count counted, and that the simplest case is
tried before shrinking. No release needed.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from dpsim.search.counted import Recount, SpanAt, recounts
from dpsim.search.internals import Status
from dpsim.search.shrink import FAILED, Shrinking

CONFIG = settings(
    max_examples=100,
    database=None,
    deadline=None,
    phases=(Phase.generate, Phase.shrink),
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)


#: A rank's value: drawn under a label of its own, as dpsim's batches are.
VALUES = st.sampled_from(range(10))


@st.composite
def ranked(draw: st.DrawFn) -> tuple[tuple[int, ...], ...]:
    """Like dpsim's cases: a rank count, a step count, then a value per rank
    per step."""
    ranks = draw(st.integers(2, 16))
    steps = draw(st.integers(1, 3))
    return tuple(tuple(draw(VALUES) for _ in range(ranks)) for _ in range(steps))


def disagrees(case: tuple[tuple[int, ...], ...]) -> bool:
    """Some step where not every rank passes the same value."""
    return any(len(set(step)) > 1 for step in case)


def shrinking_from(choices: tuple[Any, ...], seed: int = 0) -> Shrinking[Any]:
    shrinking = Shrinking(ranked(), disagrees, CONFIG, seed, None)
    shrinking.found(choices)
    return shrinking


#: Six ranks, two steps; only the last rank of the last step differs.
SIX_BY_TWO = (6, 2, *([0] * 6), *([0] * 5), 1)


def test_the_pass_alone_lowers_the_counts_and_keeps_the_failing_draw() -> None:
    shrinking = shrinking_from(SIX_BY_TWO)
    initial = shrinking.runner.interesting_test_cases[FAILED]
    shrinker = shrinking.runner.new_shrinker(
        initial, lambda data: data.status is Status.INTERESTING
    )
    (own,) = [each for each in shrinker.shrink_passes if each.name == "lower_counts"]
    shrinker.fixate_shrink_passes([own])
    assert shrinker.shrink_target.choices == (2, 1, 0, 1)
    assert own.shrinks == 2


def test_a_whole_shrink_reaches_the_smallest_case_the_same_for_a_seed() -> None:
    start = (9, 3, *([4] * 9), *([4] * 8), 7, *([2] * 9))
    first, second = shrinking_from(start, 3), shrinking_from(start, 3)
    for shrinking in (first, second):
        shrinking.shrink()
    assert first.minimal() == second.minimal() == ((0, 1),)
    assert first.runner.call_count == second.runner.call_count


def spans(*placed: tuple[int, int, int, int | None]) -> list[SpanAt]:
    return [SpanAt(*span) for span in placed]


def test_candidates_delete_as_many_of_each_label_counted_as_the_count_drops() -> None:
    # A root over choices 0..7; the count (3) at 0; label 5 three times
    # (0 at 1, 2, 3), label 6 three times (at 4, 5, 6), label 7 once.
    layout = spans(
        (1, 0, 8, None),
        (2, 0, 1, 0),
        (5, 1, 2, 0),
        (5, 2, 3, 0),
        (5, 3, 4, 0),
        (6, 4, 5, 0),
        (6, 5, 6, 0),
        (6, 6, 7, 0),
        (7, 7, 8, 0),
    )
    found = recounts(0, 3, (1, 2), layout)
    assert found[0] == Recount(0, 1, frozenset({1, 2, 4, 5}))
    assert Recount(0, 1, frozenset({2, 3, 5, 6})) in found
    assert Recount(0, 2, frozenset({1, 4})) in found
    # Each label alone too, and the stretch to the next occurrence: the
    # last of label 6 stretches to its parent's end, over label 7's choice.
    assert Recount(0, 1, frozenset({1, 2})) in found
    assert Recount(0, 2, frozenset({6, 7})) in found
    assert len(set(found)) == len(found)


def test_no_candidate_where_nothing_occurs_as_often_as_the_count() -> None:
    layout = spans((1, 0, 4, None), (2, 0, 1, 0), (5, 1, 2, 0), (5, 2, 3, 0))
    assert recounts(0, 3, (1, 2), layout) == []
