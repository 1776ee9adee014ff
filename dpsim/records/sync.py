"""What the trace keeps of a sync call and of the oracle, as frozen records.

Every sync a rank makes leaves a :class:`SyncRecord` (phase, what it passed,
and either what it chose and agreed or the exception it raised); rank 0 leaves
an :class:`ExpectRecord` per judged step (what a correct sync would choose).
Properties and reports read these typed values. The trace carries them as
JSON objects, because the replay lane's ranks write their events to logs and
counterexample files store traces: ``to_json()`` gives that form key for key,
and ``from_json()`` reads it back once per trace, when a run is judged. A
simulated rank records the record itself (``to_event()``): its trace writes
the JSON only when read, and the judge takes the record back unparsed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Protocol, Self, TypeVar

from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode
from dpsim.records.trace import Payload

#: The trace event kinds these records travel as.
SYNC_EVENT = "sync"
EXPECT_EVENT = "expect"
#: The event a V1 rank's program leaves first, ``{"runner": "v1"}``; a trace
#: without one is a V2 trace, as every trace written before V1 was.
RUNNER_EVENT = "runner"
#: The runner lane's note, just before a sync record, that the call was
#: handed an agreement other than the rank's latest fresh one (0.32+'s
#: drafter decode reuses one it derives from it): ``{"agreement": ...}``, the
#: agreement handed in. The sync lane never leaves one.
REUSE_GIVEN_EVENT = "reuse_given"
#: The runner lane's record of an exception vLLM's executor kept in a future
#: (a non-blocking ``execute_model`` / ``sample_tokens`` that raised), which
#: the engine loop only re-raises when it pops that batch, often after its
#: peers already wait for it: ``{"error": "Type: message", "where": ...}``.
WORKER_ERROR_EVENT = "worker_error"

_T = TypeVar("_T")
_MODES = {mode.value: mode for mode in CudagraphMode}


def _filled(cls: type[_T], data: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` holding exactly ``data``.

    Every sync of every rank is read back once per run, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``;
    filling ``__dict__`` gives an equal object, for classes without
    ``__post_init__``, once the keys are exactly the fields. Callers then
    replace the values whose JSON form is not the field's type.
    """
    if data.keys() != _FIELD_SETS[cls]:
        raise ValueError(f"{cls.__name__} with keys {sorted(data)}")
    record = object.__new__(cls)
    record.__dict__.update(data)
    return record


def _json_fields(record: Any) -> dict[str, Any]:
    """A flat record's fields by name, in declaration order (the JSON key order).

    Read from the instance's ``__dict__``, where a frozen dataclass (and
    :func:`_filled`) keeps every field: written for every sync of every rank.
    """
    values = record.__dict__
    return {name: values[name] for name in _FIELD_NAMES[type(record)]}


class _WithMode:
    """A flat record with a cudagraph mode: its JSON is its fields in order,
    the mode by name."""

    cg_mode: CudagraphMode

    def to_json(self) -> dict[str, Any]:
        data = _json_fields(self)
        data["cg_mode"] = self.cg_mode.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        record = _filled(cls, data)
        record.__dict__["cg_mode"] = _MODES[data["cg_mode"]]
        return record


@dataclass(frozen=True)
class Descriptor(_WithMode):
    """A ``BatchExecutionDescriptor`` as plain values (fields a version lacks: default)."""

    cg_mode: CudagraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1

    @classmethod
    def unchecked(
        cls,
        cg_mode: CudagraphMode,
        num_tokens: int,
        num_reqs: int | None,
        uniform_token_count: int | None,
        max_query_len: int | None,
        num_active_loras: int,
        num_ubatches: int,
    ) -> Descriptor:
        """Same as the constructor with every field given, without a frozen
        ``__setattr__`` per field: one is made for every sync of every rank."""
        record = object.__new__(cls)
        fields = record.__dict__
        fields["cg_mode"] = cg_mode
        fields["num_tokens"] = num_tokens
        fields["num_reqs"] = num_reqs
        fields["uniform_token_count"] = uniform_token_count
        fields["max_query_len"] = max_query_len
        fields["num_active_loras"] = num_active_loras
        fields["num_ubatches"] = num_ubatches
        return record


@dataclass(frozen=True)
class Agreement:
    """What a sync call agreed, whether the version returns a ``DPSyncState`` or a tensor.

    Fields the version does not report are None. ``cg_mode`` and ``ubatch``
    are the V1 runner's: the cudagraph mode ``coordinate_batch_across_dp``
    synced (0.13 and later) and whether it decided to microbatch. Their JSON
    keys are written only when set, so a V2 agreement reads and writes exactly
    as it did before V1 existed.

    ``max_query_len`` is the agreed query-length bound (0.34+), where None is
    an answer (some rank has no bound), so ``reports_max_query_len`` says
    whether the version agrees one at all; its JSON key is written exactly
    when it does.
    """

    num_tokens_across_dp: tuple[int, ...]
    uniform_token_count: int | None = None
    eager: bool | None = None
    num_reqs: int | None = None
    skip_drafts: bool | None = None
    cg_mode: CudagraphMode | None = None
    ubatch: bool | None = None
    max_query_len: int | None = None
    reports_max_query_len: bool = False

    @classmethod
    def unchecked(
        cls,
        num_tokens_across_dp: tuple[int, ...],
        uniform_token_count: int | None,
        eager: bool | None,
        num_reqs: int | None,
        skip_drafts: bool | None,
        max_query_len: int | None = None,
        reports_max_query_len: bool = False,
    ) -> Agreement:
        """Same as the constructor with the V2 fields given (the V1 runner's
        left None), without a frozen ``__setattr__`` per field."""
        record = object.__new__(cls)
        fields = record.__dict__
        fields["num_tokens_across_dp"] = num_tokens_across_dp
        fields["uniform_token_count"] = uniform_token_count
        fields["eager"] = eager
        fields["num_reqs"] = num_reqs
        fields["skip_drafts"] = skip_drafts
        fields["cg_mode"] = None
        fields["ubatch"] = None
        fields["max_query_len"] = max_query_len
        fields["reports_max_query_len"] = reports_max_query_len
        return record

    def to_json(self) -> dict[str, Any]:
        data = _json_fields(self)
        data["num_tokens_across_dp"] = list(self.num_tokens_across_dp)
        for optional in _V1_AGREEMENT_FIELDS:
            if data[optional] is None:
                del data[optional]
        if self.cg_mode is not None:
            data["cg_mode"] = self.cg_mode.value
        if not data.pop("reports_max_query_len"):
            del data["max_query_len"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Agreement:
        complete = (
            {name: None for name in _V1_AGREEMENT_FIELDS}
            | {"max_query_len": None}
            | data
            | {"reports_max_query_len": "max_query_len" in data}
        )
        agreement = _filled(cls, complete)
        counts = tuple(data["num_tokens_across_dp"])
        agreement.__dict__["num_tokens_across_dp"] = counts
        if complete["cg_mode"] is not None:
            agreement.__dict__["cg_mode"] = _MODES[complete["cg_mode"]]
        return agreement


#: Agreement fields only the V1 runner reports, absent from JSON when None.
_V1_AGREEMENT_FIELDS = ("cg_mode", "ubatch")


@dataclass(frozen=True)
class SyncRecord:
    """One sync call as one rank made it.

    Exactly one of two things happened: the call returned (``descriptor`` is
    what the rank runs, ``agreement`` what the ranks agreed, None when the
    version agreed nothing) or it raised (``error`` is ``"Type: message"``,
    and there is no descriptor or agreement).
    """

    phase: str
    inputs: RankBatch
    #: The call was handed an earlier agreement to reuse (the drafter's prefill).
    reused: bool
    #: The call was made inside ``skip_dp_coordination()``.
    solo: bool
    descriptor: Descriptor | None = None
    agreement: Agreement | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if (self.error is None) == (self.descriptor is None):
            raise ValueError(
                "a sync record has either a descriptor (it returned) "
                "or an error (it raised), not both or neither"
            )

    @classmethod
    def returned(
        cls,
        phase: str,
        inputs: RankBatch,
        reused: bool,
        solo: bool,
        descriptor: Descriptor,
        agreement: Agreement | None,
    ) -> SyncRecord:
        """The record of a call that returned ``descriptor``: the constructor's
        record without its either-or check, which a given descriptor and no
        error pass by construction (one is made for every sync of every rank)."""
        record = object.__new__(cls)
        fields = record.__dict__
        fields["phase"] = phase
        fields["inputs"] = inputs
        fields["reused"] = reused
        fields["solo"] = solo
        fields["descriptor"] = descriptor
        fields["agreement"] = agreement
        fields["error"] = None
        return record

    @property
    def raised(self) -> bool:
        return self.error is not None

    def to_event(self) -> Payload:
        """What a rank records of this call: the record itself, whose JSON
        the trace writes when read (:class:`~dpsim.records.trace.Event`) and
        :func:`recorded_syncs` hands back as it is; its JSON at once when
        the inputs are not a :class:`RankBatch` (any other
        :class:`~dpsim.records.case.SyncInputs` reads back as one, so the
        record read back would not be this one)."""
        if type(self.inputs) is RankBatch:
            return self
        return self.to_json()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "phase": self.phase,
            "inputs": self.inputs.to_dict(),
            "reused": self.reused,
            "solo": self.solo,
        }
        if self.descriptor is None:
            data["error"] = self.error
            return data
        data["descriptor"] = self.descriptor.to_json()
        data["agreement"] = None if self.agreement is None else self.agreement.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SyncRecord:
        """Read back what :meth:`to_json` wrote; ValueError on anything else."""
        try:
            raised = "error" in data
            if data.keys() != (_RAISED_KEYS if raised else _RETURNED_KEYS):
                raise ValueError(f"keys {sorted(data)}")
            record = object.__new__(cls)
            fields = record.__dict__
            fields.update(data)
            fields["inputs"] = _filled(RankBatch, RankBatch.completed(data["inputs"]))
            if raised:
                if not isinstance(data["error"], str):
                    raise ValueError("error is not text")
                fields["descriptor"] = fields["agreement"] = None
            else:
                agreement = data["agreement"]
                fields["error"] = None
                fields["descriptor"] = Descriptor.from_json(data["descriptor"])
                fields["agreement"] = (
                    None if agreement is None else Agreement.from_json(agreement)
                )
            return record
        except (KeyError, TypeError, ValueError, AttributeError) as problem:
            raise ValueError(f"malformed sync record: {problem!r}") from problem


_RAISED_KEYS = frozenset({"phase", "inputs", "reused", "solo", "error"})
_RETURNED_KEYS = frozenset(
    {"phase", "inputs", "reused", "solo", "descriptor", "agreement"}
)


@dataclass(frozen=True)
class Choice(_WithMode):
    """What a correct sync gives one rank for a step, and the batch the ranks agreed.

    ``largest`` is the largest token count, ``uniform`` the uniform decode
    length every rank shares (None if they differ or any has none), ``bound``
    the largest query-length bound (None if any rank has none).
    """

    cg_mode: CudagraphMode
    num_tokens: int
    num_ubatches: int
    largest: int
    uniform: int | None
    bound: int | None

    @classmethod
    def unchecked(
        cls,
        cg_mode: CudagraphMode,
        num_tokens: int,
        num_ubatches: int,
        largest: int,
        uniform: int | None,
        bound: int | None,
    ) -> Choice:
        """Same as the constructor, without a frozen ``__setattr__`` per
        field: the oracle makes one per rank per judged step."""
        record = object.__new__(cls)
        fields = record.__dict__
        fields["cg_mode"] = cg_mode
        fields["num_tokens"] = num_tokens
        fields["num_ubatches"] = num_ubatches
        fields["largest"] = largest
        fields["uniform"] = uniform
        fields["bound"] = bound
        return record


#: The flat records' field names: in order (JSON keys) and as a set (to read).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(field.name for field in fields(cls))
    for cls in (RankBatch, Descriptor, Agreement, Choice)
}
_FIELD_SETS = {cls: frozenset(names) for cls, names in _FIELD_NAMES.items()}


@dataclass(frozen=True)
class ExpectRecord:
    """The oracle's choices for one phase, one per rank in rank order."""

    phase: str
    choices: tuple[Choice, ...]

    def to_event(self) -> Payload:
        """What rank 0 records of these choices: the record itself, whose
        JSON the trace writes when read, and :func:`expect_records` hands
        back as it is."""
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "choices": [choice.to_json() for choice in self.choices],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExpectRecord:
        """Read back what :meth:`to_json` wrote; ValueError on anything else."""
        try:
            return cls(
                phase=data["phase"],
                choices=tuple(Choice.from_json(choice) for choice in data["choices"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as problem:
            raise ValueError(f"malformed expect record: {problem!r}") from problem


_R = TypeVar("_R", "SyncRecord", "ExpectRecord")


def _read_back(cls: type[_R], event: TraceEvent) -> _R:
    """The record ``event`` carries: the one it was recorded as, where it
    kept it, else parsed from its payload."""
    kept = event.kept
    if type(kept) is cls:
        return kept
    return cls.from_json(event.payload)


class TraceEvent(Protocol):
    """What these records need of a trace event: its kind, place and payload."""

    @property
    def kind(self) -> str: ...
    @property
    def after_collectives(self) -> int: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def kept(self) -> Any: ...


def recorded_syncs(events: Iterable[TraceEvent]) -> Iterator[tuple[int, SyncRecord]]:
    """Each sync in one rank's events, in order, with how many collectives the
    rank had entered before recording it."""
    for event in events:
        if event.kind == SYNC_EVENT:
            yield event.after_collectives, _read_back(SyncRecord, event)


def sync_records(events: Iterable[TraceEvent]) -> list[SyncRecord]:
    """The syncs in one rank's events, in order, without other events."""
    return [record for _, record in recorded_syncs(events)]


def expect_records(events: Iterable[TraceEvent]) -> Iterator[ExpectRecord]:
    """The oracle's records in one rank's events, in order."""
    for event in events:
        if event.kind == EXPECT_EVENT:
            yield _read_back(ExpectRecord, event)
