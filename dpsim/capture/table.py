"""What a manager actually captured, as rows a person can read.

A policy says what an operator asked for; the table is what the loaded vLLM
version made of it, read straight off the manager (V2's ``_capture_descs``,
V1's dispatcher's ``cudagraph_keys``: the real code's own output), never
recomputed here. It backs ``dpsim policy
show``, and its graph count is the memory proxy for comparing policies (each
FULL descriptor is one captured CUDA graph; each PIECEWISE descriptor one
capture of the piecewise-compiled model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpsim.records.policy import CudagraphMode

__all__ = ["CaptureTable", "TableRow", "candidates_for", "capture_table"]


@dataclass(frozen=True)
class TableRow:
    """One captured descriptor, version-neutral (absent fields read as neutral)."""

    mode: str
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None
    max_query_len: int | None
    loras: int
    ubatches: int

    @classmethod
    def of(cls, desc: Any) -> TableRow:
        return cls(
            mode=_mode_name(desc.cg_mode),
            num_tokens=desc.num_tokens,
            num_reqs=desc.num_reqs,
            uniform_token_count=getattr(desc, "uniform_token_count", None),
            max_query_len=getattr(desc, "max_query_len", None),
            loras=getattr(desc, "num_active_loras", 0),
            ubatches=getattr(desc, "num_ubatches", 1),
        )


def _mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", mode))


_COLUMNS = (
    ("mode", "mode"),
    ("num_tokens", "tokens"),
    ("num_reqs", "reqs"),
    ("uniform_token_count", "uniform"),
    ("max_query_len", "max_q"),
    ("loras", "loras"),
    ("ubatches", "ubatches"),
)


@dataclass(frozen=True)
class CaptureTable:
    """A manager's captured descriptors, per mode, in the manager's own order.

    ``descriptors`` keeps the manager's own objects (for comparing with
    dispatch results); ``rows`` is the neutral form for display and diffing.
    Modes are listed FULL before PIECEWISE, the order dispatch prefers them.
    """

    descriptors: tuple[tuple[str, tuple[Any, ...]], ...]

    def by_mode(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.descriptors)

    @property
    def rows(self) -> tuple[TableRow, ...]:
        return tuple(TableRow.of(d) for _, descs in self.descriptors for d in descs)

    @property
    def graph_count(self) -> int:
        """Descriptors captured, all modes: the memory proxy."""
        return sum(len(descs) for _, descs in self.descriptors)

    def graph_counts(self) -> dict[str, int]:
        return {mode: len(descs) for mode, descs in self.descriptors}

    def render(self) -> str:
        """Plain text, one row per descriptor; ``-`` for a field left unset."""
        header = [title for _, title in _COLUMNS]
        body = [
            [
                "-" if getattr(row, name) is None else str(getattr(row, name))
                for name, _ in _COLUMNS
            ]
            for row in self.rows
        ]
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

        def line(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest]).rstrip()

        counts = ", ".join(f"{m} {n}" for m, n in self.graph_counts().items())
        summary = f"{self.graph_count} graphs" + (f" ({counts})" if counts else "")
        return "\n".join([line(header), *(line(r) for r in body), summary]) + "\n"


def _mode_rank(name: str) -> tuple[int, str]:
    order: dict[str, int] = {CudagraphMode.FULL: 0, CudagraphMode.PIECEWISE: 1}
    return (order.get(name, 2), name)


def capture_table(manager: Any) -> CaptureTable:
    """The table a real (or contract) manager captured, read off the manager."""
    if not hasattr(manager, "_capture_descs") and hasattr(manager, "cudagraph_keys"):
        return _dispatcher_table(manager)
    capture_descs: Mapping[Any, Any] = getattr(manager, "_capture_descs", None) or {}
    per_mode = sorted(
        ((_mode_name(mode), tuple(descs)) for mode, descs in capture_descs.items()),
        key=lambda item: _mode_rank(item[0]),
    )
    return CaptureTable(descriptors=tuple(per_mode))


@dataclass(frozen=True)
class _DispatcherKey:
    """A V1 dispatcher's key as a row reads it. vLLM's ``BatchDescriptor``
    carries no mode (the dispatcher files it under one) and says a key is a
    uniform decode with a flag: the length is the dispatcher's."""

    cg_mode: str
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None
    num_active_loras: int


def _dispatcher_table(dispatcher: Any) -> CaptureTable:
    """The keys a V1 ``CudagraphDispatcher`` captured, per mode, in size order
    (vLLM keeps them in sets)."""
    per_mode = []
    for mode, keys in dispatcher.cudagraph_keys.items():
        rows = sorted(
            (_key_row(_mode_name(mode), key, dispatcher) for key in keys),
            key=lambda row: (row.num_tokens, row.num_reqs or 0, row.num_active_loras),
        )
        if rows:
            per_mode.append((_mode_name(mode), tuple(rows)))
    per_mode.sort(key=lambda item: _mode_rank(item[0]))
    return CaptureTable(descriptors=tuple(per_mode))


def _key_row(mode: str, key: Any, dispatcher: Any) -> _DispatcherKey:
    # 0.11-0.12 name the flag uniform_decode; LoRA is a flag before 0.17.
    uniform = getattr(key, "uniform", getattr(key, "uniform_decode", False))
    loras = getattr(key, "num_active_loras", int(getattr(key, "has_lora", False)))
    return _DispatcherKey(
        cg_mode=mode,
        num_tokens=key.num_tokens,
        num_reqs=getattr(key, "num_reqs", None),
        uniform_token_count=dispatcher.uniform_decode_query_len if uniform else None,
        num_active_loras=loras,
    )


def candidates_for(
    manager: Any, num_tokens: int, num_active_loras: int = 0
) -> tuple[Any, ...]:
    """The real manager's own priority-ordered candidates for a token count.

    The candidate store changed shape across releases: a list indexed by token
    count (0.18-0.23) and a dict keyed by (tokens, LoRA case) (0.24+). This
    reads either; the LoRA case is the captured one, not an active count.
    """
    candidates = getattr(manager, "_candidates", None)
    if isinstance(candidates, list):
        if num_active_loras != 0:
            return ()
        return (
            tuple(candidates[num_tokens]) if 0 <= num_tokens < len(candidates) else ()
        )
    if isinstance(candidates, Mapping):
        return tuple(candidates.get((num_tokens, num_active_loras), ()))
    return ()
