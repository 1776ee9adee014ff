"""The simulator's schedule of a runner case, for real processes to follow.

On real processes (:mod:`dpsim.lanes.runner.processes`) the one channel
between ranks besides the collectives is the coordinator model in the parent
(:mod:`dpsim.lanes.runner.relay`), and what an engine does can depend on when
a message reaches it: an engine that finds its input queue empty takes its
next request at once (the lane's arrival rule), one that finds a peer's
``START_DP_WAVE`` there first runs a dummy batch instead. The simulator
decides such races by its scheduling choices; real processes would decide
them by timing, and then their trace would differ from the simulator's for
no fault of either.

So the real run follows the simulator's schedule for this channel, recorded
here while the simulator runs the case with the lane's own parts (wrapped,
not changed):

* ``calls``: every call the engines and their request streams made on the
  coordinator model (``send_request``, and ``output`` of a wave output),
  as ``(rank, kind)``, in the simulator's order. The parent makes the
  children's calls in this order, so each rank's queue receives the same
  messages in the same order;
* ``looks[rank]``: at each look the rank's engine took at its input queue
  (``empty``, ``get_nowait``, ``get``), how many messages had reached it in
  all. The child's look waits for as many and sees no more.

Collectives need no such help: they synchronise the ranks themselves. Where
the real run leaves the schedule (a call of another kind, or from a rank
that ended), the parent drops it and serves calls as they come: the traces
then differ, and the comparison says where.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dpsim.targets.load import Target

from .case import RunnerCase
from .relay import REQUEST, relayed_output
from .run import Builders, RunnerResult, default_builders, run_runner_case


@dataclass
class RelaySchedule:
    """The calls on the coordinator model and each rank's looks at its queue."""

    calls: list[tuple[int, str]] = field(default_factory=list)
    looks: dict[int, list[int]] = field(default_factory=dict)

    def looks_of(self, rank: int) -> list[int]:
        return self.looks.get(rank, [])


def simulate_with_schedule(
    target: Target, case: RunnerCase
) -> tuple[RunnerResult, RelaySchedule]:
    """Simulate ``case`` as :func:`~dpsim.lanes.runner.run.run_runner_case`
    does, recording the schedule real processes are to follow."""
    schedule = RelaySchedule()
    run = run_runner_case(
        target, case, builders=recording_builders(schedule, case.runner)
    )
    return run, schedule


def recording_builders(schedule: RelaySchedule, runner: str = "v2") -> Builders:
    """The lane's own builders for ``runner``'s model runner, the coordinator
    and each engine's mailbox wrapped to record ``schedule``."""
    base = default_builders(runner)

    def coordinator(sources: Any, mailboxes: Any) -> Any:
        return _RecordingCoordinator(base.coordinator(sources, mailboxes), schedule)

    def engine(
        sources: Any,
        options: Any,
        scheduler: Any,
        worker: Any,
        rank: int,
        dp_size: int,
        mailbox: Any,
        coordinator: Any,
        stream: Any = None,
    ) -> Any:
        looks = schedule.looks.setdefault(rank, [])
        return base.engine(
            sources,
            options,
            scheduler,
            worker,
            rank,
            dp_size,
            _RecordingMailbox(mailbox, looks),
            coordinator,
            stream=stream,
        )

    return replace(base, coordinator=coordinator, engine=engine)


class _RecordingCoordinator:
    """The coordinator model, noting each call the relay would carry."""

    def __init__(self, inner: Any, schedule: RelaySchedule) -> None:
        self._inner = inner
        self._calls = schedule.calls
        self.front_end_wakes = inner.front_end_wakes

    def attach(self, rank: int, shutdown: Any) -> None:
        self._inner.attach(rank, shutdown)

    def send_request(self, rank: int, request: Any) -> None:
        self._calls.append((rank, REQUEST))
        self._inner.send_request(rank, request)

    def output(self, rank: int, item: Any) -> None:
        message = relayed_output(item)
        if message is not None:
            self._calls.append((rank, message[0]))
        self._inner.output(rank, item)

    def on_quiescent(self, now: Any) -> bool:
        return bool(self._inner.on_quiescent(now))


class _RecordingMailbox:
    """A rank's mailbox, noting at each look how many messages reached it."""

    def __init__(self, inner: Any, looks: list[int]) -> None:
        self._inner = inner
        self._looks = looks
        self._taken = 0

    def empty(self) -> bool:
        empty: bool = self._inner.empty()
        self._looked()
        return empty

    def get_nowait(self) -> Any:
        try:
            message = self._inner.get_nowait()
        except IndexError:
            self._looked()
            raise
        self._taken += 1
        self._looked()
        return message

    def get(self) -> Any:
        message = self._inner.get()
        self._taken += 1
        self._looked()
        return message

    def _looked(self) -> None:
        self._looks.append(self._taken + len(self._inner))
