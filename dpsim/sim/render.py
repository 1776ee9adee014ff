"""A ``SimResult`` as a table a person reads at a glance, one row per rank.

Kept apart from the trace on purpose: traces hold data for properties and
counterexample files; words and alignment are made here, on demand.
"""

from __future__ import annotations

from dpsim.records.trace import RankState, RankTrace, Signature, SimResult
from dpsim.terminal import printable

_HEADER = ("rank", "state", "group#seq", "op", "shape", "detail")


def _op(signature: Signature) -> str:
    text = (
        signature.kind if signature.op is None else f"{signature.kind}:{signature.op}"
    )
    if signature.src is not None:
        text += f"(src={signature.src})"
    return text


def _shape(signature: Signature) -> str:
    dims = "x".join(str(dim) for dim in signature.shape) or "-"
    return (
        dims
        if signature.dtype is None
        else f"{dims} {signature.dtype.removeprefix('torch.')}"
    )


def _row(trace: RankTrace) -> tuple[str, ...]:
    last = trace.collectives[-1] if trace.collectives else None
    where = "-" if last is None else f"{last.group}#{last.seq}"
    op = "-" if last is None else _op(last.signature)
    shape = "-" if last is None else _shape(last.signature)
    if trace.state is RankState.FINISHED:
        detail = f"returned {trace.returned!r}"
    elif trace.state is RankState.RAISED:
        assert trace.error is not None
        detail = f"{trace.error.type}: {trace.error.message} at {trace.error.where}"
    elif trace.state is RankState.BUDGET:
        detail = f"stopped after {trace.steps} steps"
    elif trace.waiting is None:
        detail = "blocked"
    else:
        waiting = trace.waiting
        where = f"{waiting.group}#{waiting.seq}"
        op = _op(waiting.signature)
        shape = _shape(waiting.signature)
        parts = ["in wait()" if waiting.is_async else "in the call"]
        if waiting.missing:
            parts.append(f"ranks {list(waiting.missing)} never entered")
        for peer in waiting.disagreeing:
            assert peer.entered_as is not None
            parts.append(
                f"MISMATCH: rank {peer.rank} entered "
                f"{_op(peer.entered_as)} {_shape(peer.entered_as)}"
            )
        detail = "; ".join(parts)
    if trace.state is not RankState.WAITING and last is not None:
        where = f"last {where}"  # where it was last, not where it is stuck
    return (str(trace.rank), trace.state.value, where, op, shape, detail)


def render_table(result: SimResult) -> str:
    """Outcome line, then rank | state | group#seq | op | shape | detail."""
    # Cells may hold a target's own text (an exception message): escaped.
    rows = [
        _HEADER,
        *(tuple(printable(cell) for cell in _row(trace)) for trace in result.ranks),
    ]
    widths = [
        max(len(row[column]) for row in rows) for column in range(len(_HEADER) - 1)
    ]
    lines = [f"outcome: {result.outcome.value}"]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append(" | ".join([*cells, row[-1]]).rstrip())
    for item in result.incomplete:
        state = "mismatched" if item.mismatched else "never completed"
        lines.append(
            f"{item.group}#{item.seq} {state}: entered by {list(item.entered)}, "
            f"missing {list(item.missing)}"
        )
    return "\n".join(lines)
