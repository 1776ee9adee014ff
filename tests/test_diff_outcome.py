"""The kinds of difference between two observations of one case (no release needed)."""

from __future__ import annotations

from dataclasses import replace

from dpsim.diff.outcome import (
    KINDS,
    Observed,
    RankObserved,
    differences,
    ordered,
)
from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import Agreement, Descriptor, SyncRecord

BATCH = RankBatch(num_reqs=2, num_tokens=8)
DESCRIPTOR = Descriptor(cg_mode=CudagraphMode.FULL, num_tokens=8, num_reqs=2)
AGREEMENT = Agreement(num_tokens_across_dp=(8, 8), eager=False, num_reqs=2)
REDUCE = ("dp_cpu", "all_reduce", "SUM", (4, 2), "torch.int32")
COMPARED = frozenset({"agreement", "no-hang"})


def sync(
    phase: str = "step 0",
    descriptor: Descriptor | None = DESCRIPTOR,
    agreement: Agreement | None = AGREEMENT,
    error: str | None = None,
) -> SyncRecord:
    if error is not None:
        return SyncRecord(phase, BATCH, False, False, error=error)
    return SyncRecord(phase, BATCH, False, False, descriptor, agreement)


def observed(
    *records: SyncRecord,
    runner: str = "v2",
    collectives: tuple[
        tuple[str, str, str | None, tuple[int, ...], str | None], ...
    ] = (REDUCE,),
    outcome: str = "ok",
    verdicts: tuple[str, ...] = (),
) -> Observed:
    rank = RankObserved("finished", records or (sync(),), collectives)
    return Observed(runner, outcome, (rank, rank), verdicts)


def test_the_same_observation_differs_in_nothing() -> None:
    assert differences(observed(), observed(), COMPARED) == frozenset()


def test_each_descriptor_field_is_its_own_kind() -> None:
    changes = {
        "mode": replace(DESCRIPTOR, cg_mode=CudagraphMode.PIECEWISE),
        "padding": replace(DESCRIPTOR, num_tokens=16),
        "requests": replace(DESCRIPTOR, num_reqs=4),
        "split": replace(DESCRIPTOR, num_ubatches=2),
        "descriptor.num_active_loras": replace(DESCRIPTOR, num_active_loras=1),
    }
    for kind, changed in changes.items():
        new = observed(sync(descriptor=changed))
        assert differences(observed(), new, COMPARED) == {kind}


def test_an_agreement_field_added_on_one_runner_is_a_difference() -> None:
    base = observed(sync(agreement=replace(AGREEMENT, num_reqs=None)))
    assert differences(base, observed(), COMPARED) == {"agreement.num_reqs"}


def test_an_agreed_query_bound_is_one_kind_and_its_none_differs_from_none_agreed() -> (
    None
):
    reported_none = replace(AGREEMENT, reports_max_query_len=True)
    reported_three = replace(reported_none, max_query_len=3)
    unreported, none, three = (
        observed(sync(agreement=agreement))
        for agreement in (AGREEMENT, reported_none, reported_three)
    )
    assert differences(unreported, none, COMPARED) == {"agreement.max_query_len"}
    assert differences(none, three, COMPARED) == {"agreement.max_query_len"}
    assert differences(three, three, COMPARED) == frozenset()
    assert "agreement.reports_max_query_len" not in KINDS


def test_across_runners_a_field_one_side_leaves_unset_is_not_compared() -> None:
    v1 = observed(
        sync(agreement=Agreement((8, 8), cg_mode=CudagraphMode.FULL)), runner="v1"
    )
    assert differences(v1, observed(), COMPARED) == frozenset()
    padded = observed(sync(agreement=replace(AGREEMENT, num_tokens_across_dp=(8, 16))))
    assert differences(v1, padded, COMPARED) == {"agreement.num_tokens_across_dp"}


def test_agreeing_nothing_against_something_is_a_difference_on_one_runner_only() -> (
    None
):
    silent = observed(sync(agreement=None))
    assert differences(silent, observed(), COMPARED) == {"agreement"}
    assert (
        differences(replace(silent, runner="v1"), observed(), COMPARED) == frozenset()
    )


def test_collectives_outcome_errors_and_missing_syncs() -> None:
    wider = observed(
        collectives=(("dp_cpu", "all_reduce", "SUM", (5, 2), "torch.int32"),)
    )
    assert differences(observed(), wider, COMPARED) == {"collectives.dp_cpu"}
    forward = observed(collectives=(REDUCE, ("ep", "all_reduce", "SUM", (8,), "int8")))
    assert differences(observed(), forward, COMPARED) == {"collectives.ep"}
    elsewhere = observed(collectives=(REDUCE, ("mine", "barrier", None, (), None)))
    assert differences(observed(), elsewhere, COMPARED) == {"collectives.other"}
    assert differences(observed(), observed(outcome="hang"), COMPARED) == {"outcome"}
    raised = observed(sync(error="AssertionError: no"))
    assert differences(observed(), raised, COMPARED) == {"error"}
    more = observed(sync(), sync("solo 0"))
    assert differences(observed(), more, COMPARED) == {"syncs"}


def test_only_verdicts_of_properties_both_sides_run_are_compared() -> None:
    assert differences(observed(), observed(verdicts=("no-hang",)), COMPARED) == {
        "verdict"
    }
    assert (
        differences(observed(), observed(verdicts=("agreed-values",)), COMPARED)
        == frozenset()
    )


def test_every_kind_is_listed_once_and_ordered_by_the_list() -> None:
    assert len(set(KINDS)) == len(KINDS)
    assert ordered(reversed(KINDS)) == KINDS
