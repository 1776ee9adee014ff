"""A forward's MoE collectives: what the ranks pass and what the traces keep."""

from __future__ import annotations

import pytest

from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.scenarios import run_case
from dpsim.scenarios.ranks import moe_collectives, program_world
from dpsim.sim import simulate
from dpsim.targets import load_target

pytestmark = pytest.mark.release

SMALL = CapturePolicy(
    capture_sizes=(1, 2, 4, 8),
    cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
    max_num_seqs=8,
)


def _ep_values(result) -> list[list[tuple[object, object]]]:
    return [
        [(c.contribution, c.result) for c in trace.collectives if c.group == "ep"]
        for trace in result.ranks
    ]


def test_forwards_pass_their_counts_and_zeros_case_after_case() -> None:
    # The forward's tensors are shared between ranks and forwards: a value
    # written into one would show in every later case's trace.
    target = load_target("0.29.0")
    eager = RankBatch(num_reqs=3, num_tokens=5, need_eager=True, kind="eager")
    graphed = RankBatch(num_reqs=3, num_tokens=3, uniform_token_count=1)
    case = Case("step", "caller", SMALL, ((eager, graphed), (graphed, graphed)))
    for _ in range(3):
        first, second = _ep_values(run_case(target, case))
        # Step 0 is eager everywhere (one rank must be): each rank's real
        # count, all gathered. Step 1 replays the 4-token graph: zeros.
        assert first == [([5], [5, 3]), ([0, 0, 0, 0], [0, 0, 0, 0])]
        assert second == [([3], [5, 3]), ([0, 0, 0, 0], [0, 0, 0, 0])]


def test_a_count_int32_cannot_hold_is_refused_by_torch_every_time() -> None:
    def program(rank: int) -> None:
        world = program_world()
        moe_collectives(
            world.dist, world.group("ep"), 2**31, eager=True, num_ubatches=1
        )

    for _ in range(2):
        result = simulate(program, ranks=2)
        errors = [trace.error for trace in result.ranks]
        assert all(
            error is not None and error.type == "RuntimeError" for error in errors
        )
