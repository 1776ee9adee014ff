"""The runner lane for vLLM's V1 model runner (``--lane runner --runner v1``).

Per virtual rank, the release's real V1 ``GPUModelRunner``
(:mod:`.model_runner`, its GPU work stood in for by :mod:`.standins`) under
the real ``Worker`` (:func:`~dpsim.lanes.runner.v1.worker.build_v1_worker`),
its syncs recorded as the sync lane's V1 syncs are (:mod:`.syncs`), and the
real V1 drafter (:mod:`.proposer`).
"""

from dpsim.lanes.runner.v1.worker import build_v1_worker, real_classes

__all__ = ["build_v1_worker", "real_classes"]
