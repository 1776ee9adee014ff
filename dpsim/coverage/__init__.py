"""Target coverage: which lines and branches of the target's own code a run executed.

Not the ``coverage`` property (:mod:`dpsim.properties.coverage`, "the
descriptor can serve the rank's batch"): this is line and branch coverage of
vLLM's files as dpsim runs them (``dpsim check --coverage``), measured with
coverage.py (:mod:`.measuring`), scoped to the functions that are the target
(:mod:`.scope`, :mod:`.targets`), accounted per (scenario, profile)
(:mod:`.result`), with lines and branches no run can reach marked and listed
apart (:mod:`.marks`, :mod:`.unreachable`), shown as text, JSON and HTML
(:mod:`.render`, :mod:`.html`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .marks import Unreachable
    from .measuring import Measurement, measure
    from .result import CoverageResult, FileCoverage
    from .scope import EXIT, Scope, analyse

#: Public name -> its module; imported on first use, so a command that takes
#: ``--coverage`` but is run without it does not import coverage.py.
_LAZY = {
    "EXIT": ".scope",
    "Scope": ".scope",
    "analyse": ".scope",
    "Unreachable": ".marks",
    "Measurement": ".measuring",
    "measure": ".measuring",
    "CoverageResult": ".result",
    "FileCoverage": ".result",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_LAZY[name], __name__), name)


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
