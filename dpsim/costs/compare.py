"""Several policies under one workload at several DP sizes, side by side.

Why one place for it: the CLI, the report files and the tests all need the
same comparison, and the comparison is the product (a single policy's
figures mean little without a baseline beside them). Rows carry which way is
better, so the best value of each row can be marked wherever it is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dpsim.errors import UsageError
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.scenarios.run import PolicyRefused
from dpsim.targets.load import Target

from .figures import PolicyCost, StepCost, summarise
from .measure import graph_count, measure
from .workload import Workload

__all__ = [
    "ROWS",
    "Comparison",
    "NamedPolicy",
    "NothingMeasured",
    "Row",
    "best_columns",
    "compare",
]


class NothingMeasured(UsageError):
    """No step of a run finished (the target hung or crashed in its first sync)."""


@dataclass(frozen=True)
class NamedPolicy:
    name: str
    policy: CapturePolicy
    #: Where it came from: a file path, or how it was made ("suggested ...").
    origin: str


@dataclass(frozen=True)
class Row:
    """One figure of the side-by-side table."""

    label: str
    value: Callable[[PolicyCost], float]
    #: "low" or "high" is better; None: descriptive, no best.
    better: str | None
    percent: bool = True


ROWS: tuple[Row, ...] = (
    Row("graphs captured", lambda c: c.graphs, "low", percent=False),
    Row("padding, all tokens", lambda c: c.padding_overall, "low"),
    Row("padding per step, mean", lambda c: c.padding_mean, "low"),
    Row("padding per step, p50", lambda c: c.padding_p50, "low"),
    Row("padding per step, p99", lambda c: c.padding_p99, "low"),
    Row("steps FULL", lambda c: c.mode_share(CudagraphMode.FULL), "high"),
    Row("steps PIECEWISE", lambda c: c.mode_share(CudagraphMode.PIECEWISE), None),
    Row("steps eager", lambda c: c.mode_share(CudagraphMode.NONE), "low"),
    Row("steps DP padding dominates", lambda c: c.dp_dominated, None),
)


def best_columns(
    row: Row, costs: Sequence[PolicyCost], unsafe: Sequence[str] = ()
) -> set[int]:
    """Indexes of the best value(s) of ``row``; ties are all best; none if all equal.

    Only safe policies compete: a policy in ``unsafe`` (it broke a property)
    is never best, however cheap, and its value does not stop a safe policy
    from being best.
    """
    if row.better is None:
        return set()
    values = {
        i: row.value(cost) for i, cost in enumerate(costs) if cost.policy not in unsafe
    }
    if len(values) < 2:
        return set()
    target = min(values.values()) if row.better == "low" else max(values.values())
    best = {i for i, value in values.items() if abs(value - target) < 1e-12}
    return set() if len(best) == len(values) else best


@dataclass(frozen=True)
class Comparison:
    """Every policy's figures at every DP size, and the steps behind them."""

    target: str
    workload: str
    policies: tuple[NamedPolicy, ...]
    dp_sizes: tuple[int, ...]
    #: costs[d][p]: DP size dp_sizes[d], policy policies[p].
    costs: tuple[tuple[PolicyCost, ...], ...]
    steps: tuple[tuple[tuple[StepCost, ...], ...], ...]
    #: Simulator outcomes other than "ok", as lines for the reader.
    notes: tuple[str, ...] = ()
    #: Policies that broke a property (:mod:`.safety`): never marked best.
    unsafe: tuple[str, ...] = ()


def compare(
    target: Target,
    policies: Sequence[NamedPolicy],
    workloads: Sequence[Workload],
) -> Comparison:
    """Measure every policy on every workload (one per DP size)."""
    costs, steps, notes = [], [], []
    for workload in workloads:
        row_costs, row_steps = [], []
        for named in policies:
            try:
                measured = measure(target, named.policy, workload)
                graphs = graph_count(target, named.policy, workload.dp_size)
            except PolicyRefused as refused:
                raise UsageError(
                    f"{named.origin}: refused by {target.label}'s manager: {refused}"
                ) from None
            if measured.outcome != "ok":
                notes.append(
                    f"{named.name} at DP {workload.dp_size}: the run ended in "
                    f"{measured.outcome}; {measured.unfinished} step(s) not counted"
                )
            if not measured.steps:
                raise NothingMeasured(
                    f"{named.name} at DP {workload.dp_size}: no step finished "
                    f"({measured.outcome}); see the safety section"
                )
            row_costs.append(
                summarise(
                    named.name,
                    workload.dp_size,
                    graphs,
                    measured.steps,
                    measured.unfinished,
                )
            )
            row_steps.append(measured.steps)
        costs.append(tuple(row_costs))
        steps.append(tuple(row_steps))
        if workload.idle_note is not None:
            notes.append(workload.idle_note)
    return Comparison(
        target=target.label,
        workload=workloads[0].name if workloads else "",
        policies=tuple(policies),
        dp_sizes=tuple(w.dp_size for w in workloads),
        costs=tuple(costs),
        steps=tuple(steps),
        notes=tuple(notes),
    )
