"""A world whose collectives answer at once, from a recorded simulated run.

The physical limit of the simulator's speed is N times one rank's call with a
collective that is already complete. This world makes that call possible: it
hands every rank, in order, the results its collectives had in a recorded run,
so the same per-rank calls can be made one after another with no scheduler,
no matching, no waiting. Only the benchmark uses it.
"""

from __future__ import annotations

from typing import Any

import torch

from dpsim.records.dist import GroupNamespace
from dpsim.records.groups import DP_CPU_GROUP, DP_DEVICE_GROUP, WORLD_GROUP
from dpsim.records.trace import CollectiveRecord, SimResult
from dpsim.sim.coordinator import GroupCoordinatorView
from dpsim.targets import runtime


class InstantGroup:
    """A process group handle for the instant world: name and members only."""

    def __init__(self, name: str, ranks: tuple[int, ...]) -> None:
        self.name = name
        self.ranks = ranks

    def size(self) -> int:
        return len(self.ranks)


class _Completed:
    """The work handle of an async op that completed when it was called."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


_COMPLETED = _Completed()


def _answer(record: CollectiveRecord) -> Any:
    """The recorded result as tensors ready to copy from."""
    kind = record.signature.kind
    if kind == "barrier":
        return None
    dtype = getattr(
        torch, (record.signature.dtype or "torch.float32").removeprefix("torch.")
    )
    if kind == "all_gather":
        return [torch.tensor(part, dtype=dtype) for part in record.result]
    return torch.tensor(record.result, dtype=dtype)


class InstantDist:
    """``torch.distributed`` answering each rank's k-th collective with its recorded result."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, result: SimResult) -> None:
        self.current = 0
        self._answers = [
            [_answer(record) for record in trace.collectives] for trace in result.ranks
        ]
        self._cursor = [0] * len(result.ranks)
        self._groups = {
            name: InstantGroup(name, members) for name, members in result.groups
        }
        self._default = self._groups[WORLD_GROUP]
        self.group = GroupNamespace(self._default)

    def rewind(self) -> None:
        self._cursor = [0] * len(self._cursor)

    def handle(self, name: str) -> InstantGroup:
        return self._groups[name]

    def _next(self) -> Any:
        rank = self.current
        index = self._cursor[rank]
        self._cursor[rank] = index + 1
        return self._answers[rank][index]

    def is_initialized(self) -> bool:
        return True

    def get_rank(self, group: InstantGroup | None = None) -> int:
        return (group or self._default).ranks.index(self.current)

    def get_world_size(self, group: InstantGroup | None = None) -> int:
        return len((group or self._default).ranks)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = None,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        tensor.copy_(self._next())
        return _COMPLETED if async_op else None

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        for target, source in zip(tensor_list, self._next(), strict=True):
            target.copy_(source)
        return _COMPLETED if async_op else None

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        output_tensor.copy_(self._next())
        return _COMPLETED if async_op else None

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> Any:
        tensor.copy_(self._next())
        return _COMPLETED if async_op else None

    def barrier(
        self, group: Any = None, async_op: bool = False, device_ids: Any = None
    ) -> Any:
        self._next()
        return _COMPLETED if async_op else None


class InstantWorld:
    """``runtime.World`` for the bare baseline: set ``current`` before each rank's call."""

    def __init__(self, result: SimResult, skip_dp_coordination: bool = False) -> None:
        self.dist = InstantDist(result)
        self._skip = skip_dp_coordination
        cpu = self.dist.handle(DP_CPU_GROUP)
        device = self.dist.handle(DP_DEVICE_GROUP)
        members = list(device.ranks)
        self._dp_views = [
            GroupCoordinatorView(
                self.dist, "dp", rank, members.index(rank), members, cpu, device
            )
            if rank in members
            else None
            for rank in range(len(result.ranks))
        ]

    @property
    def current(self) -> int:
        return self.dist.current

    @current.setter
    def current(self, rank: int) -> None:
        self.dist.current = rank

    def rewind(self) -> None:
        """Start every rank's answers from its first collective again."""
        self.dist.rewind()

    def dp_group(self) -> GroupCoordinatorView:
        view = self._dp_views[self.dist.current]
        if view is None:
            raise runtime.NoDPGroupError(
                f"rank {self.dist.current} is not in the DP group"
            )
        return view

    def pp_group(self) -> runtime.GroupCoordinatorLike:
        return runtime.SINGLE_PIPELINE_STAGE

    def skip_dp_coordination(self) -> bool:
        return self._skip

    def tick(self) -> None:
        return None
