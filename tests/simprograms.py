"""What the simulator's tests share: a rank's DP CPU group, a named group, one
all-reduce, and the ``torch.distributed`` loaded targets see."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed

from dpsim import sim
from dpsim.targets import runtime

dist = runtime.DIST_PROXY
ReduceOp = torch.distributed.ReduceOp


def dp_cpu() -> Any:
    return runtime.current().dp_group().cpu_group


def group(name: str) -> sim.SimProcessGroup:
    return sim.current_world().group(name)


def all_reduce_rank_value(rank: int) -> list[int]:
    tensor = torch.tensor([rank + 1, 10 * (rank + 1)], dtype=torch.int32)
    dist.all_reduce(tensor, group=dp_cpu())
    return tensor.tolist()
