"""From the simulator's raw bookkeeping to a ``SimResult``: states, positions, outcome.

Runs once, after no rank can run and before hung ranks are ended, so it reads
exactly where each rank stopped. Each rank's collective log becomes frozen
records only when a reader first asks for ``RankTrace.collectives``, and a
record's values become lists only when asked for too: the checker reads
states and events, and converting every record of an N-rank run up front
costs O(N^2) whether anyone reads them or not. What both lanes share of
building a trace is in :mod:`dpsim.records.trace`; this is the simulator's
input side.
"""

from __future__ import annotations

import functools
from itertools import repeat

from dpsim.records.trace import (
    CollectiveRecord,
    Event,
    IncompleteCollective,
    RankState,
    RankTrace,
    Signature,
    SimResult,
    WaitInfo,
    incomplete_collective,
    wait_info,
)
from dpsim.sim.collectives import LogEntry, Pending, SignatureTuple, SimCollectives
from dpsim.sim.mailbox import PARKED_EVENT
from dpsim.sim.scheduler import Scheduler
from dpsim.sim.world import SimWorld


class _Signatures:
    """Interns signatures: a run has few distinct ones and many records."""

    def __init__(self) -> None:
        self._made: dict[SignatureTuple, Signature] = {}

    def __call__(self, raw: SignatureTuple) -> Signature:
        made = self._made.get(raw)
        if made is None:
            kind, op, shape, dtype, src = raw
            made = self._made[raw] = Signature(
                kind, op, tuple(shape), None if dtype is None else str(dtype), src
            )
        return made


class _Waits:
    """Describes why ranks wait, once per way of waiting.

    Every rank stuck in one collective the same way (signature, in wait() or
    not) waits for the same reason, and each collective's members' entered
    signatures are read once: a hang can leave hundreds of ranks in one.
    """

    def __init__(self, signature: _Signatures) -> None:
        self._signature = signature
        self._entered: dict[int, list[tuple[int, Signature | None]]] = {}
        self._described: dict[tuple[int, SignatureTuple, bool], WaitInfo] = {}

    def __call__(self, pending: Pending, rank: int, is_async: bool) -> WaitInfo:
        group = pending.group
        assert group is not None  # not completed, not frozen yet
        own = pending.signatures[group.position[rank]]
        assert own is not None
        key = (id(pending), own, is_async)
        made = self._described.get(key)
        if made is None:
            made = self._described[key] = wait_info(
                group.name,
                pending.seq,
                self._signature(own),
                is_async,
                self._entered_by_member(pending, group.members),
            )
        return made

    def _entered_by_member(
        self, pending: Pending, members: tuple[int, ...]
    ) -> list[tuple[int, Signature | None]]:
        entered = self._entered.get(id(pending))
        if entered is None:
            signature = self._signature
            entered = self._entered[id(pending)] = [
                (member, None if raw is None else signature(raw))
                for member, raw in zip(members, pending.signatures, strict=True)
            ]
        return entered


def _incomplete(dist: SimCollectives) -> tuple[IncompleteCollective, ...]:
    """Collectives that never completed; takes their inputs as they are now."""
    for state in dist.used:
        if state.pending:
            break
    else:
        # Only a group used this run can hold one (reset() empties the rest).
        return ()
    found = []
    for state in dist.groups.values():
        if not state.pending:
            continue  # the usual case, for every group
        for seq in sorted(state.pending):
            pending = state.pending[seq]
            pending.freeze()
            entered = {
                member
                for member, entered_as in zip(
                    state.members, pending.signatures, strict=True
                )
                if entered_as is not None
            }
            found.append(
                incomplete_collective(
                    state.name, seq, state.members, entered, pending.mismatched
                )
            )
    return tuple(found)


def _records(
    log: list[LogEntry], signature: _Signatures
) -> tuple[CollectiveRecord, ...]:
    """A rank's log as records; read after the run, when every entry is final."""
    make_record = CollectiveRecord.lazy
    return tuple(
        [
            make_record(
                pending.name,
                pending.seq,
                signature(raw_signature),
                pending,
                position,
                is_async,
                pending.done,
            )
            for pending, position, raw_signature, is_async in log
        ]
    )


#: How a rank still blocked when the run ended exits: (state, returned, error).
_BLOCKED_EXIT = (RankState.WAITING, None, None)


def result_of_run(scheduler: Scheduler, world: SimWorld) -> SimResult:
    """The finished run as a trace, read from the scheduler and the fake collectives.

    Most runs end with every rank finished and nothing recorded or parked,
    so what only a blocked, parked or recording rank needs is found for those
    ranks alone, and every rank's trace is made in one pass.
    """
    dist = world.dist
    signature = _Signatures()
    exits = scheduler.exits
    waiting: dict[int, WaitInfo | None] = {}
    if None in exits:
        waits = _Waits(signature)
        for rank, exit_record in enumerate(exits):
            if exit_record is None:
                blocked = dist.waiting_on[rank]
                waiting[rank] = (
                    None if blocked is None else waits(blocked[0], rank, blocked[1])
                )
        ends = [_BLOCKED_EXIT if end is None else end for end in exits]
    else:
        ends = exits  # type: ignore[assignment]  # no None left in it
    events = _events(world, waiting) if world.events or world.parked else {}
    make_trace = RankTrace.lazy
    steps = scheduler.steps
    # Made in one C loop: one per rank of every run.
    collectives = list(
        map(functools.partial, repeat(_records), dist.logs, repeat(signature))
    )
    traces = tuple(
        [
            make_trace(
                rank,
                state,
                returned,
                error,
                waiting.get(rank),
                steps[rank],
                collectives[rank],
                events.get(rank, ()),
            )
            for rank, (state, returned, error) in enumerate(ends)
        ]
    )
    return SimResult.judged(
        traces,
        tuple(scheduler.choices),
        world.layout,
        _incomplete(dist),
    )


def _events(
    world: SimWorld, waiting: dict[int, WaitInfo | None]
) -> dict[int, tuple[Event, ...]]:
    """The events of each rank that has any, by rank."""
    found = {rank: Event.all_of(raw) for rank, raw in world.events.items()}
    logs = world.dist.logs
    for rank, mailbox in world.parked.items():
        if waiting.get(rank) is None:
            # Idle, waiting for input: said so, as a collective wait is.
            found[rank] = Event.all_of(
                [
                    *world.events.get(rank, ()),
                    (PARKED_EVENT, len(logs[rank]), {"mailbox": mailbox.name}),
                ]
            )
    return found
