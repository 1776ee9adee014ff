"""Who runs next: the scheduler's only source of nondeterminism, made explicit.

The scheduler asks a chooser whenever more than one rank could run, and records
the answer. A deterministic default keeps ordinary runs reproducible; a
Hypothesis-backed chooser turns interleavings into drawn data, so Hypothesis
both explores them and shrinks a failing one toward the default order; a replay
chooser reruns recorded choices exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from hypothesis import strategies as st


class Chooser(Protocol):
    """Picks the next rank to run from ``runnable`` (sorted, never empty, len > 1).

    Must return a member of ``runnable`` and must not mutate it.
    """

    def choose(self, runnable: Sequence[int]) -> int: ...


class LowestFirst:
    """The default order: the lowest-numbered runnable rank goes next."""

    def choose(self, runnable: Sequence[int]) -> int:
        return runnable[0]


LOWEST_FIRST = LowestFirst()


class HypothesisChooser:
    """Draws each choice from Hypothesis, so interleavings are explored and shrunk.

    Pass the object a ``hypothesis.strategies.data()`` argument gives. Draws are
    indices into the runnable list, so shrinking moves toward index 0, which is
    the default lowest-first order.
    """

    def __init__(self, data: Any) -> None:
        self._data = data
        self._index_strategies: dict[int, st.SearchStrategy[int]] = {}

    def choose(self, runnable: Sequence[int]) -> int:
        count = len(runnable)
        strategy = self._index_strategies.get(count)
        if strategy is None:
            strategy = self._index_strategies[count] = st.integers(0, count - 1)
        return runnable[self._data.draw(strategy, label="next rank")]


class ReplayDivergedError(RuntimeError):
    """A recorded choice names a rank that is not runnable at that point."""


class ReplayChooser:
    """Replays the ``choices`` of an earlier ``SimResult``.

    Once the recorded choices run out it continues in the default order, which
    is what a shrunk Hypothesis run did past the end of its data.
    """

    def __init__(self, choices: Iterable[int]) -> None:
        self._choices = list(choices)
        self._next = 0

    def choose(self, runnable: Sequence[int]) -> int:
        if self._next >= len(self._choices):
            return runnable[0]
        rank = self._choices[self._next]
        if rank not in runnable:
            raise ReplayDivergedError(
                f"choice #{self._next} is rank {rank}, but runnable ranks are "
                f"{list(runnable)}: the programs differ from the recorded run"
            )
        self._next += 1
        return rank
