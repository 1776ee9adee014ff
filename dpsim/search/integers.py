"""Hypothesis' integer choice, with what depends only on its bounds worked out once.

Most of a case's choices are integers (a ``sampled_from``'s index, a count),
and for each one Hypothesis' provider builds a constraints dict and places
both bounds on its integer distribution's CDF; for a weighted one (a wide
``integers``) it also builds a sampler, whose outcome it draws through the
data object's own unobserved choices. That is most of what a choice costs
:class:`dpsim.search.draw.FastData`, and the same every time for the same
bounds. :func:`draw_integer` keeps it per bounds and otherwise takes the
provider's steps in the provider's order: a constant one time in twenty
(from Hypothesis' own constant pools and cache), else for a weighted choice
the sampler's outcome, else a point of the same distribution between the
same CDF values. So it draws the same value from the same random state:
tests/test_search_integers.py checks that against the provider itself. It
follows the provider of the Hypothesis versions it was checked on
(:data:`dpsim.search.internals.CHECKED_ON`); :func:`lean` says when it holds.
"""

from __future__ import annotations

from random import Random
from typing import Any, NamedTuple

import hypothesis

from dpsim.search.internals import (
    CHECKED_ON,
    CONSTANTS_CACHE,
    GLOBAL_CONSTANTS,
    INTEGERS_DISTRIBUTION,
    ConjectureData,
    HypothesisProvider,
    PiecewiseDistribution,
    Sampler,
    SortedSet,
    UniformDistribution,
    choice_constraints_key,
)

#: The provider's chance of drawing a constant instead (its default ``p``).
CONSTANT_CHANCE = 0.05

#: Whether this Hypothesis' provider is the one :func:`draw_integer` follows.
_CHECKED = hypothesis.__version__ in CHECKED_ON


class _Middle(NamedTuple):
    """The integer distribution's uniform middle (within ``switchover`` of
    0), where its inverse CDF is two lines of arithmetic: what
    ``PiecewiseDistribution.inverse_cdf`` and ``UniformDistribution.inverse_cdf``
    compute there, with the same operands in the same order."""

    switchover: float
    left_mass: float
    inner_g_neg: float
    beta: float
    half_width: float


def _middle_of(distribution: object) -> _Middle | None:
    """``distribution``'s uniform middle, when it is the piecewise
    distribution with a uniform inside that the provider uses."""
    if type(distribution) is not PiecewiseDistribution:
        return None  # pragma: no cover - another Hypothesis
    inner = distribution.inner
    if type(inner) is not UniformDistribution:
        return None  # pragma: no cover - another Hypothesis
    return _Middle(
        distribution.switchover,
        distribution._left_mass,
        distribution._inner_g_neg,
        distribution._beta,
        inner.half_width,
    )


_MIDDLE = _middle_of(INTEGERS_DISTRIBUTION)
# As module names, read on every choice (cheaper than a tuple's fields); no
# choice uses them without _MIDDLE.
_SWITCHOVER, _LEFT_MASS, _INNER_G_NEG, _BETA, _HALF_WIDTH = _MIDDLE or (0, 0, 0, 1, 0)


def lean(provider: object) -> bool:
    """Whether :func:`draw_integer` draws as ``provider`` would: it is
    Hypothesis' own provider, of a version this module was checked on."""
    return _CHECKED and type(provider) is HypothesisProvider


class _Bounds(NamedTuple):
    """What the provider works out from an integer choice's bounds (and
    weights) alone."""

    #: The bounds the value is clamped to (open ends closed as the provider
    #: closes them).
    low: int
    high: int
    #: The CDF values of the bounds, and the width between them; ``safe``
    #: False when that width is too narrow to sample in (then the provider
    #: draws uniformly).
    cdf_low: float
    cdf_width: float
    safe: bool
    #: The constraints dict the provider's constant pools are keyed by.
    constraints: dict[str, Any]
    #: For weighted choices, the provider's sampler (its first outcome: the
    #: unweighted distribution; the others: the weighted values, in order).
    sampler: Sampler | None
    weighted: tuple[int, ...]
    #: Whether both bounds lie in the distribution's uniform middle, so that
    #: every point sampled between their CDF values maps back through it
    #: (most choices: indices and counts); the switchover's margin, half a
    #: value's width of CDF, is far wider than any rounding of the point.
    middle: bool


#: Bounds seen, by (min_value, max_value) and the weights' items in order.
#: Mid-draw bounds keep producing new pairs, so the table is emptied when
#: full rather than left to grow.
_BOUNDS: dict[tuple[Any, ...], _Bounds] = {}
_BOUNDS_MAX = 4096


def draw_integer(
    data: ConjectureData,
    min_value: int | None,
    max_value: int | None,
    weights: dict[int, float] | None = None,
) -> int:
    """``data.provider.draw_integer(min_value, max_value, weights=weights)``,
    drawn exactly as the provider draws it. ``data`` is the provider's; a
    weighted choice draws its sampler's outcome from it unobserved, as the
    provider does."""
    key: tuple[Any, ...] = (min_value, max_value)
    if weights is not None:
        key += tuple(weights.items())
    bounds = _BOUNDS.get(key)
    if bounds is None:
        bounds = _bounds(key, min_value, max_value, weights)
    # Unpacked once: a named field costs a descriptor call per read.
    low, high, cdf_low, cdf_width, safe, constraints, sampler, weighted, middle = bounds
    random = data._random
    assert random is not None
    if random.random() <= CONSTANT_CHANCE:
        constant = _constant(data.provider, random, constraints)  # type: ignore[arg-type]
        if constant is not None:
            return constant
    if sampler is not None:
        outcome = sampler.sample(data)
        if outcome:
            return weighted[outcome - 1]
    if not safe:
        return random.randint(low, high)
    # The provider resamples until 0 < p < 1, which inverse_cdf requires.
    while (p := cdf_low + random.random() * cdf_width) in {0, 1}:
        pass  # pragma: no cover
    if middle:
        # INTEGERS_DISTRIBUTION.inverse_cdf(p) inside its middle, inline.
        target = _INNER_G_NEG + (p - _LEFT_MASS) / _BETA
        value = round(-_HALF_WIDTH + 2 * _HALF_WIDTH * target)
    else:
        value = round(INTEGERS_DISTRIBUTION.inverse_cdf(p))
    # The provider clamps too, not trusting the distribution's rounding.
    if value < low:
        return low
    if value > high:
        return high
    return value


def _bounds(
    key: tuple[Any, ...],
    min_value: int | None,
    max_value: int | None,
    weights: dict[int, float] | None,
) -> _Bounds:
    """The provider's bounds, CDF values, constraints and sampler for this
    choice, filed under ``key``."""
    constraints = {
        "min_value": min_value,
        "max_value": max_value,
        "weights": weights,
        "shrink_towards": 0,
    }
    sampler = None
    if weights is not None:
        # What ConjectureData.draw_integer asserts of weights (but their
        # number: an integer literal of 100 or more in a dpsim module would
        # join Hypothesis' local constants, and so change what is drawn).
        assert min_value is not None
        assert max_value is not None
        assert sum(weights.values()) < 1
        assert all(weight != 0 for weight in weights.values())
        sampler = Sampler([1 - sum(weights.values()), *weights.values()], observe=False)
    # The provider's unbounded ends: wide enough for any integer a test
    # would ask for, narrow enough for C APIs.
    if min_value is None and max_value is None:
        min_value, max_value = -(2**128), 2**128
    elif min_value is None:
        assert max_value is not None
        min_value = -max(2**128, 2 * abs(max_value))
    elif max_value is None:
        max_value = max(2**128, 2 * abs(min_value))
    cdf_low, cdf_high, safe = 0.0, 1.0, True
    try:
        cdf_min, cdf_max = min_value - 0.5, max_value + 0.5
    except OverflowError:
        safe = False
    else:
        cdf_low = INTEGERS_DISTRIBUTION.cdf(cdf_min)
        cdf_high = INTEGERS_DISTRIBUTION.cdf(cdf_max)
        # The provider's floor on the width it samples within.
        if cdf_high - cdf_low < 1e-13:
            safe = False
    middle = (
        safe
        and _MIDDLE is not None
        and min_value > -_SWITCHOVER
        and max_value < _SWITCHOVER
    )
    bounds = _Bounds(
        min_value,
        max_value,
        cdf_low,
        cdf_high - cdf_low,
        safe,
        constraints,
        sampler,
        tuple(weights or ()),
        middle,
    )
    if len(_BOUNDS) >= _BOUNDS_MAX:
        _BOUNDS.clear()
    _BOUNDS[key] = bounds
    return bounds


def _constant(
    provider: HypothesisProvider, random: Random, constraints: dict[str, Any]
) -> int | None:
    """The provider's constant for these constraints, once it has chosen to
    draw one: from its global or its local pool (the constants of the
    modules loaded so far), through its own cache of permitted ones; None
    when neither pool holds a permitted value."""
    # The provider's per-case view of the local constants: reading it picks
    # up newly loaded modules and empties the cache when they add some.
    local = provider._local_constants
    key: Any = ("integer", choice_constraints_key("integer", constraints))  # type: ignore[arg-type]
    if key not in CONSTANTS_CACHE:
        low, high = constraints["min_value"], constraints["max_value"]
        CONSTANTS_CACHE[key] = (
            _permitted(GLOBAL_CONSTANTS, low, high),
            _permitted(local, low, high),
        )
    global_constants, local_constants = CONSTANTS_CACHE[key]
    pools = ([global_constants] if global_constants else []) + (
        [local_constants] if local_constants else []
    )
    if not pools:
        return None
    value = random.choice(random.choice(pools))
    assert isinstance(value, int)
    return value


def _permitted(pool: Any, low: int | None, high: int | None) -> tuple[int, ...]:
    """``pool``'s integer constants within the bounds, in its order: what
    the provider keeps through Hypothesis' ``choice_permitted``, inline (a
    new pair of bounds tests each of some five hundred constants, and the
    call per constant was most of that)."""
    constants = pool.set_for_type("integer")
    if type(constants) is SortedSet and constants.key is None:
        # Hypothesis' pools are sorted by value, so the constants within
        # the bounds are one slice: found by bisection, not by testing all.
        start = 0 if low is None else constants.bisect_left(low)
        stop = len(constants) if high is None else constants.bisect_right(high)
        return tuple(constants[start:stop])
    return tuple(
        choice
        for choice in constants
        if (low is None or low <= choice) and (high is None or choice <= high)
    )
