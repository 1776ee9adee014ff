"""Capture policies' files, the real tables vLLM builds from them, and adversarial ones.

The policy itself is shared vocabulary (:mod:`dpsim.records.policy`);
:mod:`~dpsim.capture.policy_files` reads and writes it as JSON or TOML;
:mod:`~dpsim.capture.table` reads what a loaded vLLM version's own manager
made of it; :mod:`~dpsim.capture.contract` dispatches over arbitrary tables by
the manager's documented contract alone, so DP-sync code can be tested against
tables no current release builds; and :mod:`~dpsim.capture.strategies`
generates policies for property tests.
"""

from dpsim.capture.contract import ContractManager, descriptor_tables, is_compatible
from dpsim.capture.policy_files import load_policy
from dpsim.capture.table import CaptureTable, TableRow, candidates_for, capture_table

__all__ = [
    "CaptureTable",
    "ContractManager",
    "TableRow",
    "candidates_for",
    "capture_table",
    "descriptor_tables",
    "is_compatible",
    "load_policy",
]
