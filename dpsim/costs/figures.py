"""The cost figures of a policy, as plain arithmetic over per-step observations.

Kept apart from running anything, so every figure can be checked by hand:
given what each rank brought to a step and what it ran, the figures follow.

Per step and rank ``r``:

- ``real[r]``   tokens of real work (0 on an idle rank);
- ``passed[r]`` tokens the rank gave the sync (an idle rank passes vLLM's
  dummy batch, so ``passed >= real``);
- ``ran[r]``    tokens of the descriptor it got back: what it runs.

Then, with ``M = max(passed)`` the largest batch of the step:

- ``padding``       = sum(ran - real): tokens run that are not real work;
- ``dp_padding``    = sum(min(ran, M) - real): tokens run only because some
  other rank has more (raising each rank to ``M``, and idle ranks' dummies);
- ``graph_padding`` = sum(max(ran - M, 0)): tokens run only because the
  chosen graph is larger than the largest batch;
- ``padding = dp_padding + graph_padding``;
- DP padding *dominates* a step when ``dp_padding > graph_padding``;
- the step's padding share is ``padding / sum(real)``.

Percentiles are nearest-rank: p of n sorted values is the
``ceil(p / 100 * n)``-th smallest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dpsim.records.policy import CudagraphMode

__all__ = ["MODES", "PolicyCost", "StepCost", "nearest_rank", "summarise"]

#: Step modes, in display order. "mixed" means ranks ran different modes,
#: which the safety check reports; here it is only counted.
MODES = (CudagraphMode.FULL, CudagraphMode.PIECEWISE, CudagraphMode.NONE, "mixed")


@dataclass(frozen=True)
class StepCost:
    """What every rank brought to one step and ran in it."""

    mode: str
    real: tuple[int, ...]
    passed: tuple[int, ...]
    ran: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        """The largest batch of the step: what the graph must cover."""
        return max(self.passed)

    @property
    def real_tokens(self) -> int:
        return sum(self.real)

    @property
    def padding(self) -> int:
        return sum(self.ran) - sum(self.real)

    @property
    def dp_padding(self) -> int:
        top = self.batch_size
        return sum(
            min(ran, top) - real for ran, real in zip(self.ran, self.real, strict=True)
        )

    @property
    def graph_padding(self) -> int:
        top = self.batch_size
        return sum(max(ran - top, 0) for ran in self.ran)

    @property
    def padding_share(self) -> float:
        return self.padding / self.real_tokens

    @property
    def dp_dominates(self) -> bool:
        return self.dp_padding > self.graph_padding


def nearest_rank(values: Sequence[float], percent: float) -> float:
    """The nearest-rank percentile (no interpolation: a value that occurred)."""
    ordered = sorted(values)
    index = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[index - 1]


@dataclass(frozen=True)
class PolicyCost:
    """One policy's figures under one workload at one DP size."""

    policy: str
    dp_size: int
    steps: int
    graphs: int
    real_tokens: int
    padded_tokens: int
    dp_padding_tokens: int
    graph_padding_tokens: int
    #: padded / real over all tokens of the run (token-weighted).
    padding_overall: float
    #: Per-step padding shares: mean, median, 99th percentile.
    padding_mean: float
    padding_p50: float
    padding_p99: float
    #: Share of steps per mode (keys: :data:`MODES`).
    mode_shares: tuple[tuple[str, float], ...]
    #: Share of steps where DP padding exceeds graph padding.
    dp_dominated: float
    #: Steps the run did not finish (a hang or crash stopped it); 0 normally.
    unfinished_steps: int = 0

    def mode_share(self, mode: str) -> float:
        return dict(self.mode_shares).get(mode, 0.0)


def summarise(
    policy: str,
    dp_size: int,
    graphs: int,
    steps: Sequence[StepCost],
    unfinished_steps: int = 0,
) -> PolicyCost:
    """The figures of ``steps`` (each with real work) as defined above."""
    if not steps:
        raise ValueError("no finished step to take figures from")
    shares = [step.padding_share for step in steps]
    real = sum(step.real_tokens for step in steps)
    padded = sum(step.padding for step in steps)
    count = len(steps)
    return PolicyCost(
        policy=policy,
        dp_size=dp_size,
        steps=count,
        graphs=graphs,
        real_tokens=real,
        padded_tokens=padded,
        dp_padding_tokens=sum(step.dp_padding for step in steps),
        graph_padding_tokens=sum(step.graph_padding for step in steps),
        padding_overall=padded / real,
        padding_mean=sum(shares) / count,
        padding_p50=nearest_rank(shares, 50),
        padding_p99=nearest_rank(shares, 99),
        mode_shares=tuple(
            (mode, sum(step.mode == mode for step in steps) / count) for mode in MODES
        ),
        dp_dominated=sum(step.dp_dominates for step in steps) / count,
        unfinished_steps=unfinished_steps,
    )
