"""Target coverage: which lines and branches of the target's own code a run executed.

Not the ``coverage`` property (:mod:`dpsim.properties.coverage`, "the
descriptor can serve the rank's batch"): this is line and branch coverage of
vLLM's files as dpsim runs them (``dpsim check --coverage``), measured with
coverage.py (:mod:`.measure`), scoped to the functions that are the target
(:mod:`.scope`, :mod:`.targets`), accounted per (scenario, profile)
(:mod:`.result`), with lines and branches no run can reach marked and listed
apart (:mod:`.marks`, :mod:`.unreachable`), shown as text, JSON and HTML
(:mod:`.render`, :mod:`.html`).
"""

from __future__ import annotations

from .marks import Unreachable
from .measure import Measurement, measure
from .result import CoverageResult, FileCoverage
from .scope import EXIT, Scope, analyse

__all__ = [
    "EXIT",
    "CoverageResult",
    "FileCoverage",
    "Measurement",
    "Scope",
    "Unreachable",
    "analyse",
    "measure",
]
