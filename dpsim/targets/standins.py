"""Faithful stand-ins for the vLLM names whose behaviour DP-sync code depends on.

Each one defers to the installed :mod:`~dpsim.targets.runtime` world at call
time, so the same loaded target runs on virtual ranks, on real process groups,
or (for manager building and introspection) on no ranks at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dpsim.targets import runtime
from dpsim.targets.manager import ParallelConfigStandIn


def get_dp_group() -> runtime.GroupCoordinatorLike:
    return runtime._current.dp_group()


def get_pp_group() -> runtime.GroupCoordinatorLike:
    return runtime._current.pp_group()


def get_single_rank_group() -> runtime.GroupCoordinatorLike:
    """Tensor, expert and other groups: DP-sync code never collects over them."""
    return runtime.SINGLE_PIPELINE_STAGE


def should_skip_dp_coordination() -> bool:
    return runtime._current.skip_dp_coordination()


@contextlib.contextmanager
def graph_capture(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield None


def is_global_first_rank() -> bool:
    return False


_GROUPS = {
    "get_dp_group": get_dp_group,
    "get_pp_group": get_pp_group,
    "get_tp_group": get_single_rank_group,
    "get_ep_group": get_single_rank_group,
    "get_pcp_group": get_single_rank_group,
    "get_dcp_group": get_single_rank_group,
    "graph_capture": graph_capture,
    "is_global_first_rank": is_global_first_rank,
}

#: Module name -> the attributes it defines for real. All else is inert.
STAND_INS: dict[str, dict[str, Any]] = {
    "vllm.distributed.parallel_state": dict(_GROUPS),
    "vllm.distributed": dict(_GROUPS),
    "vllm.v1.worker.dp_utils": {
        "should_skip_dp_coordination": should_skip_dp_coordination,
    },
    "vllm.config": {
        "ParallelConfig": ParallelConfigStandIn,
        "set_current_vllm_config": contextlib.nullcontext,
    },
}
