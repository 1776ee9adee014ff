"""The fast engine's lean integer choice draws what Hypothesis' provider draws.

:func:`dpsim.search.integers.draw_integer` follows the provider's steps with
what depends on the bounds worked out once. From the same random state it
must give the same value and leave the same random state, for every kind of
bounds the provider treats apart: a single value, small and wide ranges,
open ends, ranges too narrow on its CDF (by any margin) to sample in, bounds too large for a
float; and often enough that its constants (one draw in twenty) come up.
"""

from __future__ import annotations

from random import Random
from typing import Any

import pytest

from dpsim.search.draw import FastData
from dpsim.search.integers import _permitted, draw_integer, lean
from dpsim.search.internals import (
    GLOBAL_CONSTANTS,
    ConjectureData,
    HypothesisProvider,
    choice_permitted,
)

BOUNDS = [
    (0, 0),
    (0, 1),
    (0, 7),
    (-5, 5),
    (3, 200),
    # The distribution's uniform middle, to its edges and across them.
    (-255, 255),
    (255, 255),
    (-256, 0),
    (250, 260),
    (-300, -250),
    (0, 2**16),
    (-(10**9), 10**9),
    (None, None),
    (None, 10),
    (-10, None),
    (None, -(2**130)),
    (2**130, None),
    (2**44, 2**44 + 10),
    (2**200, 2**200 + 10),
    (0, 2**1100),
]


#: Weights as a wide ``integers`` gives them (its bounds and near-bounds),
#: and others.
WEIGHTED = [
    (0, 1000, {0: 2 / 128, 1: 1 / 128, 999: 1 / 128, 1000: 2 / 128}),
    (-(2**40), 2**40, {-(2**40): 2 / 128, 2**40: 2 / 128}),
    (0, 10, {7: 0.5, 5: 0.25}),
]
CHOICES = [(low, high, None) for low, high in BOUNDS] + WEIGHTED


@pytest.mark.parametrize("choice", CHOICES, ids=str)
def test_draws_what_the_provider_draws(
    choice: tuple[int | None, int | None, dict[int, float] | None],
) -> None:
    low, high, weights = choice
    for seed in range(5):
        their_random, our_random = Random(seed), Random(seed)
        theirs = ConjectureData(random=their_random).provider
        ours = ConjectureData(random=our_random)
        expected = [theirs.draw_integer(low, high, weights=weights) for _ in range(400)]
        got = [draw_integer(ours, low, high, weights) for _ in range(400)]
        assert got == expected
        assert our_random.getstate() == their_random.getstate()


@pytest.mark.parametrize("choice", CHOICES, ids=str)
def test_constants_permitted_are_the_providers(
    choice: tuple[int | None, int | None, dict[int, float] | None],
) -> None:
    """The pools of permitted constants are the provider's (which the test
    above may not reach: the provider and the lean path share its cache)."""
    low, high, weights = choice
    constraints: Any = {
        "min_value": low,
        "max_value": high,
        "weights": weights,
        "shrink_towards": 0,
    }
    local = HypothesisProvider(None)._local_constants
    for pool in (GLOBAL_CONSTANTS, local):
        expected = tuple(
            value
            for value in pool.set_for_type("integer")
            if choice_permitted(value, constraints)
        )
        assert _permitted(pool, low, high) == expected


def test_constants_are_drawn() -> None:
    """Not vacuous: the provider's constants come up in the draws above
    (0..2**16 holds values its plain distribution all but never gives)."""
    data = ConjectureData(random=Random(0))
    drawn = {draw_integer(data, 0, 2**16) for _ in range(400)}
    assert drawn & {2**16 - 1, 2**15, 2**8 - 1, 2**16}


def test_fast_data_records_what_the_provider_path_records() -> None:
    """FastData's lean choices (the default; a weighted choice's sampler
    draws its outcome through them too) and the provider's (lean off) give
    the same values, choices and buffer length."""
    lean_data, plain_data = FastData(Random(3)), FastData(Random(3))
    assert lean_data.lean
    plain_data.lean = False
    for data in (lean_data, plain_data):
        for low, high, weights in CHOICES[:-5] * 10 + WEIGHTED * 20:
            data.draw_integer(low, high, weights=weights)
    assert lean_data.drawn == plain_data.drawn
    assert lean_data.length == plain_data.length


def test_only_hypothesis_own_provider_is_lean() -> None:
    class Other(HypothesisProvider):
        pass

    assert lean(ConjectureData(random=Random(0)).provider)
    assert not lean(ConjectureData(random=Random(0), provider=Other).provider)
