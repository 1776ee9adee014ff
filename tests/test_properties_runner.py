"""The runner lane's own properties, on traces written here by hand.

Each program below leaves the events the runner lane's real callers leave
(sync records named by forward step, drafter-forward events), correct or with
one planted fault, and the property must tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dpsim.errors import UsageError
from dpsim.lanes.runner.case import RunnerCase
from dpsim.lanes.runner.stream import EngineOptions, RankStream
from dpsim.lanes.runner.syncs import DRAFTER_FORWARD_EVENT
from dpsim.properties import (
    NOT_FOR_RUNNER_LANE,
    PROPERTY_NAMES,
    RUNNER_LANE_PROPERTIES,
    RUNNER_PROPERTIES,
    drafter_forwards,
    dummy_shape,
    judge,
    select_for_runner_lane,
)
from dpsim.records.case import RankBatch
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import SYNC_EVENT, Agreement, Descriptor, SyncRecord
from dpsim.sim import simulate
from dpsim.sim.world import current_world

OPTIONS = EngineOptions(speculator="ar", num_speculative_tokens=2)
CASE = RunnerCase(
    CapturePolicy(capture_sizes=(1, 2, 4, 8), decode_query_len=3),
    OPTIONS,
    (RankStream(), RankStream()),
)


def _sync(phase: str, batch: RankBatch) -> None:
    record = SyncRecord(
        phase,
        batch,
        reused=False,
        solo=False,
        descriptor=Descriptor(CudagraphMode.FULL, 8, 2),
        agreement=Agreement((8, 8), eager=False),
    )
    current_world().record(SYNC_EVENT, record.to_json())


def _forward() -> None:
    current_world().record(DRAFTER_FORWARD_EVENT, {"tokens": 2})


DECODE = RankBatch(2, 6, 3, 3, kind="decode")


def _drafting(forwards: Callable[[int, int], int]) -> Callable[[int], None]:
    """Two forward steps per rank; ``forwards(rank, step)`` drafter forwards each."""

    def program(rank: int) -> None:
        for step in (1, 2):
            _sync(f"iter {step} model", DECODE)
            for _ in range(forwards(rank, step)):
                _forward()

    return program


def _verdicts(program: Callable[[int], Any], name: str) -> list[str]:
    result = simulate(program, ranks=2)
    return [str(v) for v in judge(CASE, result, [RUNNER_LANE_PROPERTIES[name]])]


def test_drafter_forwards_holds_when_ranks_draft_alike() -> None:
    assert _verdicts(_drafting(lambda rank, step: 2), "drafter-forwards") == []


def test_drafter_forwards_catches_an_idle_rank_drafting_less() -> None:
    verdicts = _verdicts(
        _drafting(lambda rank, step: 1 if (rank, step) == (1, 2) else 2),
        "drafter-forwards",
    )
    assert verdicts == [
        "drafter-forwards at iter 2: rank 1 ran 1 drafter forwards in forward "
        "step 2, rank 0 ran 2"
    ]


def test_drafter_forwards_does_not_judge_a_step_still_open() -> None:
    """A rank stopped inside a step (here: raised) may not have drafted yet."""

    def program(rank: int) -> None:
        _sync("iter 1 model", DECODE)
        if rank == 1:
            raise RuntimeError("stopped before drafting")
        _forward()

    assert _verdicts(program, "drafter-forwards") == []


def test_drafter_forwards_counts_a_stopped_rank_against_a_finished_one() -> None:
    """A finished rank that drafted less than a stopped one did is wrong
    whatever the stopped rank would have done next."""

    def program(rank: int) -> None:
        _sync("iter 1 model", DECODE)
        if rank == 1:
            _forward()
            _forward()
            raise RuntimeError("stopped while drafting")
        _forward()

    assert _verdicts(program, "drafter-forwards") == [
        "drafter-forwards at iter 1: rank 0 ran 1 drafter forwards in forward "
        "step 1, rank 1 ran 2"
    ]


def _dummy(batch: RankBatch) -> Callable[[int], None]:
    def program(rank: int) -> None:
        _sync("iter 1 model", DECODE if rank == 0 else batch)
        # A drafter's dummy sync is not the model runner's: never judged here.
        _sync("iter 1 drafter decode", RankBatch(1, 1, 1, 1, kind="dummy"))

    return program


def test_dummy_shape_holds_for_a_dummy_like_a_decode() -> None:
    real_like = RankBatch(1, 3, 3, 3, uniform_decode=True, kind="dummy")
    assert _verdicts(_dummy(real_like), "dummy-shape") == []


@pytest.mark.parametrize(
    ("batch", "reason"),
    [
        (
            RankBatch(1, 1, 1, 1, kind="dummy"),
            "a uniform decode of 1 where real decodes are of 3",
        ),
        (
            RankBatch(0, 0, None, None, kind="dummy"),
            "0 requests (a real step has 1..8)",
        ),
        (
            RankBatch(1, 100, None, None, kind="dummy"),
            "100 tokens for 1 requests (a real step has 1..64)",
        ),
        (
            RankBatch(2, 5, 3, 3, kind="dummy"),
            "a uniform decode of 3 with 5 tokens for 2 requests",
        ),
        (
            RankBatch(2, 6, None, 2, kind="dummy"),
            "a query-length bound of 2 for 6 tokens in 2 requests",
        ),
        (
            RankBatch(1, 3, 3, 3, need_eager=True, kind="dummy"),
            "it asks for eager, which a real step never does",
        ),
    ],
)
def test_dummy_shape_catches_a_dummy_no_real_step_could_pass(
    batch: RankBatch, reason: str
) -> None:
    assert _verdicts(_dummy(batch), "dummy-shape") == [
        f"dummy-shape at iter 1 model: rank 1's dummy batch is unlike any real "
        f"one: {reason}"
    ]


def test_a_real_batch_is_not_held_to_the_dummy_rules() -> None:
    odd = RankBatch(1, 1, 1, 1, kind="batch")
    assert _verdicts(_dummy(odd), "dummy-shape") == []


def test_the_runner_lane_suite_and_its_refusals() -> None:
    assert tuple(RUNNER_PROPERTIES) == ("drafter-forwards", "dummy-shape")
    # The sync lane's suite is unchanged by the runner lane's properties.
    assert not set(RUNNER_PROPERTIES) & set(PROPERTY_NAMES)
    assert set(NOT_FOR_RUNNER_LANE) <= set(PROPERTY_NAMES)
    assert not set(NOT_FOR_RUNNER_LANE) & set(RUNNER_LANE_PROPERTIES)
    assert select_for_runner_lane(["dummy-shape"]) == (dummy_shape.PROPERTY,)
    assert select_for_runner_lane(None)[1] is drafter_forwards.PROPERTY
    with pytest.raises(UsageError, match="'graph-choice' is not run on the runner"):
        select_for_runner_lane(["graph-choice"])
    with pytest.raises(UsageError, match="unknown property 'nope'"):
        select_for_runner_lane(["nope"])


def test_reuse_is_judged_against_the_agreement_handed_in() -> None:
    """A call handed a derived agreement (noted by the runner lane) that
    comes back changed is still caught; one that keeps it is not flagged."""
    from dpsim.records.sync import REUSE_GIVEN_EVENT

    derived = Agreement((8, 8), uniform_token_count=1, eager=False)

    def program(changes: bool) -> Callable[[int], None]:
        def run(rank: int) -> None:
            _sync("iter 1 model", DECODE)
            world = current_world()
            world.record(REUSE_GIVEN_EVENT, {"agreement": derived.to_json()})
            back = Agreement(
                (8, 8), uniform_token_count=2 if changes else 1, eager=False
            )
            record = SyncRecord(
                "iter 1 drafter decode",
                RankBatch(1, 1, 1, 1, kind="decode"),
                reused=True,
                solo=False,
                descriptor=Descriptor(CudagraphMode.FULL, 8, 2),
                agreement=back,
            )
            world.record(SYNC_EVENT, record.to_json())

        return run

    assert _verdicts(program(False), "reuse") == []
    assert _verdicts(program(True), "reuse") == [
        "reuse at iter 1 drafter decode: reuse changed the agreed "
        "uniform_token_count from 1 to 2"
    ]


def test_no_error_sees_an_exception_kept_in_the_executors_future() -> None:
    from dpsim.records.sync import WORKER_ERROR_EVENT

    def program(rank: int) -> None:
        _sync("iter 1 model", DECODE)
        if rank == 1:
            current_world().record(
                WORKER_ERROR_EVENT,
                {
                    "error": "IndexError: out of range",
                    "where": "model_runner.py:1 in f",
                },
            )

    assert _verdicts(program, "no-error") == [
        "no-error: rank 1 raised IndexError: out of range at model_runner.py:1 in f "
        "(kept in the executor's future)"
    ]


def test_drafter_forwards_counts_a_rank_in_the_engine_all_reduce_as_done() -> None:
    """A rank that skipped its drafter and went on to the engine loop's own
    all-reduce has drafted all it will for the step; its peer still drafting
    shows the difference, though neither finished."""
    from dpsim.records.groups import ENGINE_DP_GROUP

    def program(rank: int) -> None:
        world = current_world()
        _sync("iter 1 model", DECODE)
        _forward()
        if rank == 1:
            world.dist.barrier(group=world.group(ENGINE_DP_GROUP))
        else:
            _forward()
            world.dist.barrier(group=world.group("ep"))

    result = simulate(program, ranks=2, groups={ENGINE_DP_GROUP: (0, 1)})
    verdicts = judge(CASE, result, [RUNNER_LANE_PROPERTIES["drafter-forwards"]])
    assert [str(v) for v in verdicts] == [
        "drafter-forwards at iter 1: rank 1 ran 1 drafter forwards in forward "
        "step 1, rank 0 ran 2"
    ]
