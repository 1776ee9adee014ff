"""What one case runs: the scenarios, their per-rank programs, and case generators.

Data flows one way: a :class:`~dpsim.records.case.Case` goes into
:func:`run_case`, which returns the simulator's per-rank trace;
:mod:`dpsim.properties` judges it.
"""

from dpsim.scenarios.programs import SCENARIOS
from dpsim.scenarios.run import PolicyRefused, run_case

__all__ = ["SCENARIOS", "PolicyRefused", "run_case"]
