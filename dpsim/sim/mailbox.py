"""A rank's mailbox: messages put by anyone, taken by the rank that owns it.

A vLLM engine process blocks on its input queue when it has nothing to do, and
the runner lane runs that engine loop for real on a virtual rank. A blocking
``get()`` on an empty :class:`Mailbox` parks the owning rank with the
scheduler's ``block``; a ``put()`` (from another rank, or from the run's
``on_quiescent`` callback in the hub) wakes it. No threads, no clock: who puts
what, and when, is decided by the programs and the scheduler alone, so a run
stays deterministic.

A rank parked in its mailbox is not hung by itself: it waits for input, as an
idle engine does. When no rank can run, :func:`dpsim.sim.simulate` hands the
run's :class:`Quiescence` to its ``on_quiescent`` callback, which may put
messages (a shutdown to every parked engine) and go on. A rank still parked
when the run ends stays ``waiting`` in its trace (so a run that leaves one
there is not ``ok``), and gets a :data:`PARKED_EVENT` event naming the
mailbox, so a reader can tell "idle, waiting for input" from "waiting in a
collective" (whose ``waiting`` field is set). Runs that use no mailbox are
unchanged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from dpsim.targets import runtime

if TYPE_CHECKING:
    from dpsim.sim.world import SimWorld

#: Event kind added to the trace of a rank still parked in a mailbox when the
#: run ends; its payload is ``{"mailbox": <the mailbox's name>}``.
PARKED_EVENT = "parked"


def _world() -> SimWorld:
    from dpsim.sim.world import SimWorld

    world = runtime.current()
    if not isinstance(world, SimWorld):
        raise RuntimeError("a Mailbox is used inside a run of dpsim.sim.simulate()")
    return world


class Mailbox:
    """Messages for virtual rank ``owner``, oldest first."""

    def __init__(self, owner: int, name: str = "mailbox") -> None:
        self.owner = owner
        #: Says which mailbox a parked rank waits in (traces, diagnoses).
        self.name = name
        self._messages: deque[Any] = deque()
        self._parked = False

    def put(self, message: Any) -> None:
        """Add ``message``; wake the owner if it is parked here."""
        self._messages.append(message)
        if self._parked:
            self._parked = False
            world = _world()
            del world.parked[self.owner]
            world.scheduler.wake([self.owner])

    def get(self) -> Any:
        """The oldest message; the owner parks here until there is one."""
        messages = self._messages
        while not messages:
            world = _world()
            scheduler = world.scheduler
            if scheduler.current != self.owner:
                raise RuntimeError(
                    f"rank {scheduler.current} took from rank {self.owner}'s "
                    f"mailbox {self.name!r}; only its owner waits in it"
                )
            self._parked = True
            world.parked[self.owner] = self
            try:
                scheduler.block()
            finally:
                # Ended while parked (the run closing): no longer parked here.
                if self._parked:
                    self._parked = False
                    world.parked.pop(self.owner, None)
        return messages.popleft()

    def get_nowait(self) -> Any:
        """The oldest message; ``IndexError`` when there is none."""
        return self._messages.popleft()

    def empty(self) -> bool:
        return not self._messages

    def __len__(self) -> int:
        return len(self._messages)

    def __repr__(self) -> str:
        return f"<Mailbox {self.name!r} of rank {self.owner}: {len(self)} messages>"


class Quiescence:
    """What ``simulate``'s ``on_quiescent`` callback sees: no rank can run.

    The callback runs in the hub, between ranks: it may ``put`` into
    mailboxes (waking their owners) and read where ranks stand, but not
    enter collectives or record events (those belong to a running rank).
    """

    def __init__(self, world: SimWorld) -> None:
        self._world = world

    @property
    def parked(self) -> Mapping[int, Mailbox]:
        """Ranks parked in a mailbox, by rank, lowest first."""
        parked = self._world.parked
        return {rank: parked[rank] for rank in sorted(parked)}

    @property
    def blocked(self) -> tuple[int, ...]:
        """Every rank that has not ended: parked in a mailbox or waiting in a collective."""
        return self._world.scheduler.blocked_ranks()

    def frame(self, rank: int) -> FrameType | None:
        """The innermost frame of a blocked rank (walk ``f_back`` outward); None otherwise."""
        return self._world.scheduler.frame(rank)
