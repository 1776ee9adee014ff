"""What a capture policy costs under a workload, and whether it is safe with DP.

Backs ``dpsim policy validate``: a workload (:mod:`.workload`) runs step by
step through the real target (:mod:`.measure`), per-step observations become
figures by plain arithmetic (:mod:`.figures`), several policies are set side
by side (:mod:`.compare`, :mod:`.report`, :mod:`.plots`), the property suite
judges each policy (:mod:`.safety`), and :mod:`.suggest` proposes sizes for a
budget of graphs.
"""

from dpsim.costs.compare import Comparison, NamedPolicy, compare
from dpsim.costs.figures import PolicyCost, StepCost, summarise
from dpsim.costs.measure import graph_count, measure
from dpsim.costs.workload import (
    BUILTIN_WORKLOADS,
    Workload,
    WorkloadError,
    builtin_workload,
    load_trace,
    resolve_workload,
)

__all__ = [
    "BUILTIN_WORKLOADS",
    "Comparison",
    "NamedPolicy",
    "PolicyCost",
    "StepCost",
    "Workload",
    "WorkloadError",
    "builtin_workload",
    "compare",
    "graph_count",
    "load_trace",
    "measure",
    "resolve_workload",
    "summarise",
]
