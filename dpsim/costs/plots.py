"""Pictures of a comparison, and a self-contained HTML report around them.

Why pictures: a table of percentages per DP size per policy is hard to read
at a glance, while "this policy's curve sits below that one's for small
batches" is seen at once. The HTML report inlines the PNGs (base64) so it is
one file a person can attach to a review.

matplotlib runs on its non-interactive Agg backend: no display is needed.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

from dpsim.records.policy import CudagraphMode

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.ticker import ScalarFormatter

from .compare import ROWS, Comparison, best_columns
from .figures import StepCost
from .report import FIGURE_NOTES, cell, unsafe_mark

__all__ = ["padding_by_batch_size", "write_html", "write_plots"]

_MODE_COLOURS = (
    (CudagraphMode.FULL, "FULL graph", "#2b8a3e"),
    (CudagraphMode.PIECEWISE, "PIECEWISE graph", "#4dabf7"),
    (CudagraphMode.NONE, "eager", "#e8590c"),
    ("mixed", "ranks disagree", "#212529"),
)


#: Bins per doubling of the batch size in the padding plot.
_BINS_PER_OCTAVE = 3


def padding_by_batch_size(
    steps: Sequence[StepCost],
) -> list[tuple[float, float, float]]:
    """(bin, padding share, graph-padding share) over steps binned by largest batch.

    Bins are a third of a doubling wide (labelled by their lower edge), and
    shares are token-weighted within a bin, so one tiny step does not swamp
    its bin.
    """
    padded: dict[int, list[int]] = {}
    for step in steps:
        index = math.floor(_BINS_PER_OCTAVE * math.log2(max(step.batch_size, 1)))
        sums = padded.setdefault(index, [0, 0, 0])
        sums[0] += step.padding
        sums[1] += step.graph_padding
        sums[2] += step.real_tokens
    return [
        (2 ** (index / _BINS_PER_OCTAVE), total / real, graph / real)
        for index, (total, graph, real) in sorted(padded.items())
    ]


def _padding_figure(comparison: Comparison, path: Path) -> None:
    columns = len(comparison.dp_sizes)
    figure, axes = plt.subplots(
        1, columns, figsize=(5.2 * columns, 4.6), sharey=True, squeeze=False
    )
    for column, dp_size in enumerate(comparison.dp_sizes):
        ax = axes[0][column]
        for index, named in enumerate(comparison.policies):
            points = padding_by_batch_size(comparison.steps[column][index])
            colour = f"C{index}"
            sizes = [size for size, _, _ in points]
            ax.plot(
                sizes,
                [share * 100 for _, share, _ in points],
                marker="o",
                markersize=3,
                color=colour,
                label=f"{named.name}",
            )
            ax.plot(
                sizes,
                [graph * 100 for _, _, graph in points],
                linestyle="--",
                color=colour,
                label=f"{named.name}, graph padding",
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        # Shares run from 0 (eager, exact fits) to thousands of percent (a
        # 1-token step padded to a large graph on many ranks): log above 1%.
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(f"DP {dp_size}")
        ax.set_xlabel("largest per-rank batch of the step (tokens, binned)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("padding (% of real tokens)")
    handles, names = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=3, fontsize="small")
    figure.suptitle(
        f"Padding against batch size, workload {comparison.workload} "
        "(solid: all padding; dashed: graph padding only)"
    )
    rows = -(-len(handles) // 3)
    figure.tight_layout(rect=(0, 0.05 + 0.05 * rows, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _modes_figure(comparison: Comparison, path: Path) -> None:
    columns = len(comparison.dp_sizes)
    rows = len(comparison.policies)
    figure, axes = plt.subplots(
        1,
        columns,
        figsize=(5.2 * columns, 1.8 + 0.5 * rows),
        sharey=True,
        squeeze=False,
    )
    labels = [
        f"{named.name} ({cost.graphs} graphs)"
        for named, cost in zip(comparison.policies, comparison.costs[0], strict=True)
    ]
    for column, dp_size in enumerate(comparison.dp_sizes):
        ax = axes[0][column]
        left = [0.0] * rows
        for mode, label, colour in _MODE_COLOURS:
            shares = [cost.mode_share(mode) * 100 for cost in comparison.costs[column]]
            if not any(shares) and mode == "mixed":
                continue
            ax.barh(labels, shares, left=left, color=colour, label=label)
            left = [a + b for a, b in zip(left, shares, strict=True)]
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of steps")
        ax.set_title(f"DP {dp_size}")
    # The axes share y: inverting one inverts all (twice would undo it).
    axes[0][0].invert_yaxis()
    handles, names = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=4, fontsize="small")
    figure.suptitle("How steps ran")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(comparison: Comparison, out: Path) -> tuple[Path, Path]:
    """``padding.png`` and ``modes.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    padding, modes = out / "padding.png", out / "modes.png"
    _padding_figure(comparison, padding)
    _modes_figure(comparison, modes)
    return padding, modes


def _table_html(comparison: Comparison) -> str:
    parts = []
    names = "".join(
        f"<th class='unsafe'>{html.escape(n.name)} (unsafe)</th>"
        if n.name in comparison.unsafe
        else f"<th>{html.escape(n.name)}</th>"
        for n in comparison.policies
    )
    for dp_size, costs in zip(comparison.dp_sizes, comparison.costs, strict=True):
        parts.append(
            f"<h3>DP {dp_size} ({costs[0].steps} steps)</h3>"
            f"<table><tr><th>figure</th>{names}</tr>"
        )
        for row in ROWS:
            best = best_columns(row, costs, comparison.unsafe)
            cells = "".join(
                f"<td class='best'>{cell(row, cost)}</td>"
                if i in best
                else f"<td>{cell(row, cost)}</td>"
                for i, cost in enumerate(costs)
            )
            parts.append(f"<tr><th>{html.escape(row.label)}</th>{cells}</tr>")
        parts.append("</table>")
    return "\n".join(parts)


_STYLE = """
body { font-family: sans-serif; max-width: 70em; margin: 2em auto; color: #212529; }
table { border-collapse: collapse; margin-bottom: 1em; }
th, td { border: 1px solid #ced4da; padding: 0.25em 0.6em; text-align: right; }
th:first-child { text-align: left; }
td.best { background: #d3f9d8; font-weight: bold; }
th.unsafe { background: #ffe3e3; }
.verdict { font-size: 1.2em; font-weight: bold; }
pre { background: #f1f3f5; padding: 0.8em; overflow-x: auto; }
img { max-width: 100%; }
"""


def write_html(
    comparison: Comparison, safety_text: str, images: Sequence[Path], out: Path
) -> Path:
    """``report.html`` under ``out``: safety verdicts first (a cost means
    nothing for a policy that hangs), then tables and inlined images."""
    figures = "\n".join(
        "<img alt='{}' src='data:image/png;base64,{}'>".format(
            html.escape(image.stem),
            base64.b64encode(image.read_bytes()).decode("ascii"),
        )
        for image in images
    )
    policies = "".join(
        f"<li><b>{html.escape(n.name)}</b>: {html.escape(n.origin)}"
        f"{html.escape(unsafe_mark(comparison, n.name))}</li>"
        for n in comparison.policies
    )
    if comparison.unsafe:
        verdict = "Unsafe: " + ", ".join(comparison.unsafe) + " broke a property."
    else:
        verdict = "No policy broke a property in the cases run."
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in FIGURE_NOTES)
    extra = "".join(f"<li>{html.escape(note)}</li>" for note in comparison.notes)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>dpsim policy report</title>
<style>{_STYLE}</style></head>
<body>
<h1>Capture policies on {html.escape(comparison.target)}</h1>
<ul>{policies}</ul>
<h2>Safety</h2>
<p class='verdict'>{html.escape(verdict)}</p>
<pre>{html.escape(safety_text)}</pre>
<h2>Costs</h2>
<p>Workload: {html.escape(comparison.workload)}. Best value in each row in green,
among the policies that broke no property: an unsafe policy is never best.</p>
{_table_html(comparison)}
<ul>{notes}{extra}</ul>
{figures}
</body>
</html>
"""
    path = out / "report.html"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
