"""vLLM's ``GroupCoordinator`` as one virtual rank sees it.

Target code reaches the DP group through ``get_dp_group()`` and then either
reads ``cpu_group`` / ``device_group`` and calls ``torch.distributed`` itself,
or calls the coordinator's own methods. Both must land on the same fake
collectives, on the process group vLLM would use: ``cpu_all_reduce_`` and
``barrier`` on the CPU (gloo) group, the device communicator's
``all_reduce`` / ``all_gather`` / ``broadcast`` on the device group. Like vLLM,
the device methods short-circuit for a group of one.

A view is kept for later runs of its layout (see ``dpsim.sim.world``), so it
is read-only: assigning or deleting an attribute, or changing ``ranks``, is
refused by name rather than carried into the next run.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from dpsim.records.dist import DistLike

_CPU = torch.device("cpu")


class FrozenRanks(list[int]):
    """A group's ``ranks``: a ``list`` as vLLM's is (equal to one, a ``list`` to
    ``isinstance``), whose in-place changes are refused.

    One list serves every member's view and every later run of the layout.
    """

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise TypeError(
            "dpsim's simulated GroupCoordinator.ranks is shared by every rank "
            "and kept for later runs; it cannot be changed in place"
        )

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse


@functools.lru_cache(maxsize=4096)
def _rank_attributes(rank: int, rank_in_group: int, world_size: int) -> dict[str, Any]:
    """The attributes that are one member's own (its ranks, first or last).

    The same few recur in every run; callers copy them, never change them.
    """
    return {
        "rank": rank,
        "local_rank": rank,
        "rank_in_group": rank_in_group,
        "is_first_rank": rank_in_group == 0,
        "is_last_rank": rank_in_group == world_size - 1,
    }


class GroupCoordinatorView:
    """One rank's view of a group: attributes are that rank's, calls go to ``dist``."""

    # Set through ``__dict__`` (see for_member), so declared here.
    # ``ranks`` is a :class:`FrozenRanks` (see shared_attributes).
    _dist: DistLike
    unique_name: str
    ranks: list[int]
    world_size: int
    cpu_group: Any
    device_group: Any
    device: torch.device
    first_rank: int
    last_rank: int
    rank: int
    local_rank: int
    rank_in_group: int
    is_first_rank: bool
    is_last_rank: bool

    def __init__(
        self,
        dist: DistLike,
        unique_name: str,
        rank: int,
        rank_in_group: int,
        ranks: list[int],
        cpu_group: Any,
        device_group: Any,
    ) -> None:
        self.__dict__.update(
            self.shared_attributes(dist, unique_name, ranks, cpu_group, device_group)
        )
        self.__dict__.update(_rank_attributes(rank, rank_in_group, len(ranks)))

    @staticmethod
    def shared_attributes(
        dist: DistLike,
        unique_name: str,
        ranks: list[int],
        cpu_group: Any,
        device_group: Any,
    ) -> dict[str, Any]:
        """The attributes every member's view has alike, for :meth:`for_member`."""
        return {
            "_dist": dist,
            "unique_name": unique_name,
            "ranks": FrozenRanks(ranks),
            "world_size": len(ranks),
            "cpu_group": cpu_group,
            "device_group": device_group,
            "device": _CPU,
            "first_rank": ranks[0],
            "last_rank": ranks[-1],
        }

    @classmethod
    def for_member(
        cls, shared: dict[str, Any], rank: int, rank_in_group: int
    ) -> GroupCoordinatorView:
        """The view of one member, from ``shared_attributes()`` made once per group.

        Every rank of every run makes one; copying the shared part is a
        fraction of setting each attribute in turn.
        """
        view = object.__new__(cls)
        object.__setattr__(
            view,
            "__dict__",
            shared | _rank_attributes(rank, rank_in_group, shared["world_size"]),
        )
        return view

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"dpsim's simulated GroupCoordinator has no settable attribute "
            f"{name!r}: a view is kept for later runs, so a change would outlive "
            "its run"
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError(
            f"dpsim's simulated GroupCoordinator cannot delete {name!r}: a view "
            "is kept for later runs, so a change would outlive its run"
        )

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
