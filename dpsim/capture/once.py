"""Strategies built once and drawn from many times.

Hypothesis validates a strategy object, and works out its label and whether
it can be empty, the first time it is drawn from. The case strategies draw
from strategies whose bounds or elements are known only mid-draw (a palette
of this step's batches, requests up to this batch's tokens); built anew on
every draw, those first-draw costs were about half of drawing a case. These
helpers hand out one object per distinct argument instead. The object is the
one ``st.integers`` / ``st.sampled_from`` would build, so what is drawn, and
how it shrinks, is unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, cast

from hypothesis import strategies as st

#: ``st.booleans()``, drawn from everywhere.
BOOLEANS: st.SearchStrategy[bool] = st.booleans()


@functools.lru_cache(maxsize=8192)
def ints(low: int, high: int) -> st.SearchStrategy[int]:
    """``st.integers(low, high)``, one object per bounds.

    The object is the one ``st.integers`` wraps in its lazy strategy, made
    directly: token and request bounds are known only mid-draw, so a search
    keeps asking for new ones (about one per case at 8 ranks, more under the
    contract profile), and ``st.integers`` files each new one in Hypothesis'
    own strategy cache, whose rebalancing made it cost as much as ten draws.
    Hypothesis draws, labels and spans a lazy strategy as the one it wraps,
    so the choices and the cases are the same. Bounds it would refuse (not
    two ints in order) still go to ``st.integers``, which refuses them.
    """
    if type(low) is int and type(high) is int and low <= high:
        return _INTEGERS(low, high)
    return st.integers(low, high)


def _integers_class() -> Callable[[int, int], st.SearchStrategy[int]]:
    built = st.integers(0, 1)
    # The lazy wrapper every strategy function returns holds it here; a
    # Hypothesis that builds it otherwise keeps st.integers itself.
    inner = getattr(built, "wrapped_strategy", built)
    kind = cast(Callable[[int, int], st.SearchStrategy[int]], type(inner))
    if repr(kind(0, 1)) != repr(inner):  # pragma: no cover - other Hypothesis
        return st.integers
    return kind


_INTEGERS = _integers_class()


def sampled(elements: tuple[Hashable, ...]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(elements)``, one object per tuple of elements of one type.

    The first element's type is part of the key: ``(0, 1)`` and
    ``(False, True)`` are equal tuples, but not the same strategy.
    """
    return _sampled(type(elements[0]) if elements else None, elements)


@functools.lru_cache(maxsize=8192)
def _sampled(kind: type | None, elements: tuple[Hashable, ...]) -> st.SearchStrategy:
    return st.sampled_from(elements)
