"""Capture policies, the real tables vLLM builds from them, and adversarial ones.

:mod:`~dpsim.capture.policy` is the operator's side (a validated, file-backed
policy); :mod:`~dpsim.capture.table` reads what a loaded vLLM version's own
manager made of it; :mod:`~dpsim.capture.contract` dispatches over arbitrary
tables by the manager's documented contract alone, so DP-sync code can be
tested against tables no current release builds; and
:mod:`~dpsim.capture.strategies` generates policies for property tests.
"""

from dpsim.capture.contract import ContractManager, descriptor_tables, is_compatible
from dpsim.capture.policy import (
    ALL_CAPABILITIES,
    NO_CAPABILITIES,
    Capabilities,
    CapturePolicy,
    Microbatching,
    PolicyError,
    load_policy,
    vllm_default_max_capture_size,
    vllm_default_sizes,
)
from dpsim.capture.table import CaptureTable, TableRow, candidates_for, capture_table

__all__ = [
    "ALL_CAPABILITIES",
    "NO_CAPABILITIES",
    "Capabilities",
    "CapturePolicy",
    "CaptureTable",
    "ContractManager",
    "Microbatching",
    "PolicyError",
    "TableRow",
    "candidates_for",
    "capture_table",
    "descriptor_tables",
    "is_compatible",
    "load_policy",
    "vllm_default_max_capture_size",
    "vllm_default_sizes",
]
