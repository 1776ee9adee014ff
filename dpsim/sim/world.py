"""The ``World`` a loaded target sees while it runs on a virtual rank.

Everything here answers for the rank that is running now (the scheduler's
``current``): its DP group coordinator, its skip-coordination flag, its step
count. Programs reach the running simulation through :func:`record`,
:func:`current_rank` and :func:`current_world`, which find it as the
installed world, so no global beyond ``runtime.current()`` is involved.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpsim.records.groups import (
    DEFAULT_GROUP_NAMES,
    DP_CPU_GROUP,
    DP_DEVICE_GROUP,
    WORLD_GROUP,
)
from dpsim.records.trace import EventTuple, Payload
from dpsim.sim.collectives import SimCollectives, SimProcessGroup
from dpsim.sim.coordinator import GroupCoordinatorView
from dpsim.sim.mailbox import Mailbox
from dpsim.sim.scheduler import Scheduler
from dpsim.sim.workers import Crew
from dpsim.targets import runtime

#: Process groups as :func:`resolve_groups` gives them: (name, members) pairs.
GroupLayout = tuple[tuple[str, tuple[int, ...]], ...]


def resolve_groups(
    ranks: int, groups: Mapping[str, Sequence[int]] | None
) -> GroupLayout:
    """The default groups (all spanning every rank), overridden or extended by ``groups``.

    Equal layouts come back as one object (while at most ``MAX_LAYOUTS``
    other ones were resolved since), which is how the idle worlds find
    theirs: by identity, without hashing a tuple of every group's members
    (O(ranks)) at every run.
    """
    if not groups:
        return _default_groups(ranks)
    layout = _resolve_groups(ranks, groups)
    interned = _LAYOUTS.get(layout)
    if interned is None:
        if len(_LAYOUTS) >= MAX_LAYOUTS:
            _LAYOUTS.clear()
        interned = _LAYOUTS[layout] = layout
    return interned


#: Layouts with declared groups, each equal one as one object (see resolve_groups).
MAX_LAYOUTS = 256
_LAYOUTS: dict[GroupLayout, GroupLayout] = {}


@functools.lru_cache(maxsize=64)
def _default_groups(ranks: int) -> GroupLayout:
    return _resolve_groups(ranks, None)


def _resolve_groups(
    ranks: int, groups: Mapping[str, Sequence[int]] | None
) -> GroupLayout:
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
    """Virtual ranks' world: fake collectives plus per-rank DP coordinators.

    One serves many runs in turn (see :func:`take_world`): what a run
    changes is reset before the next, while the groups, their handles, the
    DP views and the crew of greenlets that run the ranks, which depend only
    on the layout, are made once.
    """

    #: ``runtime.World.tick``: the running rank's scheduler's ``charge``, bound
    #: per run (one call less on every loop iteration of a target).
    tick: Callable[[], None]

    def __init__(
        self,
        scheduler: Scheduler,
        groups: GroupLayout,
        skip_dp_coordination: Sequence[bool],
    ) -> None:
        world_size = len(skip_dp_coordination)
        #: The groups as (name, members), as declared: also every result's ``groups``.
        self.layout = groups
        self.dist = SimCollectives(scheduler, world_size, groups, WORLD_GROUP)
        self._dp_cpu = self.dist.groups[DP_CPU_GROUP]
        self._dp_device = self.dist.groups[DP_DEVICE_GROUP]
        self._dp_members = list(self._dp_device.members)
        # Made on a rank's first dp_group() call and kept for later runs:
        # some runs never ask on most ranks' behalf at all.
        self._dp_views: list[GroupCoordinatorView | None] = [None] * world_size
        self._dp_shared: dict[str, Any] | None = None
        #: The ranks' greenlets, for ``Scheduler.run``.
        self.crew = Crew(scheduler)
        self._reset_own(scheduler, skip_dp_coordination)

    def reset(self, scheduler: Scheduler, skip_dp_coordination: Sequence[bool]) -> None:
        """Ready for a new run under ``scheduler``, as if just made.

        The last run's result keeps what it read (logs and events are new
        objects here, not cleared ones).
        """
        self.dist.reset(scheduler)
        self._reset_own(scheduler, skip_dp_coordination)

    def _reset_own(
        self, scheduler: Scheduler, skip_dp_coordination: Sequence[bool]
    ) -> None:
        self.scheduler = scheduler
        self.tick = scheduler.charge
        self.skip_flags = list(skip_dp_coordination)
        #: Events recorded, by rank; a rank that recorded none has no entry.
        self.events: dict[int, list[EventTuple]] = {}
        #: Ranks parked in a mailbox now, by rank (see dpsim.sim.mailbox).
        self.parked: dict[int, Mailbox] = {}

    def group(self, name: str) -> SimProcessGroup:
        """The process group handle declared as ``name``, to pass as ``group=``."""
        return self.dist.handle(name)

    # -- runtime.World --------------------------------------------------------

    def dp_group(self) -> GroupCoordinatorView:
        return self._dp_views[self.scheduler.current] or self._make_dp_view()

    def _make_dp_view(self) -> GroupCoordinatorView:
        rank = self.scheduler.current
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
        view = self._dp_views[rank] = GroupCoordinatorView.for_member(
            shared, rank, position
        )
        return view

    def pp_group(self) -> runtime.GroupCoordinatorLike:
        return runtime.SINGLE_PIPELINE_STAGE

    def skip_dp_coordination(self) -> bool:
        return self.skip_flags[self.scheduler.current]

    def set_skip_dp_coordination(self, flag: bool) -> None:
        """What ``should_skip_dp_coordination()`` answers on the running rank from now on."""
        self.skip_flags[self.scheduler.current] = flag

    # -- for programs -----------------------------------------------------------

    def record(self, kind: str, payload: Payload) -> None:
        if self.scheduler.closing:
            return  # a finally block of a rank being ended: the trace is final
        rank = self.scheduler.current
        event = (kind, len(self.dist.logs[rank]), payload)
        events = self.events.get(rank)
        if events is None:
            self.events[rank] = [event]
        else:
            events.append(event)


#: Idle worlds kept per thread, at most one per layout.
MAX_IDLE_WORLDS = 16
#: ... and at most this many ranks among them: each rank's idle worker (see
#: ``dpsim.sim.workers``) keeps its own stacks.
MAX_IDLE_RANKS = 1024


class _IdleWorlds(threading.local):
    def __init__(self) -> None:
        #: Keyed by ``id(world.layout)``: resolve_groups gives equal layouts as
        #: one object, and the world keeps its layout alive while it is here,
        #: so no other object can have that id meanwhile.
        self.by_layout: dict[int, SimWorld] = {}


_IDLE = _IdleWorlds()


def take_world(
    scheduler: Scheduler, groups: GroupLayout, skip_dp_coordination: Sequence[bool]
) -> SimWorld:
    """A world for a run of ``groups`` (as :func:`resolve_groups` gives it):
    an idle one reset, else a new one.

    Making a world (its groups, handles and DP views) costs about as much as
    a whole rank's share of a small run, and a search makes thousands of runs
    of a few layouts. A world is taken out of the pool for its run, so a
    nested run gets its own.
    """
    world = _IDLE.by_layout.pop(id(groups), None)
    if world is None:
        return SimWorld(scheduler, groups, skip_dp_coordination)
    world.reset(scheduler, skip_dp_coordination)
    return world


def give_back_world(world: SimWorld) -> None:
    """Keep ``world`` for the next run of its layout.

    Only for a world whose run has closed with every rank ended: a rank's
    greenlet left suspended could otherwise wake into a later run, and its
    crew's workers must all be idle for the next.
    """
    # An idle world must not keep the last run's tensors alive.
    world.dist.release()
    size = world.dist.world_size
    if size > MAX_IDLE_RANKS:
        return
    idle = _IDLE.by_layout
    key = id(world.layout)
    idle.pop(key, None)  # a nested run's, given back meanwhile
    while idle and (
        len(idle) >= MAX_IDLE_WORLDS
        or size + sum(kept.dist.world_size for kept in idle.values()) > MAX_IDLE_RANKS
    ):
        idle.pop(next(iter(idle)))  # the longest idle
    idle[key] = world


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
