"""Suggest capture sizes for a workload under a budget of graphs.

Why: the question after "what does my policy cost?" is "what would be
better for the same memory?". With DP, every rank of a graph step runs the
smallest captured size ``>= M``, ``M`` the step's largest batch, so a step
costs ``dp_size * (size(M) - M)`` tokens of graph padding. Choosing ``k``
sizes that minimise the sum of that over the observed ``M`` is a
one-dimensional optimal-partition problem, solved exactly by dynamic
programming over the distinct observed values (any optimal size set can be
moved down onto observed values without raising the cost).

The largest size is fixed to the largest observed ``M`` that the user's
policy covers, so the suggestion never takes a step out of graphs that the
user's policy kept in them. The budget is in graphs as the real manager
counts them (a size can yield a FULL and a PIECEWISE graph), so ``k`` is
the largest whose real table fits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from dpsim.errors import UsageError
from dpsim.records.policy import CapturePolicy, CudagraphMode

__all__ = ["best_sizes", "suggest_policy"]


class _Partition:
    """The dynamic programme, solved once for up to ``count`` sizes.

    ``best[k][j]`` is the least cost of covering ``values[0..j]`` with ``k``
    sizes, the largest at ``values[j]``; ``back[k][j]`` is where the previous
    size sits.
    """

    def __init__(self, observed: Counter[int], top: int, count: int) -> None:
        weights = Counter({v: w for v, w in observed.items() if v <= top})
        weights[top] += 0
        self.values = np.array(sorted(weights), dtype=np.float64)
        counts = np.array([weights[int(v)] for v in self.values], dtype=np.float64)
        n = len(self.values)
        self.count = max(1, min(count, n))
        # Padding values a..b up to values[b] costs values[b] * W(a..b) - S(a..b).
        w_prefix = np.concatenate(([0.0], np.cumsum(counts)))
        s_prefix = np.concatenate(([0.0], np.cumsum(counts * self.values)))

        def span(starts: np.ndarray, end: int) -> np.ndarray:
            weight = w_prefix[end + 1] - w_prefix[starts]
            total = s_prefix[end + 1] - s_prefix[starts]
            return np.asarray(self.values[end] * weight - total)

        self.best = np.full((self.count + 1, n), np.inf)
        self.back = np.full((self.count + 1, n), -1, dtype=np.int64)
        self.best[1] = [span(np.array([0]), j)[0] for j in range(n)]
        for k in range(2, self.count + 1):
            for j in range(k - 1, n):
                previous = np.arange(k - 2, j)
                costs = self.best[k - 1][previous] + span(previous + 1, j)
                pick = int(np.argmin(costs))
                self.best[k][j] = costs[pick]
                self.back[k][j] = previous[pick]

    def sizes(self, count: int) -> tuple[int, ...]:
        last = len(self.values) - 1
        # Fewer sizes can tie with more (few distinct values): take the fewest.
        k = min(
            range(1, min(count, self.count) + 1),
            key=lambda k: (self.best[k][last], k),
        )
        chosen, j = [], last
        while k >= 1:
            chosen.append(int(self.values[j]))
            j, k = int(self.back[k][j]), k - 1
        return tuple(sorted(chosen))


def best_sizes(observed: Counter[int], top: int, count: int) -> tuple[int, ...]:
    """At most ``count`` sizes, the largest ``top``, minimising padding of ``observed``.

    ``observed`` maps a batch size to its weight (steps times ranks); values
    above ``top`` are left out (they run eager either way).
    """
    return _Partition(observed, top, count).sizes(count)


def suggest_policy(
    base: CapturePolicy,
    batch_sizes: Iterable[tuple[int, int]],
    budget: int,
    graphs_of: Callable[[CapturePolicy], int],
) -> CapturePolicy:
    """``base`` with sizes chosen for ``batch_sizes`` ((M, weight) pairs) in ``budget`` graphs.

    ``graphs_of`` counts a policy's graphs with the real manager.
    """
    if budget < 1:
        raise UsageError("--suggest: the budget must be at least 1 graph")
    if base.cudagraph_mode == CudagraphMode.NONE:
        raise UsageError("--suggest: the first policy captures no graphs (mode NONE)")
    observed: Counter[int] = Counter()
    for size, weight in batch_sizes:
        observed[size] += weight
    ceiling = base.effective_max_capture_size
    covered = [value for value in observed if value <= ceiling]
    if not covered:
        raise UsageError(
            f"--suggest: no step of the workload fits under the policy's largest "
            f"size {ceiling}"
        )
    top = max(covered)
    partition = _Partition(observed, top, budget)
    for count in range(partition.count, 0, -1):
        sizes = partition.sizes(count)
        candidate = replace(base, capture_sizes=sizes, max_capture_size=None)
        if graphs_of(candidate) <= budget:
            return candidate
    raise UsageError(
        f"--suggest: even one size captures more than {budget} graphs on this vLLM"
    )
