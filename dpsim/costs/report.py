"""The comparison as text and JSON: what ``dpsim policy validate`` prints.

Rendering lives apart from measuring (as in :mod:`dpsim.report`), so the same
:class:`~dpsim.costs.compare.Comparison` feeds the terminal, ``--json`` and
the HTML report without any of them recomputing a figure.
"""

from __future__ import annotations

from typing import Any

from .compare import ROWS, Comparison, Row, best_columns
from .figures import PolicyCost

__all__ = [
    "FIGURE_NOTES",
    "cell",
    "comparison_dict",
    "render_comparison",
    "unsafe_mark",
]

#: What each figure means, printed under the table and in the HTML report.
FIGURE_NOTES = (
    "padding = tokens run beyond real work, as a share of real tokens "
    "(idle ranks' dummy batches count as padding)",
    "per step: each step's padding share, then mean / median / 99th percentile "
    "(nearest rank) over steps",
    "steps FULL / PIECEWISE / eager: the graph mode the ranks ran the step in",
    "DP padding dominates: sum(min(ran, M) - real) > sum(max(ran - M, 0)) over "
    "ranks, M the step's largest batch, i.e. raising ranks to the largest batch "
    "costs more than rounding that batch up to a graph",
    "graphs captured: descriptors in the real manager's table (drafter's "
    "included): the memory proxy",
)


def cell(row: Row, cost: PolicyCost) -> str:
    value = row.value(cost)
    return f"{value:.1%}" if row.percent else f"{value:g}"


def unsafe_mark(comparison: Comparison, name: str) -> str:
    """What follows an unsafe policy's name wherever it is listed."""
    if name not in comparison.unsafe:
        return ""
    return " (UNSAFE: broke a property, see safety; never marked best)"


def render_comparison(comparison: Comparison) -> str:
    names = [named.name for named in comparison.policies]
    label_width = max(len(row.label) for row in ROWS) + 2
    widths = [max(len(name), 9) + 1 for name in names]
    lines = [
        f"costs on {comparison.target}, workload {comparison.workload} "
        "(* = best in its row among the safe policies)"
    ]
    for named in comparison.policies:
        lines.append(
            f"  {named.name}: {named.origin}{unsafe_mark(comparison, named.name)}"
        )
    for dp_size, costs in zip(comparison.dp_sizes, comparison.costs, strict=True):
        lines.append("")
        header = f"DP {dp_size} ({costs[0].steps} steps)".ljust(label_width)
        lines.append(
            header + "".join(n.rjust(w) for n, w in zip(names, widths, strict=True))
        )
        for row in ROWS:
            best = best_columns(row, costs, comparison.unsafe)
            cells = [
                (cell(row, cost) + ("*" if i in best else " ")).rjust(width)
                for i, (cost, width) in enumerate(zip(costs, widths, strict=True))
            ]
            lines.append(("  " + row.label).ljust(label_width) + "".join(cells))
    lines.append("")
    lines.extend(f"  {note}" for note in FIGURE_NOTES)
    if comparison.notes:
        lines.append("")
        lines.extend(f"note: {note}" for note in comparison.notes)
    return "\n".join(lines)


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    return {
        "target": comparison.target,
        "workload": comparison.workload,
        "policies": [
            {
                "name": named.name,
                "origin": named.origin,
                "policy": named.policy.to_dict(),
            }
            for named in comparison.policies
        ],
        "costs": [
            {
                "policy": cost.policy,
                "dp_size": cost.dp_size,
                "steps": cost.steps,
                "unfinished_steps": cost.unfinished_steps,
                "graphs": cost.graphs,
                "real_tokens": cost.real_tokens,
                "padded_tokens": cost.padded_tokens,
                "dp_padding_tokens": cost.dp_padding_tokens,
                "graph_padding_tokens": cost.graph_padding_tokens,
                "padding_overall": round(cost.padding_overall, 6),
                "padding_mean": round(cost.padding_mean, 6),
                "padding_p50": round(cost.padding_p50, 6),
                "padding_p99": round(cost.padding_p99, 6),
                "mode_shares": {m: round(s, 6) for m, s in cost.mode_shares},
                "dp_dominated": round(cost.dp_dominated, 6),
            }
            for costs in comparison.costs
            for cost in costs
        ],
        "notes": list(comparison.notes),
        "unsafe": list(comparison.unsafe),
    }
