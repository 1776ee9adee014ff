"""What one case did on one side, as plain values, and how two of them differ.

:class:`Observed` is built from a run's trace and its verdicts (it simulates
nothing): per rank each sync's descriptor, agreement or error, the collectives
the rank issued (group, kind, op, shape, dtype, in order; values follow
from the agreement and the descriptor; compared group by group) and where
the rank ended; for the run,
the simulator's outcome and the names of the properties it broke.
:func:`differences` names the kinds of difference between a base and a new
observation of one case; :data:`KINDS` lists them all (``--expect`` takes
them).

Fields a side does not report: across runners (V1 against V2), a field
either side leaves None is not compared, since V1 and V2 agree different
things by design. On one runner, None against a value is a difference: the
field was added or dropped (a new row in the agreement, say), which is what a
reviewer of the change wants to see.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

from dpsim.properties.base import Evidence, Verdict
from dpsim.records.case import Case
from dpsim.records.groups import DEFAULT_GROUP_NAMES
from dpsim.records.sync import Agreement, Descriptor, SyncRecord
from dpsim.records.trace import SimResult

#: Descriptor fields with a kind of their own (what a reviewer asks first).
DESCRIPTOR_KINDS = {
    "cg_mode": "mode",
    "num_tokens": "padding",
    "num_reqs": "requests",
    "num_ubatches": "split",
}
_DESCRIPTOR_FIELDS = tuple(field.name for field in fields(Descriptor))
#: ``reports_max_query_len`` is compared as part of ``max_query_len`` (an
#: unreported bound differs from a reported None), not as a kind of its own.
_AGREEMENT_FIELDS = tuple(
    field.name for field in fields(Agreement) if field.name != "reports_max_query_len"
)

#: Every kind of difference, in the order reports list them.
KINDS: tuple[str, ...] = (
    *DESCRIPTOR_KINDS.values(),
    *(
        f"descriptor.{name}"
        for name in _DESCRIPTOR_FIELDS
        if name not in DESCRIPTOR_KINDS
    ),
    "agreement",
    *(f"agreement.{name}" for name in _AGREEMENT_FIELDS),
    "syncs",
    "error",
    *(f"collectives.{group}" for group in DEFAULT_GROUP_NAMES),
    "collectives.other",
    "outcome",
    "verdict",
)
_ORDER = {kind: index for index, kind in enumerate(KINDS)}

#: (group, kind, op, shape, dtype) of one collective a rank entered.
CollectiveShape = tuple[str, str, str | None, tuple[int, ...], str | None]


@dataclass(frozen=True)
class RankObserved:
    """One rank's part of a run."""

    state: str
    syncs: tuple[SyncRecord, ...]
    collectives: tuple[CollectiveShape, ...]

    def sync(self, phase: str) -> SyncRecord | None:
        return next((record for record in self.syncs if record.phase == phase), None)


@dataclass(frozen=True)
class Observed:
    """A case's observable outcome on one side."""

    runner: str
    outcome: str
    ranks: tuple[RankObserved, ...]
    #: The properties the run broke, by name, in judging order.
    verdicts: tuple[str, ...]

    @classmethod
    def of(cls, case: Case, result: SimResult, verdicts: Iterable[Verdict]) -> Observed:
        evidence = Evidence(case, result)
        ranks = tuple(
            RankObserved(
                trace.state.value,
                tuple(record for _, record in syncs),
                tuple(
                    (
                        record.group,
                        record.signature.kind,
                        record.signature.op,
                        record.signature.shape,
                        record.signature.dtype,
                    )
                    for record in trace.collectives
                ),
            )
            for trace, syncs in zip(result.ranks, evidence.syncs, strict=True)
        )
        names = tuple(dict.fromkeys(verdict.property for verdict in verdicts))
        return cls(evidence.runner, result.outcome.value, ranks, names)


def differences(
    base: Observed, new: Observed, compared: frozenset[str]
) -> frozenset[str]:
    """The kinds in which ``new`` differs from ``base`` on one case.

    ``compared`` names the properties both sides run: a verdict only one
    runner's suite can give is not a difference.
    """
    across = base.runner != new.runner
    found: set[str] = set()
    if base.outcome != new.outcome or any(
        left.state != right.state
        for left, right in zip(base.ranks, new.ranks, strict=True)
    ):
        found.add("outcome")
    if {name for name in base.verdicts if name in compared} != {
        name for name in new.verdicts if name in compared
    }:
        found.add("verdict")
    for left, right in zip(base.ranks, new.ranks, strict=True):
        if left.collectives != right.collectives:
            found.update(_collective_groups(left, right))
        found.update(_rank_syncs(left, right, across))
    return frozenset(found)


def _collective_groups(left: RankObserved, right: RankObserved) -> Iterator[str]:
    """``collectives.GROUP`` for each group whose collectives differ: the DP
    groups carry the sync's own reduction, ``ep`` the forward pass's, so a
    change to one is not taken for a change to the other."""
    for group in (*DEFAULT_GROUP_NAMES, "other"):
        if _on(group, left) != _on(group, right):
            yield f"collectives.{group}"


def _on(group: str, rank: RankObserved) -> tuple[CollectiveShape, ...]:
    """The rank's collectives on ``group`` ("other": on any group not named)."""
    return tuple(
        shape
        for shape in rank.collectives
        if shape[0] == group
        or (group == "other" and shape[0] not in DEFAULT_GROUP_NAMES)
    )


def _rank_syncs(left: RankObserved, right: RankObserved, across: bool) -> Iterator[str]:
    phases = dict.fromkeys(
        [*(record.phase for record in left.syncs)]
        + [record.phase for record in right.syncs]
    )
    for phase in phases:
        mine, theirs = left.sync(phase), right.sync(phase)
        if mine is None or theirs is None:
            yield "syncs"
            continue
        if mine.error != theirs.error:
            yield "error"
        if mine.descriptor is None or theirs.descriptor is None:
            continue
        for name in _DESCRIPTOR_FIELDS:
            if _differs(
                getattr(mine.descriptor, name), getattr(theirs.descriptor, name), across
            ):
                yield DESCRIPTOR_KINDS.get(name, f"descriptor.{name}")
        if mine.agreement is None or theirs.agreement is None:
            if not across and (mine.agreement is None) != (theirs.agreement is None):
                yield "agreement"
            continue
        for name in _AGREEMENT_FIELDS:
            if _differs(
                _agreed(mine.agreement, name), _agreed(theirs.agreement, name), across
            ):
                yield f"agreement.{name}"


def _agreed(agreement: Agreement, name: str) -> object:
    """A field of ``agreement`` as compared: the query bound with whether the
    version reports one (None when it does not, like any unreported field)."""
    if name == "max_query_len":
        if not agreement.reports_max_query_len:
            return None
        return ("reported", agreement.max_query_len)
    return getattr(agreement, name)


def _differs(left: object, right: object, across: bool) -> bool:
    if across and (left is None or right is None):
        return False
    return left != right


def ordered(kinds: Iterable[str]) -> tuple[str, ...]:
    """``kinds`` in :data:`KINDS` order."""
    return tuple(sorted(kinds, key=_ORDER.__getitem__))
