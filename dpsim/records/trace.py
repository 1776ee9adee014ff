"""The trace: what one run leaves behind, rank by rank, and the run's verdict.

Both lanes produce it (the simulator from its scheduler's state, the real lane
from its ranks' logs), properties judge it and nothing else, and
counterexample files and reports store it. So it holds only plain,
deterministic data: no tensors, no rendered text, no addresses or wall-clock
times, and ``to_dict()`` / ``to_json()`` give the same bytes for the same run
in any process. The functions at the end (:func:`wait_info`,
:func:`incomplete_collective`, :meth:`SimResult.judged`) are the part of
building a trace that both lanes share, so both diagnose a run alike.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Container, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

_T = TypeVar("_T")


class _FilledOnRead:
    """A dataclass field an instance may leave out of its ``__dict__``: its
    value is then worked out by ``fill(instance)`` on first read and kept
    there, where later reads find it first.

    A descriptor, not ``__getattr__``: a class with ``__getattr__`` has
    every attribute read take Python's slow generic path (about 60 ns more
    on 3.11, whatever the attribute), and the judge reads events' and
    traces' fields for every rank of every case. Read on the class it raises
    AttributeError, so the dataclass gives the field no default.
    """

    def __init__(self, fill: Callable[[Any], Any]) -> None:
        self.fill = fill

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            raise AttributeError(self.name)
        value = instance.__dict__[self.name] = self.fill(instance)
        return value


def _missing(instance: object, name: str) -> AttributeError:
    return AttributeError(
        f"{type(instance).__name__!r} object has no attribute {name!r}"
    )


def _blank(cls: type[_T]) -> _T:
    """An instance of a frozen dataclass whose fields the caller fills in.

    A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and the simulator builds one record per collective
    per rank after every run, so it fills ``__dict__`` instead. The classes
    using this have no ``__post_init__`` and no defaults, so that gives an
    equal object.
    """
    return object.__new__(cls)


class Outcome(StrEnum):
    """The run's verdict, one word; see :data:`OUTCOME_PRECEDENCE`."""

    OK = "ok"
    CRASH = "crash"
    BUDGET = "budget"
    MISMATCH = "mismatch"
    HANG = "hang"


#: When several things went wrong, the run's outcome is the first that applies.
#: Rank-local faults come before joint ones because they are causes, and the
#: joint ones are usually their consequences: a rank that raised or spun forever
#: leaves its peers waiting, which would otherwise read as a hang. A mismatch
#: names the disagreeing collective, so it beats a plain hang, which says only
#: that something never completed. Every rank's own state is in the trace
#: whatever the outcome.
OUTCOME_PRECEDENCE: tuple[Outcome, ...] = (
    Outcome.CRASH,  # some rank raised out of its program
    Outcome.BUDGET,  # some rank exceeded its step budget and was stopped
    Outcome.MISMATCH,  # members of one collective entered it with different signatures
    Outcome.HANG,  # some collective never completed (a rank waits in it, or an async one was left unmatched)
    Outcome.OK,  # every rank finished and every collective completed
)


class RankState(StrEnum):
    """Where a rank stands when no rank can run any more."""

    FINISHED = "finished"  # its program returned
    RAISED = "raised"  # its program raised an exception
    WAITING = (
        "waiting"  # blocked in a collective (or a wait() on one) that never completed
    )
    BUDGET = "budget"  # stopped for exceeding its step budget


@dataclass(frozen=True)
class Signature:
    """What members of one collective must agree on for it to complete."""

    kind: str  # all_reduce, all_gather, all_gather_into_tensor, broadcast, barrier
    op: str | None  # reduce op name for all_reduce, else None
    shape: tuple[int, ...]
    dtype: str | None  # e.g. "torch.int32"; None for barrier
    src: int | None  # global source rank for broadcast, else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "op": self.op,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "src": self.src,
        }


class CollectiveSource(Protocol):
    """Where a lazily built record takes its ``contribution`` and ``result`` from."""

    def contribution(self, position: int) -> Any: ...

    def result_value(self) -> Any: ...


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective a rank entered, in the order it entered them.

    ``contribution`` is the rank's input when it entered (for async ops, taken
    at call time); ``result`` is what the collective wrote back into this rank's
    tensor, or None if it never completed. Both are nested lists as
    ``Tensor.tolist()`` gives them; they must not be mutated (a result list is
    shared between ranks).

    The simulator builds records with :meth:`lazy`, which leaves both fields
    to be converted from tensors on first access and then kept: a contribution
    is O(members) values, so converting every record of an N-rank run up front
    costs O(N^2) whether anyone reads them or not. Equality, ``repr``,
    ``to_dict()`` and JSON see the same lists either way.
    """

    group: str
    seq: int  # this collective's number in its group, counted from 0
    signature: Signature
    contribution: Any
    result: Any
    is_async: bool
    completed: bool

    @classmethod
    def unchecked(
        cls,
        group: str,
        seq: int,
        signature: Signature,
        contribution: Any,
        result: Any,
        is_async: bool,
        completed: bool,
    ) -> CollectiveRecord:
        """Same as the constructor, several times faster; see :func:`_blank`."""
        record = _blank(cls)
        fields = record.__dict__
        fields["group"] = group
        fields["seq"] = seq
        fields["signature"] = signature
        fields["contribution"] = contribution
        fields["result"] = result
        fields["is_async"] = is_async
        fields["completed"] = completed
        return record

    @classmethod
    def lazy(
        cls,
        group: str,
        seq: int,
        signature: Signature,
        source: CollectiveSource,
        position: int,
        is_async: bool,
        completed: bool,
    ) -> CollectiveRecord:
        """A record whose contribution and result ``source`` gives when first read.

        ``source`` must give the same values whenever asked.
        """
        record = _blank(cls)
        fields = record.__dict__
        fields["group"] = group
        fields["seq"] = seq
        fields["signature"] = signature
        fields["is_async"] = is_async
        fields["completed"] = completed
        fields[_LAZY] = (source, position)
        return record

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes not in __dict__: a lazy record's
        # contribution or result not read yet. Converted once, then kept.
        lazy = self.__dict__.get(_LAZY)
        if lazy is not None:
            source, position = lazy
            if name == "contribution":
                value = self.__dict__[name] = source.contribution(position)
                return value
            if name == "result":
                value = self.__dict__[name] = source.result_value()
                return value
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}"
        )

    def __getstate__(self) -> dict[str, Any]:
        # Pickle and copy the plain record, not the tensors it was built from.
        return {name: getattr(self, name) for name in _RECORD_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            **self.signature.to_dict(),
            "contribution": self.contribution,
            "result": self.result,
            "async": self.is_async,
            "completed": self.completed,
        }


#: Key in a lazy record's ``__dict__`` of its (source, position)
_LAZY = "_lazy_source"
_RECORD_FIELDS = tuple(field.name for field in dataclasses.fields(CollectiveRecord))


class JsonRecord(Protocol):
    """A typed record an event can carry in place of its JSON payload."""

    def to_json(self) -> dict[str, Any]: ...


#: What a program hands its world to record: the event's JSON payload, or a
#: record that writes it (``Event.kept``).
Payload = dict[str, Any] | JsonRecord

#: An event as a lane keeps it while running or reads it from a log:
#: (kind, collectives entered before it, payload).
EventTuple = tuple[str, int, Payload]


def payload_json(payload: Payload) -> dict[str, Any]:
    """The JSON form of a recorded payload, for a lane that writes it out."""
    return payload if isinstance(payload, dict) else payload.to_json()


@dataclass(frozen=True)
class Event:
    """Something the program recorded about itself (``dpsim.sim.record`` in the
    simulator, the rank's world in the real lane).

    An event recorded as a typed record (every sync of every rank, and the
    oracle's choices) keeps that record (``kept``) and writes its JSON
    ``payload`` on first read: a run is judged in the process that ran it,
    from the records, and writing the JSON of every sync cost about a
    twelfth of running and judging an 8-rank case whose trace nobody wrote
    out. Equality, ``repr``, pickling and ``to_dict()`` see the payload.
    """

    kind: str
    #: How many collectives this rank had entered before the event, so an event
    #: can be placed between collective records.
    after_collectives: int
    #: Written from ``kept`` on first read where the lane recorded a record.
    payload: dict[str, Any] = _FilledOnRead(  # type: ignore[assignment]
        lambda event: _written_payload(event)
    )
    #: The record this event's payload is the JSON of, when the lane recorded
    #: one (else None: read the payload). Not a field: an attribute the
    #: judge reads for every sync, so no call, and no part of the event's
    #: value (equality, pickling) beyond the payload it writes.
    kept: ClassVar[JsonRecord | None] = None

    @classmethod
    def all_of(cls, raw: Sequence[EventTuple]) -> tuple[Event, ...]:
        """A rank's events, from the tuples both lanes keep while running."""
        return tuple([cls.of(*event) for event in raw]) if raw else ()

    @classmethod
    def of(cls, kind: str, after_collectives: int, payload: Payload) -> Event:
        """The event of one recorded tuple; see :func:`_blank`."""
        event = _blank(cls)
        fields = event.__dict__
        fields["kind"] = kind
        fields["after_collectives"] = after_collectives
        if isinstance(payload, dict):
            fields["payload"] = payload
        else:
            fields["kept"] = payload
        return event

    def __getstate__(self) -> dict[str, Any]:
        # Pickle and copy the plain event, its payload written.
        return {
            "kind": self.kind,
            "after_collectives": self.after_collectives,
            "payload": self.payload,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "after_collectives": self.after_collectives,
            "payload": self.payload,
        }


def _written_payload(event: Event) -> dict[str, Any]:
    kept = event.__dict__.get("kept")
    if kept is None:
        raise _missing(event, "payload")
    return kept.to_json()


@dataclass(frozen=True)
class ErrorInfo:
    """An exception that escaped a rank's program, without memory addresses."""

    type: str
    message: str
    where: str  # innermost frame, "file.py:LINE in function"
    #: Set when the exception came from dpsim's side of its boundary with the
    #: target (:func:`dpsim.boundary.fault_of`): why it is dpsim's and where
    #: it stood. Such an error is never a verdict; a run that has one is
    #: refused. None for the target's own exception.
    fault: str | None = None

    @property
    def origin(self) -> str:
        """``"dpsim"`` or ``"vllm"``: whose side of the boundary raised it."""
        return "vllm" if self.fault is None else "dpsim"

    def to_dict(self) -> dict[str, Any]:
        data = {"type": self.type, "message": self.message, "where": self.where}
        if self.fault is not None:
            # Only then: a trace of the target's own errors keeps its bytes.
            data["fault"] = self.fault
        return data


@dataclass(frozen=True)
class Peer:
    """Another member of the collective a rank is stuck in, and how it stands there."""

    rank: int
    #: The peer's signature when it entered with a different one than this
    #: rank; None when it has not entered at all.
    entered_as: Signature | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "entered_as": None
            if self.entered_as is None
            else self.entered_as.to_dict(),
        }


@dataclass(frozen=True)
class WaitInfo:
    """The collective a rank is stuck in, and why it cannot complete."""

    group: str
    seq: int
    signature: Signature  # as this rank entered it
    is_async: bool  # stuck in wait() on an async op rather than in the call
    missing: tuple[int, ...]  # members that never entered
    disagreeing: tuple[Peer, ...]  # members that entered with another signature

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            **self.signature.to_dict(),
            "async": self.is_async,
            "missing": list(self.missing),
            "disagreeing": [peer.to_dict() for peer in self.disagreeing],
        }


@dataclass(frozen=True)
class RankTrace:
    """Everything one virtual rank did, and where it ended.

    ``collectives`` may be built on first access (see :meth:`lazy`): most
    readers of a run (properties, the checker) look only at its states and
    events.
    """

    rank: int
    state: RankState
    returned: Any  # the program's return value (None unless FINISHED)
    error: ErrorInfo | None  # set when RAISED
    waiting: WaitInfo | None  # set when WAITING
    steps: int  # ticks plus collectives entered, as counted against the budget
    #: Built on first read where the trace was made by :meth:`lazy`.
    collectives: tuple[CollectiveRecord, ...] = _FilledOnRead(  # type: ignore[assignment]
        lambda trace: _built_collectives(trace)
    )
    events: tuple[Event, ...]  # type: ignore[misc]  # (see collectives)

    @classmethod
    def unchecked(
        cls,
        rank: int,
        state: RankState,
        returned: Any,
        error: ErrorInfo | None,
        waiting: WaitInfo | None,
        steps: int,
        collectives: tuple[CollectiveRecord, ...],
        events: tuple[Event, ...],
    ) -> RankTrace:
        """Same as the constructor, several times faster; see :func:`_blank`."""
        trace = _blank(cls)
        fields = trace.__dict__
        fields["rank"] = rank
        fields["state"] = state
        fields["returned"] = returned
        fields["error"] = error
        fields["waiting"] = waiting
        fields["steps"] = steps
        fields["collectives"] = collectives
        fields["events"] = events
        return trace

    @classmethod
    def lazy(
        cls,
        rank: int,
        state: RankState,
        returned: Any,
        error: ErrorInfo | None,
        waiting: WaitInfo | None,
        steps: int,
        collectives: Callable[[], tuple[CollectiveRecord, ...]],
        events: tuple[Event, ...],
    ) -> RankTrace:
        """Like :meth:`unchecked`, with ``collectives()`` called on first access.

        ``collectives`` must give equal records whenever called.
        """
        # _blank(cls) without its call: the simulator makes one per rank per run.
        trace = object.__new__(cls)
        fields = trace.__dict__
        fields["rank"] = rank
        fields["state"] = state
        fields["returned"] = returned
        fields["error"] = error
        fields["waiting"] = waiting
        fields["steps"] = steps
        fields[_LAZY_COLLECTIVES] = collectives
        fields["events"] = events
        return trace

    def __getstate__(self) -> dict[str, Any]:
        # Pickle and copy the plain trace, not the run's log it was built from.
        return {name: getattr(self, name) for name in _TRACE_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "state": self.state.value,
            "returned": self.returned,
            "error": None if self.error is None else self.error.to_dict(),
            "waiting": None if self.waiting is None else self.waiting.to_dict(),
            "steps": self.steps,
            "collectives": [record.to_dict() for record in self.collectives],
            "events": [event.to_dict() for event in self.events],
        }


#: Key in a lazy trace's ``__dict__`` of the function that builds its records
_LAZY_COLLECTIVES = "_lazy_collectives"


def _built_collectives(trace: RankTrace) -> tuple[CollectiveRecord, ...]:
    make = trace.__dict__.pop(_LAZY_COLLECTIVES, None)
    if make is None:
        raise _missing(trace, "collectives")
    collectives: tuple[CollectiveRecord, ...] = make()
    return collectives


_TRACE_FIELDS = tuple(field.name for field in dataclasses.fields(RankTrace))


@dataclass(frozen=True)
class IncompleteCollective:
    """A collective that some but not all members entered, or that they disagreed on."""

    group: str
    seq: int
    entered: tuple[int, ...]
    missing: tuple[int, ...]
    mismatched: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            "entered": list(self.entered),
            "missing": list(self.missing),
            "mismatched": self.mismatched,
        }


def decide_outcome(
    states: Collection[RankState], incomplete: Collection[IncompleteCollective]
) -> Outcome:
    """The run's outcome from its ranks' end states and unfinished collectives,
    by :data:`OUTCOME_PRECEDENCE`. The simulator and the real lane both call
    this, so they judge a run the same way."""
    if RankState.RAISED in states:
        return Outcome.CRASH
    if RankState.BUDGET in states:
        return Outcome.BUDGET
    if any(item.mismatched for item in incomplete):
        return Outcome.MISMATCH
    if incomplete or RankState.WAITING in states:
        return Outcome.HANG
    return Outcome.OK


def wait_info(
    group: str,
    seq: int,
    signature: Signature,
    is_async: bool,
    members: Iterable[tuple[int, Signature | None]],
) -> WaitInfo:
    """Why a rank that entered collective ``group#seq`` as ``signature`` is stuck.

    ``members`` are the collective's members in group order, each with the
    signature it entered with, or None if it never entered: those are missing,
    and those that entered otherwise disagree.
    """
    missing = []
    disagreeing = []
    for member, entered_as in members:
        if entered_as is None:
            missing.append(member)
        elif entered_as != signature:
            disagreeing.append(Peer(member, entered_as))
    return WaitInfo(
        group=group,
        seq=seq,
        signature=signature,
        is_async=is_async,
        missing=tuple(missing),
        disagreeing=tuple(disagreeing),
    )


def incomplete_collective(
    group: str,
    seq: int,
    members: tuple[int, ...],
    entered: Container[int],
    mismatched: bool,
) -> IncompleteCollective:
    """Collective ``group#seq``, which the ``entered`` of its ``members`` entered
    and which never completed; both lists keep the group's member order."""
    return IncompleteCollective(
        group,
        seq,
        tuple(member for member in members if member in entered),
        tuple(member for member in members if member not in entered),
        mismatched,
    )


@dataclass(frozen=True)
class SimResult:
    """A whole run: verdict, per-rank traces, and the choices that replay it."""

    outcome: Outcome
    ranks: tuple[RankTrace, ...]
    #: The rank picked at every scheduling point that had more than one
    #: runnable rank; feed to ``ReplayChooser`` to rerun this exact interleaving.
    choices: tuple[int, ...]
    groups: tuple[tuple[str, tuple[int, ...]], ...]  # name -> member global ranks
    incomplete: tuple[IncompleteCollective, ...]

    @classmethod
    def unchecked(
        cls,
        outcome: Outcome,
        ranks: tuple[RankTrace, ...],
        choices: tuple[int, ...],
        groups: tuple[tuple[str, tuple[int, ...]], ...],
        incomplete: tuple[IncompleteCollective, ...],
    ) -> SimResult:
        """Same as the constructor, several times faster; see :func:`_blank`."""
        result = _blank(cls)
        fields = result.__dict__
        fields["outcome"] = outcome
        fields["ranks"] = ranks
        fields["choices"] = choices
        fields["groups"] = groups
        fields["incomplete"] = incomplete
        return result

    @classmethod
    def judged(
        cls,
        ranks: tuple[RankTrace, ...],
        choices: tuple[int, ...],
        groups: tuple[tuple[str, tuple[int, ...]], ...],
        incomplete: tuple[IncompleteCollective, ...],
    ) -> SimResult:
        """The run these traces make up, its outcome decided by
        :func:`decide_outcome`: how both lanes finish building a result."""
        outcome = decide_outcome({trace.state for trace in ranks}, incomplete)
        return cls.unchecked(outcome, ranks, choices, groups, incomplete)

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "ranks": [trace.to_dict() for trace in self.ranks],
            "choices": list(self.choices),
            "groups": {name: list(members) for name, members in self.groups},
            "incomplete": [item.to_dict() for item in self.incomplete],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(
            self.to_dict(), sort_keys=True, indent=indent, separators=(",", ":")
        )

    def returns(self) -> list[Any]:
        """Every rank's return value, in rank order."""
        return [trace.returned for trace in self.ranks]
