"""``dpsim diff``: what a change does to DP behaviour, on the same generated cases.

One module per job: :mod:`.sides` resolves the two target specs,
:mod:`.outcome` is a case's observable outcome on one side and the kinds of
difference between two, :mod:`.search` runs the same cases on both sides and
shrinks each kind, :mod:`.report` prints it and writes a case file per kind.
Only the sync lane exists: every side runs on the simulator, as ``check`` does.
"""

from .outcome import KINDS, Observed, differences
from .search import DiffOptions, DiffReport, run_diff
from .sides import Sides, parse_sides

__all__ = [
    "KINDS",
    "DiffOptions",
    "DiffReport",
    "Observed",
    "Sides",
    "differences",
    "parse_sides",
    "run_diff",
]
