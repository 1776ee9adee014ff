"""The process groups' names, as both lanes, scenarios and traces spell them.

A collective's record names its group, and each group numbers its own
collectives, so ``dp_cpu#3`` and ``dp_device#3`` are unrelated, as two
communicators are in a real deployment. The simulator declares these groups
over virtual ranks, the real lane over real processes; both must use the same
names for their traces to compare field by field.
"""

from __future__ import annotations

#: torch's default group: collectives called with ``group=None``.
WORLD_GROUP = "world"
#: ``get_dp_group().cpu_group``: the gloo group vLLM's DP sync all-reduces over.
DP_CPU_GROUP = "dp_cpu"
#: ``get_dp_group().device_group``: the NCCL group of the DP coordinator.
DP_DEVICE_GROUP = "dp_device"
#: The expert-parallel group scenarios use to model the forward pass's MoE
#: collectives (dispatch / combine), which hang when ranks disagree.
EP_GROUP = "ep"

#: Every group a run has unless told otherwise, in the order traces list them.
DEFAULT_GROUP_NAMES = (WORLD_GROUP, DP_CPU_GROUP, DP_DEVICE_GROUP, EP_GROUP)

#: The engine core's own stateless DP group (``DPEngineCoreProc.dp_group``),
#: over which the runner lane's real engine loop all-reduces its unfinished
#: requests (``ParallelConfig.sync_dp_state``). Not a default group: only the
#: runner lane declares it, so the sync lane's traces list the groups they did.
ENGINE_DP_GROUP = "engine_dp"
