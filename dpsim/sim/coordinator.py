"""vLLM's ``GroupCoordinator`` as one virtual rank sees it.

Target code reaches the DP group through ``get_dp_group()`` and then either
reads ``cpu_group`` / ``device_group`` and calls ``torch.distributed`` itself,
or calls the coordinator's own methods. Both must land on the same fake
collectives, on the process group vLLM would use: ``cpu_all_reduce_`` and
``barrier`` on the CPU (gloo) group, the device communicator's
``all_reduce`` / ``all_gather`` / ``broadcast`` on the device group. Like vLLM,
the device methods short-circuit for a group of one.
"""

from __future__ import annotations

from typing import Any

import torch

_CPU = torch.device("cpu")


class GroupCoordinatorView:
    """One rank's view of a group: attributes are that rank's, calls go to ``dist``."""

    def __init__(
        self,
        dist: Any,
        unique_name: str,
        rank: int,
        rank_in_group: int,
        ranks: list[int],
        cpu_group: Any,
        device_group: Any,
    ) -> None:
        self._dist = dist
        self.unique_name = unique_name
        self.rank = rank
        self.local_rank = rank
        self.ranks = ranks
        self.world_size = len(ranks)
        self.rank_in_group = rank_in_group
        self.cpu_group = cpu_group
        self.device_group = device_group
        self.device = _CPU
        self.is_first_rank = self.rank_in_group == 0
        self.is_last_rank = self.rank_in_group == self.world_size - 1
        self.first_rank = ranks[0]
        self.last_rank = ranks[-1]

    def cpu_all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place SUM over the CPU group; returns ``tensor``."""
        self._dist.all_reduce(tensor, group=self.cpu_group)
        return tensor

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        self._dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        dim = dim if dim >= 0 else dim + tensor.dim()
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._dist.all_gather(gathered, tensor, group=self.device_group)
        return torch.cat(gathered, dim=dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``src`` is a rank in the group, as in vLLM."""
        if self.world_size == 1:
            return tensor
        self._dist.broadcast(tensor, src=self.ranks[src], group=self.device_group)
        return tensor

    def barrier(self) -> None:
        self._dist.barrier(group=self.cpu_group)

    def __repr__(self) -> str:
        return (
            f"<GroupCoordinator {self.unique_name} rank {self.rank_in_group}"
            f"/{self.world_size}>"
        )
