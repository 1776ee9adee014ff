"""What a stand-in for ``torch.distributed`` offers: one protocol for every world.

A loaded target reaches ``torch.distributed`` through the installed world's
``dist`` (``dpsim.targets.runtime``). Three worlds supply one: the simulator's
fake collectives between virtual ranks, the real lane's recorder around real
process groups, and the benchmark's instant answers from a recorded run. They
are interchangeable only if they offer the same calls with torch's signatures,
so this protocol names them and mypy holds each implementation to it. Tensors
are typed ``Any``: the vocabulary imports without torch.
"""

from __future__ import annotations

from typing import Any, Protocol


class GroupNamespace:
    """``torch.distributed.group``: only ``WORLD`` is meaningful to targets."""

    def __init__(self, world: Any) -> None:
        self.WORLD = world


class WorldGroup(Protocol):
    """What ``torch.distributed.group`` offers: the default group as ``WORLD``."""

    @property
    def WORLD(self) -> Any: ...


class DistLike(Protocol):
    """The part of ``torch.distributed`` that DP-sync code and scenarios call.

    ``group=None`` means the world group, as in torch; ``async_op=True``
    returns a work handle with ``wait()``, otherwise the call returns None
    once the collective has completed.
    """

    ReduceOp: Any

    @property
    def group(self) -> WorldGroup: ...

    def is_initialized(self) -> bool: ...

    def get_rank(self, group: Any = None) -> int: ...

    def get_world_size(self, group: Any = None) -> int: ...

    def all_reduce(
        self, tensor: Any, op: Any = ..., group: Any = None, async_op: bool = False
    ) -> Any: ...

    def all_gather(
        self,
        tensor_list: list[Any],
        tensor: Any,
        group: Any = None,
        async_op: bool = False,
    ) -> Any: ...

    def all_gather_into_tensor(
        self,
        output_tensor: Any,
        input_tensor: Any,
        group: Any = None,
        async_op: bool = False,
    ) -> Any: ...

    def broadcast(
        self, tensor: Any, src: int, group: Any = None, async_op: bool = False
    ) -> Any: ...

    def barrier(
        self, group: Any = None, async_op: bool = False, *, device_ids: Any = None
    ) -> Any: ...
