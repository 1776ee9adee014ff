"""From the lane's per-rank logs to a ``SimResult``, judged like any simulated run.

Properties read only ``SimResult``s, so the real lane produces one, with the
simulator's meanings:

- A collective is *open* on a rank when it was entered and never returned:
  the rank was stuck there when it was killed, or its backend gave up (gloo's
  timeout, a closed connection, an abort on a size mismatch). The rank is
  ``waiting`` in it, as a blocked virtual rank is; what it recorded after
  entering (a sync's error record, say) happened only because a real backend
  gives up, and is dropped.
- Members that entered one collective with different signatures make it
  *mismatched*, whatever the backend then did: gloo may abort, raise, hang,
  or, for some size mismatches, return garbage. Each such member is counted
  as stuck there, as in the simulator, so a silently corrupt result cannot
  read as agreement.
- A rank that raised outside any open collective ``raised``; one stopped by
  its step budget is ``budget``; one that ended neither way (killed while
  computing) is ``waiting`` with no collective to show.

The per-rank outcome, states, collective records and events then have the
simulator's shape, and the lane's verdict can be compared with the
simulator's field by field. What both lanes share of building a trace (why a
rank waits, which collectives stay incomplete, the verdict) is in
:mod:`dpsim.records.trace`; this is the lane's input side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsim.records.groups import DEFAULT_GROUP_NAMES
from dpsim.records.trace import (
    CollectiveRecord,
    ErrorInfo,
    Event,
    EventTuple,
    IncompleteCollective,
    RankState,
    RankTrace,
    Signature,
    SimResult,
    WaitInfo,
    incomplete_collective,
    wait_info,
)


@dataclass(frozen=True)
class Entered:
    """One collective as a rank's log tells it."""

    group: str
    seq: int
    signature: Signature
    contribution: Any
    result: Any
    is_async: bool
    completed: bool
    #: the rank's step count once it had entered (steps stop there if stuck)
    steps: int


@dataclass(frozen=True)
class RankLogData:
    """Everything one rank's log said, parsed."""

    rank: int
    ready: bool
    setup_error: str | None
    files: dict[str, str]
    collectives: tuple[Entered, ...]
    events: tuple[EventTuple, ...]
    #: "finished", "raised", "budget", or None when it never said
    ending: str | None
    returned: Any
    error: ErrorInfo | None
    steps: int
    #: the backend's own words when a collective failed on this rank
    backend_error: str | None


def parse_log(rank: int, path: Path) -> RankLogData:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        lines = []
    ready = False
    setup_error = None
    files: dict[str, str] = {}
    collectives: list[dict[str, Any]] = []
    events: list[EventTuple] = []
    ending = None
    returned = None
    error = None
    steps = 0
    backend_error = None
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            break  # a line cut short by a kill: nothing after it was written
        if "enter" in entry:
            group, seq, kind, op, shape, dtype, src = entry["enter"]
            collectives.append(
                {
                    "group": group,
                    "seq": seq,
                    "signature": Signature(kind, op, tuple(shape or ()), dtype, src),
                    "contribution": entry["contribution"],
                    "result": None,
                    "is_async": entry["is_async"],
                    "completed": False,
                    "steps": entry["steps"],
                }
            )
        elif "exit" in entry:
            collectives[-1].update(result=entry["exit"], completed=True)
        elif "exit_async" in entry:
            # wait() returns for the oldest async collective still open.
            pending = next(item for item in collectives if not item["completed"])
            pending.update(result=entry["exit_async"], completed=True)
        elif "event" in entry:
            kind, after, payload = entry["event"]
            events.append((kind, after, payload))
        elif "ready" in entry:
            ready = True
            files = entry["ready"]["files"]
        elif "setup_error" in entry:
            setup_error = entry["setup_error"]
        elif "collective_error" in entry:
            backend_error = entry["collective_error"]
        elif "finished" in entry:
            ending, steps = "finished", entry["steps"]
            returned = entry["finished"]
        elif "raised" in entry:
            ending, steps = "raised", entry["steps"]
            error = ErrorInfo(**entry["raised"])
        elif "budget" in entry:
            ending, steps = "budget", entry["budget"]
    return RankLogData(
        rank=rank,
        ready=ready,
        setup_error=setup_error,
        files=files,
        collectives=tuple(Entered(**item) for item in collectives),
        events=tuple(events),
        ending=ending,
        returned=returned,
        error=error,
        steps=steps,
        backend_error=backend_error,
    )


def result_from_logs(
    logs: list[RankLogData], group_names: tuple[str, ...] = DEFAULT_GROUP_NAMES
) -> SimResult:
    """The lane's run as a trace, read from its ranks' parsed logs (in rank
    order); ``group_names`` are the run's groups, in the simulator's order."""
    ranks = len(logs)
    members = tuple(range(ranks))
    # How many of each rank's collectives count: all of them, until a
    # mismatched one, which becomes where the rank is stuck. Cutting one rank
    # short can expose no new mismatch (it only removes entries), but it can
    # leave a peer waiting alone; repeat until nothing changes.
    kept = [len(log.collectives) for log in logs]
    stuck_at: list[int | None] = [_first_open(log.collectives) for log in logs]
    while True:
        table = _entries(logs, kept)
        changed = False
        for (group, seq), entries in table.items():
            if len({entry.signature for _, entry in entries}) <= 1:
                continue
            for rank, _entry in entries:
                index = _index_of(logs[rank].collectives, group, seq)
                if kept[rank] > index + 1 or stuck_at[rank] != index:
                    kept[rank] = index + 1
                    stuck_at[rank] = index
                    changed = True
        if not changed:
            break
    table = _entries(logs, kept)
    traces = []
    for log in logs:
        traces.append(_trace(log, kept[log.rank], stuck_at[log.rank], table, members))
    incomplete: list[IncompleteCollective] = []
    for (group, seq), entries in sorted(
        table.items(),
        key=lambda item: (group_names.index(item[0][0]), item[0][1]),
    ):
        entered = {rank for rank, _ in entries}
        mismatched = len({entry.signature for _, entry in entries}) > 1
        open_somewhere = any(
            stuck_at[rank] is not None
            and logs[rank].collectives[stuck_at[rank]].group == group  # type: ignore[index]
            and logs[rank].collectives[stuck_at[rank]].seq == seq  # type: ignore[index]
            for rank, _ in entries
        )
        if len(entered) < ranks or mismatched or open_somewhere:
            incomplete.append(
                incomplete_collective(group, seq, members, entered, mismatched)
            )
    return SimResult.judged(
        tuple(traces),
        (),
        tuple((name, members) for name in group_names),
        tuple(incomplete),
    )


Table = dict[tuple[str, int], list[tuple[int, Entered]]]


def _entries(logs: list[RankLogData], kept: list[int]) -> Table:
    table: Table = {}
    for log in logs:
        for entry in log.collectives[: kept[log.rank]]:
            table.setdefault((entry.group, entry.seq), []).append((log.rank, entry))
    return table


def _first_open(collectives: tuple[Entered, ...]) -> int | None:
    # A blocking collective that never returned is the last one entered; an
    # async one may be followed by others, but its wait() never returned.
    for index, entry in enumerate(collectives):
        if not entry.completed:
            return index
    return None


def _index_of(collectives: tuple[Entered, ...], group: str, seq: int) -> int:
    return next(
        index
        for index, entry in enumerate(collectives)
        if entry.group == group and entry.seq == seq
    )


def _trace(
    log: RankLogData,
    kept: int,
    stuck_at: int | None,
    table: Table,
    members: tuple[int, ...],
) -> RankTrace:
    collectives = log.collectives[:kept]
    records = tuple(
        CollectiveRecord(
            entry.group,
            entry.seq,
            entry.signature,
            entry.contribution,
            # A mismatched collective never completes in the simulator, and
            # must not here, whatever the backend handed back.
            entry.result if index != stuck_at else None,
            entry.is_async,
            entry.completed and index != stuck_at,
        )
        for index, entry in enumerate(collectives)
    )
    events = log.events
    waiting = None
    returned = None
    error = None
    steps = log.steps
    if stuck_at is not None:
        state = RankState.WAITING
        steps = collectives[stuck_at].steps
        # What the rank did after entering where it is stuck happened only
        # because a real backend gave up on it.
        events = tuple(event for event in events if event[1] <= stuck_at)
        waiting = _waiting_in_entry(collectives[stuck_at], table, members)
    elif log.ending == "finished":
        state, returned = RankState.FINISHED, log.returned
    elif log.ending == "raised":
        state, error = RankState.RAISED, log.error
    elif log.ending == "budget":
        state = RankState.BUDGET
    else:
        state = RankState.WAITING
    return RankTrace(
        rank=log.rank,
        state=state,
        returned=returned,
        error=error,
        waiting=waiting,
        steps=steps,
        collectives=records,
        events=Event.all_of(events),
    )


def _waiting_in_entry(
    entry: Entered, table: Table, members: tuple[int, ...]
) -> WaitInfo:
    entries = dict(table.get((entry.group, entry.seq), []))
    return wait_info(
        entry.group,
        entry.seq,
        entry.signature,
        entry.is_async,
        [
            (rank, entries[rank].signature if rank in entries else None)
            for rank in members
        ],
    )
