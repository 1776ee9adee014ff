"""Running coverage.py over the target's files while dpsim runs them.

coverage.py's C tracer, with branch (arc) measurement, ``include`` narrowed
to the scoped files (a call into any other file costs one cached look-up of
its name and is not traced further), and greenlet support on, so each virtual
rank's frames keep their own arcs when the simulator switches between ranks.
Target code is compiled by dpsim from the real files with their real names
(:mod:`dpsim.targets.shim`, the V1 caller, the runner lane's ``real_class``),
so the traced names are the files on disk. Data stays in memory (no
``.coverage`` file); each (scenario, profile) is a coverage.py dynamic
context, so one run gives the totals and each context's share.

Cost, measured on 0.33.0 as interleaved runs of the same ``run_check`` in one
process, with and without a measurement, in CPU time (the machine was shared):
the ``step`` scenario at 2..16 ranks, 100 examples x 6 seeds, took 1.39x
(+3.5 ms per case) on V2 and 1.97x (+10.9 ms per case; 4 seeds) on V1. Only
a case's run of the target is traced, which on its own runs 2.1x slower
(Python 3.11's trace hook sends every call of the simulator and the target
to the tracer; coverage.py's greenlet support adds about 0.3x of that, and is
needed: ranks switch inside the target's frames). Starting and stopping the
tracer per case costs about 0.13 ms. Scoping does not change the cost: the
same runs traced with an ``include`` that matches no file cost the same
(2.07x against 2.13x on V2, 2.66x against 2.81x on V1), so it is the hook
itself, paid by the simulator's calls; Python 3.12's ``sys.monitoring`` (which
coverage.py can use there) is what would cut it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType

import coverage

from .marks import Unreachable
from .result import Contexts, CoverageResult
from .scope import Arc, Scope, analyse, combined

#: coverage.py's warnings that say nothing about the target (a scoped file
#: the run never entered; another tracer, say a debugger, was set).
_QUIET = [
    "no-data-collected",
    "module-not-imported",
    "module-not-measured",
    "already-imported",
    "trace-changed",
]
_SEPARATOR = "\t"


class Measurement:
    """coverage.py over ``scopes``: traced inside :meth:`running` blocks, read
    by :meth:`result` (or at the end of a ``with`` block)."""

    def __init__(
        self, scopes: Iterable[Scope], marks: tuple[Unreachable, ...] | None = None
    ) -> None:
        self.scopes = combined(scopes)
        for scope in self.scopes:
            analyse(scope)  # a bad scope is refused before anything runs
        self.marks = marks
        self._context: tuple[str, str] | None = None
        self._contexts: Contexts | None = None
        self._touched: dict[str, frozenset[int]] = {}
        paths = sorted({os.path.realpath(scope.path) for scope in self.scopes})
        self._coverage: coverage.Coverage | None = coverage.Coverage(
            data_file=None,
            branch=True,
            include=paths,
            concurrency=["greenlet"],
            config_file=False,
        )
        self._coverage.set_option("run:disable_warnings", _QUIET)

    def __enter__(self) -> Measurement:
        return self

    @contextmanager
    def running(self, scenario: str = "", profile: str = "") -> Iterator[None]:
        """Trace the block, counting what runs to ``(scenario, profile)``.

        Tracing is on only inside such blocks (one case's run, say): Python
        3.11's trace hook costs every call in the process, Hypothesis drawing
        the next case included, so a whole search traced costs about twice
        what it costs to trace only the cases' runs. Another coverage.py
        measurement (pytest-cov) is paused for the block and resumed; a
        debugger's tracer is not put back (coverage.py's C tracer, stopped,
        clears the hook on the next event it still receives).
        """
        measured = self._coverage
        if measured is None:
            raise RuntimeError("Measurement.running() after its result was taken")
        if not self.scopes:
            # Nothing to measure (coverage.py would take no include as all files).
            yield
            return
        measured.start()
        try:
            if self._context != (scenario, profile):
                self._context = (scenario, profile)
                measured.switch_context(f"{scenario}{_SEPARATOR}{profile}")
            yield
        finally:
            measured.stop()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._finish()

    def _finish(self) -> Contexts:
        if self._contexts is None:
            assert self._coverage is not None
            self._contexts = self._harvest(self._coverage)
            self._coverage = None
        return self._contexts

    def _harvest(self, measured: coverage.Coverage) -> Contexts:
        data = measured.get_data()
        by_real = {os.path.realpath(scope.path): scope for scope in self.scopes}
        contexts: Contexts = {}
        for name in sorted(data.measured_contexts()):
            scenario, _, profile = name.partition(_SEPARATOR)
            data.set_query_context(name)
            files: dict[str, tuple[frozenset[int], frozenset[Arc]]] = {}
            for filename in sorted(data.measured_files()):
                scope = by_real.get(os.path.realpath(filename))
                if scope is not None:
                    files[scope.path] = analyse(scope).executed(
                        data.lines(filename) or (), data.arcs(filename) or ()
                    )
            contexts[(scenario, profile)] = files
        data.set_query_contexts(None)
        for filename in data.measured_files():
            scope = by_real.get(os.path.realpath(filename))
            if scope is not None:
                self._touched[scope.path] = frozenset(
                    _touched(data.arcs(filename) or ())
                )
        return contexts

    def lines_run(self, path: str) -> frozenset[int]:
        """Every line of ``path`` a frame was on while traced: where each
        call started (a function's first line, a generator's resumption) and
        every line it went to, before the mapping to statements :meth:`result`
        makes (what a code object's ``co_lines()`` can be compared with)."""
        self._finish()
        return self._touched.get(path, frozenset())

    def result(self, version: str | None) -> CoverageResult:
        """What the ``running`` blocks executed; no block runs after this."""
        return CoverageResult.of(self.scopes, version, self._finish(), self.marks)


def _touched(arcs: Iterable[Arc]) -> Iterator[int]:
    for start, end in arcs:
        # A negative start is a call of the code object starting on that line;
        # a negative end, a return (its line is not run again).
        yield abs(start)
        if end > 0:
            yield end


def measure(
    scopes: Iterable[Scope], marks: tuple[Unreachable, ...] | None = None
) -> Measurement:
    """A context manager measuring target coverage of ``scopes``."""
    return Measurement(scopes, marks)
