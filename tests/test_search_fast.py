"""The fast engine on plain Hypothesis strategies (no release needed).

What it must keep from Hypothesis: the case its cheap data object draws is
the one Hypothesis' own data object replays from the recorded choices (or a
shrink from them would shrink something else); a seed alone decides what it
draws and what it shrinks to; a planted bug is shrunk as ``find()`` shrinks
it; and a database is replayed first and written to. What it adds: rejected
draws and repeats of an earlier case are not counted as cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, reject, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.errors import InvalidArgument, NoSuchExample, Unsatisfiable
from hypothesis.strategies import SearchStrategy

from dpsim.capture.once import ints
from dpsim.search import fast
from dpsim.search.draw import (
    INTEGERS,
    JUST,
    ONE_OF,
    SAMPLED_FROM,
    FastData,
    _known_elements,
    _known_ready,
    context,
    draw,
)
from dpsim.search.internals import (
    ConjectureData,
    Status,
    StopTest,
    choice_size,
    unwrap_strategies,
)


def config(examples: int = 200, database: Any = None, shrink: bool = True) -> Any:
    return settings(
        max_examples=examples,
        database=database,
        deadline=None,
        phases=(Phase.reuse, Phase.generate) + ((Phase.shrink,) if shrink else ()),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )


@st.composite
def built_per_draw(draw: Any) -> tuple[list[int], int | None, int]:
    """Strategies made anew inside each draw, as a step's palette is."""
    items = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4))
    pick = st.sampled_from(items)
    either = st.one_of(st.none(), st.sampled_from(items), st.integers(0, max(items)))
    doubled = st.sampled_from(items).map(lambda item: 2 * item)
    return [draw(pick) for _ in range(3)], draw(either), draw(doubled)


STRATEGIES = {
    "built per draw": built_per_draw(),
    "lists": st.lists(st.integers(0, 100), min_size=3, max_size=40),
    "nested": st.lists(
        st.tuples(st.booleans(), st.one_of(st.none(), st.integers(-5, 5))),
        max_size=8,
    ),
    "sampled": st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 1), max_size=6),
    "filtered": st.integers(0, 1000).filter(lambda x: x % 7 == 3),
    "flatmap": st.integers(1, 6).flatmap(
        lambda n: st.lists(st.integers(0, n), min_size=n, max_size=n)
    ),
    "text": st.text(max_size=12),
    "unique": st.lists(st.integers(0, 50), unique=True, max_size=20),
}


def replayed(strategy: Any, choices: tuple[Any, ...]) -> Any:
    """What Hypothesis' own data object draws from ``choices``."""
    data = ConjectureData.for_choices(choices)
    with context(data):
        value = data.draw(strategy)
    data.freeze()
    assert data.status is Status.VALID
    assert data.choices == choices
    return value


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_case_drawn_is_the_one_hypothesis_replays(name: str) -> None:
    strategy = STRATEGIES[name]
    random = Random(1)
    drawn = 0
    for _ in range(150):
        result = draw(strategy, random)
        if result is None:
            continue
        value, choices, _ = result
        assert repr(replayed(strategy, choices)) == repr(value)
        drawn += 1
    assert drawn > 50


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_case_drawn_is_the_one_hypothesis_draws_from_the_same_random(
    name: str,
) -> None:
    """Not only replayable: the same distribution. FastData draws a
    sampled_from, an integers and a one_of without their do_draw, so an
    index or a bound off by one would still replay, but not draw, the same."""
    strategy = STRATEGIES[name]
    for seed in range(60):
        fast_random, own_random = Random(seed), Random(seed)
        result = draw(strategy, fast_random)
        own = ConjectureData(random=own_random)
        try:
            with context(own):
                value = own.draw(strategy)
        except StopTest:
            assert result is None
            continue
        own.freeze()
        assert result is not None
        assert repr(result[0]) == repr(value)
        assert result[1] == own.choices
        assert fast_random.getstate() == own_random.getstate()


def test_a_choice_counts_the_bytes_hypothesis_counts_for_it() -> None:
    # Integers around every byte boundary and past the 64 bits worked out
    # without Hypothesis, both signs; and the other kinds of choice.
    integers = [
        sign * (2**bits + delta)
        for bits in range(0, 80)
        for delta in (-1, 0, 1)
        for sign in (1, -1)
    ]
    data = FastData(Random(0))
    for choice in [*integers, True, False, 0.5, "abc", "\u00e9", b"xy"]:
        before = data.length
        data._record(choice)
        assert data.length - before == choice_size(choice), choice


def test_a_draw_past_hypothesis_buffer_is_rejected_as_it_would_overrun() -> None:
    # Each 2,000-byte draw is 2,000 of the buffer's 8 KiB: the fifth overruns.
    strategy = st.lists(st.binary(min_size=2000, max_size=2000), min_size=5, max_size=5)
    assert draw(strategy, Random(0)) is None
    data = ConjectureData(random=Random(0))
    with pytest.raises(StopTest), context(data):
        data.draw(strategy)
    assert data.status is Status.OVERRUN


def test_sampled_from_just_and_integers_have_nothing_to_validate_and_are_never_empty() -> (
    None
):
    # What lets a draw skip validating them (draw.py): Hypothesis' defaults,
    # which validate nothing and call a strategy not empty.
    for kind in (SAMPLED_FROM, JUST, INTEGERS):
        assert kind.do_validate is SearchStrategy.do_validate
        assert kind.calc_is_empty is SearchStrategy.calc_is_empty
    for strategy in (
        st.sampled_from([3, 1]),
        st.sampled_from([3, 1]).map(str),
        st.sampled_from([3, 1]).filter(bool),
    ):
        assert type(strategy) is SAMPLED_FROM
        assert not strategy.is_empty
    assert type(st.just([])) is JUST
    assert not st.just(None).is_empty
    assert type(unwrap_strategies(st.integers(3, 3))) is INTEGERS
    assert type(ints(3, 4)) is INTEGERS
    assert not ints(3, 4).is_empty


def test_a_one_of_is_not_validated_again_only_when_its_branches_are_known() -> None:
    # What a one_of's validation and emptiness come down to (draw.py): its
    # branches'. Plain branches and branches drawn before are known.
    assert type(st.one_of(st.just(1), st.just(2))) is ONE_OF
    assert ONE_OF.do_validate is not SearchStrategy.do_validate
    fresh = st.one_of(
        st.sampled_from((1, 2)),
        st.just(3),
        ints(0, 4),
        st.one_of(st.just(5), st.sampled_from([6]).map(str)),
    )
    assert _known_ready(fresh)
    assert not _known_ready(st.one_of(st.just(1), st.nothing()))
    lazy = st.integers(17, 93)  # bounds no other test draws
    either = st.one_of(st.just(1), lazy)
    assert not _known_ready(either)
    assert draw(lazy, Random(0)) is not None
    assert _known_ready(either)


def test_a_known_one_of_has_the_elements_hypothesis_gives_it() -> None:
    # Its branches flattened, each once, in order, empty ones left out:
    # nested one_ofs (one holding a branch twice, one holding an empty one,
    # drawn before and so known), a branch repeated across them, a mapped
    # one drawn before (whose branches are new objects every time).
    pick = st.sampled_from([1, 2])
    nested = st.one_of(pick, ints(0, 5), pick)
    holey = st.one_of(st.just(7), st.nothing())
    mapped = st.one_of(st.just(8), st.nothing()).map(str)
    for drawn_before in (holey, mapped):
        assert draw(drawn_before, Random(0)) is not None
    for one_of in (
        st.one_of(pick, nested),
        st.one_of(nested, st.just(3), pick, ints(0, 5)),
        st.one_of(holey, st.one_of(holey, st.just(9))),
        st.one_of(mapped, pick),
    ):
        assert _known_ready(one_of)
        ours, theirs = _known_elements(one_of), list(one_of.element_strategies)  # type: ignore[attr-defined]
        assert len(ours) == len(theirs)
        for mine, its in zip(ours, theirs, strict=True):
            # A mapped strategy's branches are made anew on every ask.
            assert mine is its or (
                type(mine) is type(its)
                and mine.mapped_strategy is its.mapped_strategy  # type: ignore[attr-defined]
                and mine.pack is its.pack  # type: ignore[attr-defined]
            )


def test_a_one_of_with_an_invalid_or_empty_branch_is_still_refused() -> None:
    with pytest.raises(InvalidArgument):
        draw(st.one_of(st.just(1), st.integers(3, 1)), Random(0))
    assert draw(st.one_of(st.nothing(), st.nothing()), Random(0)) is None


def test_a_sampled_from_whose_filter_rejects_everything_is_rejected() -> None:
    strategy = st.sampled_from([1, 2, 3]).filter(lambda item: item > 5)
    assert draw(strategy, Random(0)) is None
    data = ConjectureData(random=Random(0))
    with pytest.raises(StopTest), context(data):
        data.draw(strategy)
    assert data.status is Status.INVALID


def test_an_empty_strategy_is_rejected_every_time_it_is_drawn() -> None:
    # Only strategies found not empty are remembered as ready.
    strategy = st.one_of(st.nothing(), st.nothing())
    assert [draw(strategy, Random(seed)) for seed in range(3)] == [None] * 3


def test_repeats_of_an_earlier_case_are_not_run_and_the_stop_is_said() -> None:
    seen: list[int] = []

    def condition(x: int) -> bool:
        seen.append(x)
        return False

    tally = fast.Tally()
    with pytest.raises(NoSuchExample):
        fast.find(
            st.integers(0, 3),
            condition,
            settings=config(100),
            seed=0,
            tally=tally,
        )
    assert sorted(seen) == [0, 1, 2, 3]
    assert tally.run == 4 and tally.duplicates > 0
    assert tally.stopped_early is not None and "repeated" in tally.stopped_early


def test_rejected_cases_do_not_count_towards_the_budget() -> None:
    judged: list[int] = []

    def condition(x: int) -> bool:
        if x % 2:
            reject()
        judged.append(x)
        return False

    tally = fast.Tally()
    with pytest.raises(NoSuchExample):
        fast.find(
            st.integers(0, 10**6),
            condition,
            settings=config(50),
            seed=3,
            tally=tally,
        )
    assert len(judged) == tally.run == 50
    assert tally.rejected > 0 and tally.stopped_early is None


def test_nothing_but_rejections_is_unsatisfiable() -> None:
    with pytest.raises(Unsatisfiable):
        fast.find(
            st.integers(0, 10),
            lambda x: reject(),
            settings=config(20),
            seed=0,
        )


def planted(xs: list[int]) -> bool:
    return sum(xs) > 100 and len(xs) > 2


def test_a_planted_bug_shrinks_to_the_minimal_case_find_reaches() -> None:
    strategy = st.lists(st.integers(0, 100), max_size=30)
    ours = fast.find(strategy, planted, settings=config(), seed=0)
    theirs = find(strategy, planted, settings=config(), random=Random(0))
    assert ours == theirs
    assert len(ours) == 3 and sum(ours) == 101


def test_the_same_seed_finds_and_shrinks_the_same_case() -> None:
    strategy = st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=20
    )

    def condition(pairs: list[tuple[int, int]]) -> bool:
        return sum(a * b for a, b in pairs) > 1500

    runs = [
        repr(fast.find(strategy, condition, settings=config(), seed=seed))
        for seed in (5, 5, 6, 6)
    ]
    assert runs[0] == runs[1] and runs[2] == runs[3]


def test_without_shrinking_the_first_failing_case_is_returned() -> None:
    judged: list[list[int]] = []

    def condition(xs: list[int]) -> bool:
        judged.append(xs)
        return planted(xs)

    found = fast.find(
        st.lists(st.integers(0, 100), max_size=30),
        condition,
        settings=config(shrink=False),
        seed=0,
    )
    first_failing = next(xs for xs in judged if planted(xs))
    assert found == first_failing


def test_a_database_is_replayed_first_and_given_the_failing_case() -> None:
    database = InMemoryExampleDatabase()
    strategy = st.lists(st.integers(0, 100), max_size=30)
    first = fast.find(
        strategy, planted, settings=config(database=database), seed=0, database_key=b"k"
    )
    assert list(database.fetch(b"k"))
    judged: list[list[int]] = []

    def condition(xs: list[int]) -> bool:
        judged.append(xs)
        return planted(xs)

    # Another seed: only the database can make its first case the failing one.
    again = fast.find(
        strategy,
        condition,
        settings=config(database=database),
        seed=99,
        database_key=b"k",
    )
    assert again == first
    assert judged[0] == first


@st.composite
def headed(draw: st.DrawFn) -> tuple[int, int]:
    return draw(st.integers(0, 10**9)), draw(st.integers(0, 10**9))


def test_a_draw_starting_with_replayed_choices_is_the_one_hypothesis_replays() -> None:
    first = draw(headed(), Random(0))
    assert first is not None and first[2].first_part == 1
    again = draw(headed(), Random(1), replay=first[1][:1])
    assert again is not None
    value, choices, _ = again
    assert value[0] == first[0][0] and value[1] != first[0][1]
    assert replayed(headed(), choices) == value


@dataclass(frozen=True)
class Head:
    sizes: tuple[int, ...]
    mode: str


HEADS = st.builds(
    Head, st.lists(st.integers(0, 99), max_size=5).map(tuple), st.sampled_from("ab")
)


@st.composite
def frozen_head(draw: st.DrawFn) -> tuple[Head, int]:
    return draw(HEADS), draw(st.integers(0, 10**9))


@st.composite
def list_head(draw: st.DrawFn) -> tuple[list[int], int]:
    return draw(st.lists(st.integers(0, 99), max_size=5)), draw(st.integers(0, 9))


def test_a_replayed_immutable_first_part_is_handed_back_not_drawn_again() -> None:
    strategy = frozen_head()
    first = draw(strategy, Random(0))
    assert first is not None and first[2].first_part is not None
    head = first[1][: first[2].first_part]
    heads = []
    for seed in range(1, 4):
        case = draw(strategy, Random(seed), replay=head)
        assert case is not None
        value, choices, data = case
        assert choices[: len(head)] == head and data.first_part == len(head)
        assert replayed(strategy, choices) == value
        heads.append(value[0])
    # The same object each time after the first replay: not drawn again.
    assert heads[1] is heads[2] == first[0][0]


def test_a_replayed_mutable_first_part_is_drawn_anew_each_time() -> None:
    # A case's test may change a list it was given; the next case must not
    # see that.
    strategy = list_head()
    first = draw(strategy, Random(0))
    assert first is not None and first[2].first_part is not None
    head = first[1][: first[2].first_part]
    again = [draw(strategy, Random(seed), replay=head) for seed in range(1, 3)]
    assert again[0] is not None and again[1] is not None
    assert again[0][0][0] == again[1][0][0] == first[0][0]
    assert again[0][0][0] is not again[1][0][0]


def test_some_cases_start_with_an_earlier_cases_first_part() -> None:
    seen: list[tuple[int, int]] = []

    def condition(value: tuple[int, int]) -> bool:
        seen.append(value)
        return False

    with pytest.raises(NoSuchExample):
        fast.find(headed(), condition, settings=config(90), seed=0)
    heads = {head for head, _ in seen}
    assert len(seen) == len(set(seen)) == 90
    # About 1 - REUSE_SHARE of the cases draw their own first part.
    drew_their_own = len(seen) * (1 - fast.REUSE_SHARE)
    assert drew_their_own / 2 <= len(heads) <= drew_their_own * 2
