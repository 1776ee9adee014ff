"""The ``World`` a loaded target sees while it runs on a virtual rank.

Everything here answers for the rank that is running now (the scheduler's
``current``): its DP group coordinator, its skip-coordination flag, its step
count. Programs reach the running simulation through :func:`record`,
:func:`current_rank` and :func:`current_world`, which find it as the
installed world, so no global beyond ``runtime.current()`` is involved.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from dpsim.records.groups import (
    DEFAULT_GROUP_NAMES,
    DP_CPU_GROUP,
    DP_DEVICE_GROUP,
    WORLD_GROUP,
)
from dpsim.records.trace import EventTuple
from dpsim.sim.collectives import SimCollectives, SimProcessGroup
from dpsim.sim.coordinator import GroupCoordinatorView
from dpsim.sim.mailbox import Mailbox
from dpsim.sim.scheduler import Scheduler
from dpsim.targets import runtime


def resolve_groups(
    ranks: int, groups: Mapping[str, Sequence[int]] | None
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The default groups (all spanning every rank), overridden or extended by ``groups``."""
    if not groups:
        return _default_groups(ranks)
    return _resolve_groups(ranks, groups)


@functools.lru_cache(maxsize=64)
def _default_groups(ranks: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return _resolve_groups(ranks, None)


def _resolve_groups(
    ranks: int, groups: Mapping[str, Sequence[int]] | None
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if ranks < 1:
        raise ValueError(f"need at least one rank, got {ranks}")
    declared: dict[str, tuple[int, ...]] = {
        name: tuple(range(ranks)) for name in DEFAULT_GROUP_NAMES
    }
    for name, members in (groups or {}).items():
        member_tuple = tuple(int(rank) for rank in members)
        if not member_tuple:
            raise ValueError(f"group {name!r} has no members")
        if len(set(member_tuple)) != len(member_tuple):
            raise ValueError(f"group {name!r} lists a rank twice: {list(members)}")
        outside = [rank for rank in member_tuple if not 0 <= rank < ranks]
        if outside:
            raise ValueError(
                f"group {name!r} names ranks {outside} outside 0..{ranks - 1}"
            )
        declared[name] = member_tuple
    if declared[WORLD_GROUP] != tuple(range(ranks)):
        raise ValueError(
            f"group {WORLD_GROUP!r} is every rank; it cannot be redeclared"
        )
    if set(declared[DP_CPU_GROUP]) != set(declared[DP_DEVICE_GROUP]):
        raise ValueError(
            f"groups {DP_CPU_GROUP!r} and {DP_DEVICE_GROUP!r} are one DP group's two "
            "communicators and must have the same members"
        )
    return tuple(declared.items())


class SimWorld:
    """Virtual ranks' world: fake collectives plus per-rank DP coordinators."""

    def __init__(
        self,
        scheduler: Scheduler,
        groups: Sequence[tuple[str, Sequence[int]]],
        skip_dp_coordination: Sequence[bool],
    ) -> None:
        world_size = len(skip_dp_coordination)
        self.scheduler = scheduler
        self.dist = SimCollectives(scheduler, world_size, groups, WORLD_GROUP)
        self.skip_flags = list(skip_dp_coordination)
        self.events: list[list[EventTuple]] = [[] for _ in range(world_size)]
        #: Ranks parked in a mailbox now, by rank (see dpsim.sim.mailbox).
        self.parked: dict[int, Mailbox] = {}
        self._dp_cpu = self.dist.groups[DP_CPU_GROUP]
        self._dp_device = self.dist.groups[DP_DEVICE_GROUP]
        self._dp_members = list(self._dp_device.members)
        # Made on a rank's first dp_group() call: most runs never ask on most
        # ranks' behalf more than once, and some never ask at all.
        self._dp_views: list[GroupCoordinatorView | None] = [None] * world_size
        self._dp_shared: dict[str, Any] | None = None

    def group(self, name: str) -> SimProcessGroup:
        """The process group handle declared as ``name``, to pass as ``group=``."""
        return self.dist.handle(name)

    # -- runtime.World --------------------------------------------------------

    def dp_group(self) -> GroupCoordinatorView:
        rank = self.scheduler.current
        view = self._dp_views[rank]
        if view is None:
            view = self._dp_views[rank] = self._make_dp_view(rank)
        return view

    def _make_dp_view(self, rank: int) -> GroupCoordinatorView:
        position = self._dp_device.position[rank]
        if position < 0:
            raise runtime.NoDPGroupError(f"rank {rank} is not in the DP group")
        shared = self._dp_shared
        if shared is None:
            shared = self._dp_shared = GroupCoordinatorView.shared_attributes(
                self.dist,
                "dp",
                self._dp_members,
                self._dp_cpu.handle,
                self._dp_device.handle,
            )
        return GroupCoordinatorView.for_member(shared, rank, position)

    def pp_group(self) -> runtime.GroupCoordinatorLike:
        return runtime.SINGLE_PIPELINE_STAGE

    def skip_dp_coordination(self) -> bool:
        return self.skip_flags[self.scheduler.current]

    def tick(self) -> None:
        self.scheduler.charge()

    def set_skip_dp_coordination(self, flag: bool) -> None:
        """What ``should_skip_dp_coordination()`` answers on the running rank from now on."""
        self.skip_flags[self.scheduler.current] = flag

    # -- for programs -----------------------------------------------------------

    def record(self, kind: str, payload: dict[str, Any]) -> None:
        if self.scheduler.closing:
            return  # a finally block of a rank being ended: the trace is final
        rank = self.scheduler.current
        self.events[rank].append((kind, len(self.dist.logs[rank]), payload))


def _running_world() -> SimWorld:
    world = runtime.current()
    if not isinstance(world, SimWorld) or world.scheduler.current < 0:
        raise RuntimeError("not inside a program run by dpsim.sim.simulate()")
    return world


def record(kind: str, **payload: Any) -> None:
    """Add an event to the running rank's trace; ``payload`` must be JSON-friendly."""
    _running_world().record(kind, payload)


def current_rank() -> int:
    """The virtual rank whose program is running."""
    return _running_world().scheduler.current


def current_world() -> SimWorld:
    """The simulation the running program belongs to (for ``group(name)``)."""
    return _running_world()
