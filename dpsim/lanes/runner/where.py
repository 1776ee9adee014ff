"""Where in vLLM's source a running rank is, and which of its lines ran.

The runner lane runs real vLLM code compiled from release files (or a tree)
under their real names, mixed with dpsim's own frames (stand-ins, the
simulator). Which frames are vLLM's is decided by the code object's file name
against a registry that :func:`~dpsim.lanes.runner.extract.real_class` and the
module loads fill (:func:`~dpsim.boundary.register_file`): a path match by name
(``.../vllm/...``) could take dpsim's own or an installed vLLM's files for the
target's.

:class:`LineCoverage` counts which lines of chosen vLLM functions ran
(``dpsim targets --lane runner`` shows it): what the lane really exercises of
each real method, against what it could.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

from dpsim.boundary import (
    display_name,
    frame_location,
    is_vllm_file,
    register_file,
    shown_name,
    vllm_location,
    vllm_stack,
)

# vLLM's files are every lane's (dpsim.boundary tells whose an error is by
# them); the lane's modules and tests keep importing them from here.
__all__ = [
    "FunctionCoverage",
    "LineCoverage",
    "display_name",
    "frame_location",
    "is_vllm_file",
    "register_file",
    "vllm_location",
    "vllm_stack",
]


@dataclass(frozen=True)
class FunctionCoverage:
    """One function's lines: those that can run and those that ran (its
    nested functions, lambdas and comprehensions counted as its own)."""

    filename: str
    name: str
    first_line: int
    executable: frozenset[int]
    executed: frozenset[int]

    @property
    def shown(self) -> str:
        """``v1/worker/gpu/model_runner.py:1764 GPUModelRunner.execute_model``."""
        where = shown_name(self.filename) or Path(self.filename).name
        return f"{where}:{self.first_line} {self.name}"

    @property
    def missed(self) -> frozenset[int]:
        return self.executable - self.executed


class LineCoverage:
    """Which lines of ``codes`` (function code objects, e.g. a rebuilt class's
    ``DPSIM_ORIGIN.codes()``) run inside ``with coverage:``.

    Measured by dpsim's target coverage (:mod:`dpsim.coverage`, coverage.py
    over the codes' files, every virtual rank's greenlet included), read per
    function: a line counts when a frame was on it, the line a call starts
    on included. A frame already running when the block starts is not
    counted. Executable lines come from each code object's ``co_lines()``.
    """

    def __init__(self, codes: Iterable[CodeType]) -> None:
        from dpsim.coverage import Scope, measure

        #: Each traced code object -> the given function it belongs to.
        self._root: dict[CodeType, CodeType] = {}
        self._roots: list[CodeType] = []
        for code in codes:
            if code in self._root:
                continue  # nested in one given earlier, or given twice
            self._roots.append(code)
            for part in (code, *_nested(code)):
                self._root.setdefault(part, code)
        files = dict.fromkeys(code.co_filename for code in self._roots)
        self._measurement = measure(
            Scope(name, shown_name(name) or Path(name).name) for name in files
        )
        self._running: Any = None

    def __enter__(self) -> LineCoverage:
        self._running = self._measurement.running()
        self._running.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._running.__exit__(*exc_info)

    def functions(self) -> list[FunctionCoverage]:
        """Every given function, in the order given."""
        found = []
        for code in self._roots:
            lines = _lines(code)
            found.append(
                FunctionCoverage(
                    filename=code.co_filename,
                    name=code.co_qualname,
                    first_line=code.co_firstlineno,
                    executable=frozenset(lines),
                    executed=frozenset(
                        self._measurement.lines_run(code.co_filename) & lines
                    ),
                )
            )
        return found


def _nested(code: CodeType) -> Iterator[CodeType]:
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield constant
            yield from _nested(constant)


def _lines(code: CodeType) -> set[int]:
    return {
        line
        for part in (code, *_nested(code))
        for _, _, line in part.co_lines()
        if line is not None
    }
