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
from typing import Any, Final, Generic, Protocol, Self, TypeVar, cast, overload

from dpsim.records.case import RankBatch
from dpsim.records.groups import DP_CPU_GROUP, DP_DEVICE_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import (
    RUNNER_EVENT,
    Agreement,
    Choice,
    Descriptor,
    SyncRecord,
    expect_records,
    recorded_syncs,
)
from dpsim.records.trace import RankTrace, SimResult
from dpsim.terminal import printable

DP_GROUPS = (DP_CPU_GROUP, DP_DEVICE_GROUP)
#: The modes properties compare descriptors with, read once: reading a
#: member off its enum class costs about a function call on Python 3.11, and
#: properties compare a mode for every rank of every phase.
EAGER: Final = CudagraphMode.NONE
FULL_GRAPH: Final = CudagraphMode.FULL

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
        complete = known["complete"] = all(
            record is not None and not record.raised for record in records
        )
        if complete:
            returned = cast(tuple[SyncRecord, ...], records)
            inputs = known["all_inputs"] = tuple([record.inputs for record in returned])
            known["descriptors"] = tuple([record.descriptor for record in returned])
            known["agreements"] = tuple([record.agreement for record in returned])
            known["any_work"] = any(batch.num_tokens > 0 for batch in inputs)
            known["any_reused"] = any(record.reused for record in returned)
        else:
            known["any_work"] = any(
                record is not None and record.inputs.num_tokens > 0
                for record in records
            )
            known["any_reused"] = any(
                record is not None and record.reused for record in records
            )

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
        for trace in self.result.ranks:
            for event in trace.events:
                if event.kind == RUNNER_EVENT:
                    return str(event.payload["runner"])
        return "v2"

    @_once
    def syncs(self) -> tuple[tuple[tuple[int, SyncRecord], ...], ...]:
        """Per rank, each sync it recorded, read off its trace once, with how
        many collectives it had entered before the record."""
        return tuple(tuple(recorded_syncs(trace.events)) for trace in self.result.ranks)

    @_once
    def phases(self) -> tuple[Phase, ...]:
        ranks = len(self.result.ranks)
        by_name: dict[str, list[SyncRecord | None]] = {}
        for trace, syncs in zip(self.result.ranks, self.syncs, strict=True):
            for _, record in syncs:
                slots = by_name.get(record.phase)
                if slots is None:
                    slots = by_name[record.phase] = [None] * ranks
                slots[trace.rank] = record
        return tuple([Phase(name, tuple(records)) for name, records in by_name.items()])

    @_once
    def expected(self) -> dict[str, tuple[Choice, ...]]:
        """Per phase, what a correct sync would choose on each rank (the
        scenario's oracle, :mod:`dpsim.scenarios.expect`), where recorded."""
        return {
            record.phase: record.choices
            for trace in self.result.ranks
            for record in expect_records(trace.events)
        }

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
    for rank, value in enumerate(values):
        if value != values[0]:
            return 0, rank
    return None
