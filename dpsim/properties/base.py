"""How properties judge a run: the evidence they read and the verdicts they give.

A property is a pure function of a case and the simulator's result. It reads
the sync records each rank left (:class:`~dpsim.records.sync.SyncRecord`,
read off the trace once per run and grouped into :class:`Phase` objects: one
sync call made by every rank), the oracle's choices and the simulator's
outcome; it simulates nothing itself. Each property lives in its own module, whose docstring says
what it asserts, why it matters and which upstream bug class it guards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, Final, Generic, Protocol, Self, TypeVar, cast, overload

from dpsim.records.case import RankBatch
from dpsim.records.groups import DP_CPU_GROUP, DP_DEVICE_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import (
    EXPECT_EVENT,
    RUNNER_EVENT,
    SYNC_EVENT,
    WORKER_ERROR_EVENT,
    Agreement,
    Choice,
    Descriptor,
    ExpectRecord,
    SyncRecord,
    expect_records,
    recorded_syncs,
    sync_records,
)
from dpsim.records.trace import Event, RankTrace, SimResult
from dpsim.terminal import printable

DP_GROUPS = (DP_CPU_GROUP, DP_DEVICE_GROUP)
#: The modes properties compare descriptors with, read once: reading a
#: member off its enum class costs about a function call on Python 3.11, and
#: properties compare a mode for every rank of every phase.
EAGER: Final = CudagraphMode.NONE
FULL_GRAPH: Final = CudagraphMode.FULL

_COLUMNS = attrgetter("inputs", "descriptor", "agreement", "error", "reused")
_TOKENS = attrgetter("num_tokens")
_MODE = attrgetter("cg_mode")

_Owner = TypeVar("_Owner")
_Value = TypeVar("_Value")


class _once(Generic[_Owner, _Value]):
    """``functools.cached_property`` without the lock Python 3.11's takes on
    every first read (3.12 dropped it): worked out on first read, then kept
    in the instance's ``__dict__``, where later reads find it first.

    Every judged run reads several of these once each, and 3.11's lock made
    each first read cost about as much as building a phase.
    """

    def __init__(self, make: Callable[[_Owner], _Value]) -> None:
        self.make = make
        self.name = make.__name__
        self.__doc__ = make.__doc__

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> Self: ...
    @overload
    def __get__(self, instance: _Owner, owner: type[Any] | None = None) -> _Value: ...
    def __get__(
        self, instance: _Owner | None, owner: type[Any] | None = None
    ) -> _Value | Self:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.make(instance)
        return value


@dataclass(frozen=True)
class Verdict:
    """A property that failed: where, on which ranks, and why (one line).

    ``ranks`` is the set of ranks involved, kept distinct and ascending
    whatever order a property names them in: the message says who did what,
    and a counterexample file (whose reader allows at most one entry per rank)
    must never list a rank twice.
    """

    property: str
    phase: str | None
    ranks: tuple[int, ...]
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(sorted(set(self.ranks))))

    def __str__(self) -> str:
        # Messages quote a target's own text (an exception message): escaped,
        # so every report that prints a verdict shows it safely.
        where = f" at {self.phase}" if self.phase else ""
        return printable(f"{self.property}{where}: {self.message}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "property": self.property,
            "phase": self.phase,
            "ranks": list(self.ranks),
            "message": self.message,
        }


@dataclass(frozen=True)
class Phase:
    """One sync call as every rank made it (``None`` where a rank never got there)."""

    name: str
    records: tuple[SyncRecord | None, ...]

    #: Every rank made this call and it returned. With it, for a complete
    #: phase, each rank's inputs, descriptor and agreement in rank order
    #: (``all_inputs``, ``descriptors``, ``agreements``): most properties read
    #: all three for every rank of every complete phase, so they are worked
    #: out once, with the phase, in one pass over its records.
    complete: bool = field(init=False, compare=False, repr=False)
    all_inputs: tuple[RankBatch, ...] = field(init=False, compare=False, repr=False)
    descriptors: tuple[Descriptor, ...] = field(init=False, compare=False, repr=False)
    agreements: tuple[Agreement | None, ...] = field(
        init=False, compare=False, repr=False
    )
    #: Some rank has tokens to run; some rank handed this call an earlier
    #: agreement to reuse.
    any_work: bool = field(init=False, compare=False, repr=False)
    any_reused: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # A frozen dataclass refuses setattr; its __dict__ takes the values.
        known = self.__dict__
        records = self.records
        if any(map(is_, records, repeat(None))):
            known["complete"] = False
            known["any_work"] = any(
                record is not None and record.inputs.num_tokens > 0
                for record in records
            )
            known["any_reused"] = any(
                record is not None and record.reused for record in records
            )
            return
        returned = cast(tuple[SyncRecord, ...], records)
        # Transposed in C (map, zip): every judged phase is made here. A
        # record raised when it has an error (SyncRecord.raised), read here
        # as a column.
        inputs, descriptors, agreements, errors, reused = tuple(
            zip(*map(_COLUMNS, returned), strict=True)
        ) or ((), (), (), (), ())
        complete = known["complete"] = errors.count(None) == len(errors)
        if complete:
            known["all_inputs"] = inputs
            known["descriptors"] = descriptors
            known["agreements"] = agreements
        known["any_work"] = bool(inputs) and max(map(_TOKENS, inputs)) > 0
        known["any_reused"] = any(reused)

    @classmethod
    def of(cls, name: str, records: tuple[SyncRecord | None, ...]) -> Phase:
        """Same as the constructor, without a frozen ``__setattr__`` per
        field: the judge makes every phase of every run."""
        phase = object.__new__(cls)
        known = phase.__dict__
        known["name"] = name
        known["records"] = records
        phase.__post_init__()
        return phase

    def inputs(self, rank: int) -> RankBatch:
        record = self.records[rank]
        assert record is not None
        return record.inputs

    def descriptor(self, rank: int) -> Descriptor:
        record = self.records[rank]
        assert record is not None and record.descriptor is not None
        return record.descriptor

    def agreement(self, rank: int) -> Agreement | None:
        record = self.records[rank]
        assert record is not None
        return record.agreement

    @_once
    def modes(self) -> tuple[CudagraphMode, ...]:
        """Each rank's descriptor's mode, in rank order (a complete phase's)."""
        return tuple(map(_MODE, self.descriptors))

    @_once
    def padded_counts(self) -> tuple[int, ...]:
        """Each rank's descriptor's token count, in rank order (a complete
        phase's): what ``agreement`` and ``padded-counts`` compare."""
        return tuple(map(_TOKENS, self.descriptors))

    @_once
    def agreements_differ(self) -> tuple[int, int] | None:
        """The first rank whose agreement differs from rank 0's, as (0, rank),
        or None (a complete phase's): ``agreement`` reports it and
        ``agreed-values`` judges only phases without one, so it is compared
        once."""
        agreements = self.agreements
        first = agreements[0]
        if first is not None:
            # Compared field by field by their __dict__s, in one C call: the
            # dataclass __eq__ builds two tuples per comparison, and this is
            # the judge's most frequent one. Equal __dict__s of one class mean
            # equal fields; anything else is left to __eq__.
            known = first.__dict__
            kind = type(first)
            for rank, agreement in enumerate(agreements):
                if type(agreement) is kind and agreement.__dict__ == known:
                    continue
                if agreement != first:
                    return 0, rank
            return None
        return first_difference(agreements)


class JudgedCase(Protocol):
    """What properties read of a case: the sync lane's :class:`Case` and the
    runner lane's ``RunnerCase`` both answer it."""

    @property
    def scenario(self) -> str: ...
    @property
    def policy(self) -> CapturePolicy: ...
    @property
    def dp_size(self) -> int: ...


@dataclass(frozen=True)
class Evidence:
    """What a property may look at."""

    case: JudgedCase
    result: SimResult

    @_once
    def runner(self) -> str:
        """The model runner whose sync made this trace: "v1" or "v2"."""
        return cast(str, self._read_events()["runner"])

    @_once
    def syncs(self) -> tuple[tuple[tuple[int, SyncRecord], ...], ...]:
        """Per rank, each sync it recorded, read off its trace once, with how
        many collectives it had entered before the record."""
        return tuple(tuple(recorded_syncs(trace.events)) for trace in self.result.ranks)

    @_once
    def solo_calls(self) -> bool:
        """Some rank made a sync call inside ``skip_dp_coordination()``."""
        return cast(bool, self._read_events()["solo_calls"])

    @_once
    def worker_errors(self) -> tuple[tuple[int, Event], ...]:
        """Each error a rank's executor kept in a future, as (rank, event),
        in rank order."""
        return cast(tuple[tuple[int, Event], ...], self._read_events()["worker_errors"])

    @_once
    def expected(self) -> dict[str, tuple[Choice, ...]]:
        """Per phase, what a correct sync would choose on each rank (the
        scenario's oracle, :mod:`dpsim.scenarios.expect`), where recorded."""
        return cast(dict[str, tuple[Choice, ...]], self._read_events()["expected"])

    @_once
    def phases(self) -> tuple[Phase, ...]:
        slots: dict[str, list[SyncRecord | None]] = self._read_events()["_slots"]
        return tuple(
            [Phase.of(name, tuple(records)) for name, records in slots.items()]
        )

    def _read_events(self) -> dict[str, Any]:
        """Every rank's events, read in one pass for what properties read of
        them: the runner's mark, the phase slot each sync fills, whether any
        call was solo, errors kept by an executor and the oracle's records.
        Kept in ``__dict__``, where the attributes above find them.

        Each of these was a walk over every event of every rank of its own,
        and the judge reads them all for every run.
        """
        known = self.__dict__
        if "_slots" in known:
            return known
        ranks = self.result.ranks
        size = len(ranks)
        runner: str | None = None
        solo = False
        worker_errors: list[tuple[int, Event]] = []
        expected: dict[str, tuple[Choice, ...]] = {}
        slots_by_phase: dict[str, list[SyncRecord | None]] = {}
        for trace in ranks:
            rank = trace.rank
            for event in trace.events:
                kind = event.kind
                if kind == SYNC_EVENT:
                    # The record a simulated rank kept, as recorded_syncs
                    # hands it back; anything else read by it.
                    kept = event.kept
                    record = (
                        kept if type(kept) is SyncRecord else sync_records((event,))[0]
                    )
                    slots = slots_by_phase.get(record.phase)
                    if slots is None:
                        slots = slots_by_phase[record.phase] = [None] * size
                    slots[rank] = record
                    if record.solo:
                        solo = True
                elif kind == EXPECT_EVENT:
                    kept = event.kept
                    oracle = (
                        kept
                        if type(kept) is ExpectRecord
                        else next(expect_records((event,)))
                    )
                    expected[oracle.phase] = oracle.choices
                elif kind == WORKER_ERROR_EVENT:
                    worker_errors.append((rank, event))
                elif kind == RUNNER_EVENT and runner is None:
                    runner = str(event.payload["runner"])
        known["runner"] = "v2" if runner is None else runner
        known["solo_calls"] = solo
        known["worker_errors"] = tuple(worker_errors)
        known["expected"] = expected
        known["_slots"] = slots_by_phase
        return known

    @_once
    def complete_phases(self) -> tuple[Phase, ...]:
        # Read by most properties of every judged run: worked out once.
        return tuple(phase for phase in self.phases if phase.complete)

    def syncs_and_their_collectives(
        self, trace: RankTrace
    ) -> Iterator[tuple[SyncRecord, Callable[[], tuple[Any, ...]]]]:
        """Each sync one rank recorded, with a function giving the collectives
        it entered since the previous sync (that sync's forward included): the
        ones on a DP group are the sync's own.

        A function, called only for the syncs a property looks into: the first
        read of a rank's collectives builds every record of the rank, which
        costs more than judging a run whose syncs need none of them.
        """
        entered_before = 0
        for after_collectives, record in self.syncs[trace.rank]:
            yield record, _entered(trace, entered_before, after_collectives)
            entered_before = after_collectives


def _entered(trace: RankTrace, start: int, stop: int) -> Callable[[], tuple[Any, ...]]:
    return lambda: trace.collectives[start:stop]


def on_dp_group(collectives: tuple[Any, ...]) -> bool:
    return any(record.group in DP_GROUPS for record in collectives)


Judge = Callable[[Evidence], "Verdict | None"]


@dataclass(frozen=True)
class Property:
    """A named invariant: ``judge`` returns a verdict when it does not hold."""

    name: str
    summary: str
    guards: str
    judge: Judge
    #: Why the property says nothing about the V1 runner's coordination, when
    #: it does not apply there; such a property is not run on V1 traces.
    not_for_v1: str | None = None

    def applies_to(self, runner: str) -> bool:
        return runner != "v1" or self.not_for_v1 is None

    def check(self, evidence: Evidence) -> Verdict | None:
        return self.judge(evidence)


def first_difference(values: Sequence[Any]) -> tuple[int, int] | None:
    """The first rank whose value differs from rank 0's, as (0, rank)."""
    if not values or values.count(values[0]) == len(values):
        # All alike, the usual answer, in one C loop (count compares by
        # identity, then ==; the values compared here are ints, agreements
        # and None, for which that is != inverted).
        return None
    for rank, value in enumerate(values):
        if value != values[0]:
            return 0, rank
    return None
