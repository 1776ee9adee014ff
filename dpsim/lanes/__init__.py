"""dpsim's lanes: which of vLLM's code a run drives for real.

* ``sync``: the real DP sync function (``dispatch_cg_and_sync_dp`` and its
  forms) under callers dpsim models (:mod:`dpsim.scenarios`). The default.
* ``runner``: vLLM's real engine loop, worker, model runner and speculators
  per virtual rank, GPU work stood in for (:mod:`dpsim.lanes.runner`).
"""

from __future__ import annotations

LANES = ("sync", "runner")
DEFAULT_LANE = "sync"
