"""What the trace keeps of a sync call and of the oracle, as frozen records.

Every sync a rank makes leaves a :class:`SyncRecord` (phase, what it passed,
and either what it chose and agreed or the exception it raised); rank 0 leaves
an :class:`ExpectRecord` per judged step (what a correct sync would choose).
Properties and reports read these typed values. The trace carries them as
JSON objects, because the replay lane's ranks write their events to logs and
counterexample files store traces: ``to_json()`` gives that form key for key,
and ``from_json()`` reads it back once per trace, when a run is judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Protocol

from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode

#: The trace event kinds these records travel as.
SYNC_EVENT = "sync"
EXPECT_EVENT = "expect"


@dataclass(frozen=True)
class Descriptor:
    """A ``BatchExecutionDescriptor`` as plain values (fields a version lacks: default)."""

    cg_mode: CudagraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _DESCRIPTOR_FIELDS}
        data["cg_mode"] = self.cg_mode.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Descriptor:
        return cls(**{**data, "cg_mode": CudagraphMode(data["cg_mode"])})


_DESCRIPTOR_FIELDS = tuple(field.name for field in fields(Descriptor))


@dataclass(frozen=True)
class Agreement:
    """What a sync call agreed, whether the version returns a ``DPSyncState`` or a tensor.

    Fields the version does not report are None.
    """

    num_tokens_across_dp: tuple[int, ...]
    uniform_token_count: int | None = None
    eager: bool | None = None
    num_reqs: int | None = None
    skip_drafts: bool | None = None

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _AGREEMENT_FIELDS}
        data["num_tokens_across_dp"] = list(self.num_tokens_across_dp)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Agreement:
        return cls(
            **{**data, "num_tokens_across_dp": tuple(data["num_tokens_across_dp"])}
        )


_AGREEMENT_FIELDS = tuple(field.name for field in fields(Agreement))


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

    @property
    def raised(self) -> bool:
        return self.error is not None

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
            error = data.get("error")
            if error is not None:
                extra = set(data) - _RAISED_KEYS
                returned = None
            else:
                extra = set(data) - _RETURNED_KEYS
                agreement = data["agreement"]
                returned = (
                    Descriptor.from_json(data["descriptor"]),
                    None if agreement is None else Agreement.from_json(agreement),
                )
            if extra:
                raise ValueError(f"unknown keys {sorted(extra)}")
            return cls(
                phase=data["phase"],
                inputs=RankBatch(**data["inputs"]),
                reused=data["reused"],
                solo=data["solo"],
                descriptor=None if returned is None else returned[0],
                agreement=None if returned is None else returned[1],
                error=error,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as problem:
            raise ValueError(f"malformed sync record: {problem!r}") from problem


_RAISED_KEYS = frozenset({"phase", "inputs", "reused", "solo", "error"})
_RETURNED_KEYS = frozenset(
    {"phase", "inputs", "reused", "solo", "descriptor", "agreement"}
)


@dataclass(frozen=True)
class Choice:
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

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _CHOICE_FIELDS}
        data["cg_mode"] = self.cg_mode.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Choice:
        return cls(**{**data, "cg_mode": CudagraphMode(data["cg_mode"])})


_CHOICE_FIELDS = tuple(field.name for field in fields(Choice))


@dataclass(frozen=True)
class ExpectRecord:
    """The oracle's choices for one phase, one per rank in rank order."""

    phase: str
    choices: tuple[Choice, ...]

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
        except (KeyError, TypeError, ValueError) as problem:
            raise ValueError(f"malformed expect record: {problem!r}") from problem


class TraceEvent(Protocol):
    """What these records need of a trace event: its kind, place and payload."""

    @property
    def kind(self) -> str: ...
    @property
    def after_collectives(self) -> int: ...
    @property
    def payload(self) -> dict[str, Any]: ...


def recorded_syncs(events: Iterable[TraceEvent]) -> Iterator[tuple[int, SyncRecord]]:
    """Each sync in one rank's events, in order, with how many collectives the
    rank had entered before recording it."""
    for event in events:
        if event.kind == SYNC_EVENT:
            yield event.after_collectives, SyncRecord.from_json(event.payload)


def sync_records(events: Iterable[TraceEvent]) -> list[SyncRecord]:
    """The syncs in one rank's events, in order, without other events."""
    return [record for _, record in recorded_syncs(events)]


def expect_records(events: Iterable[TraceEvent]) -> Iterator[ExpectRecord]:
    """The oracle's records in one rank's events, in order."""
    for event in events:
        if event.kind == EXPECT_EVENT:
            yield ExpectRecord.from_json(event.payload)
