"""Scheduling choices (``dpsim.sim.choosers``): the same case gives the same
bytes, Hypothesis explores interleavings, and recorded choices replay them.
No vLLM code involved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simprograms import ReduceOp, all_reduce_rank_value, dist, dp_cpu

from dpsim import sim
from dpsim.records.trace import Outcome, SimResult
from dpsim.sim import HypothesisChooser, ReplayChooser, simulate

# -- determinism, exploration, replay ------------------------------------------------------


def deterministic_case() -> SimResult:
    """Exercises async ops, several groups, events, a crash and a hang in one run."""

    def program(rank: int) -> Any:
        world = sim.current_world()
        tensor = torch.tensor([rank, 2 * rank], dtype=torch.int32)
        work = dist.all_reduce(tensor, group=world.group("ep"), async_op=True)
        sim.record("issued", polled=work.is_completed())
        all_reduce_rank_value(rank)
        work.wait()
        sim.record("reduced", value=tensor.tolist())
        if rank == 3:
            raise KeyError(f"rank {rank} has no slot {object()!r}")
        if rank != 1:
            dist.all_reduce(torch.zeros(2, 2), op=ReduceOp.MAX, group=dp_cpu())
        return {"rank": rank, "value": tensor.tolist()}

    return simulate(program, ranks=4)


def test_same_case_gives_identical_json_in_process_and_in_a_fresh_process() -> None:
    first = deterministic_case().to_json()
    assert deterministic_case().to_json() == first
    assert json.loads(first)["outcome"] == "crash"

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_choosers; "
        "sys.stdout.write(test_choosers.deterministic_case().to_json())"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    assert fresh.stdout == first


def _polling_program(rank: int) -> dict[str, Any]:
    tensor = torch.tensor([rank + 1])
    if rank == 0:
        work = dist.all_reduce(tensor, group=dp_cpu(), async_op=True)
        polled = work.is_completed()
        work.wait()
        return {"saw_completed": polled, "value": tensor.item()}
    dist.all_reduce(tensor, group=dp_cpu())
    return {"value": tensor.item()}


@settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def _explore_polling(data: st.DataObject) -> None:
    result = simulate(_polling_program, ranks=3, chooser=HypothesisChooser(data))
    _explored.append(result)


_explored: list[SimResult] = []


def test_hypothesis_chooser_explores_interleavings_and_replay_reproduces_them() -> None:
    _explored.clear()
    _explore_polling()

    observed = {result.ranks[0].returned["saw_completed"] for result in _explored}
    assert observed == {True, False}
    assert len({result.choices for result in _explored}) > 3
    for result in _explored:
        assert result.outcome is Outcome.OK
        replayed = simulate(
            _polling_program, ranks=3, chooser=ReplayChooser(result.choices)
        )
        assert replayed.to_json() == result.to_json()


def test_hypothesis_finds_and_shrinks_an_interleaving_dependent_failure() -> None:
    falsifying: list[tuple[int, ...]] = []

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(data=st.data())
    def rank0_never_sees_early_completion(data: st.DataObject) -> None:
        result = simulate(_polling_program, ranks=3, chooser=HypothesisChooser(data))
        if result.ranks[0].returned["saw_completed"]:
            falsifying.append(result.choices)
            raise AssertionError("rank 0 saw its async all_reduce complete at once")

    with pytest.raises(AssertionError, match="complete at once"):
        rank0_never_sees_early_completion()
    # Hypothesis reports (runs last) the shrunk example: no failing run it saw
    # took fewer choices, and replaying those choices fails the same way.
    shrunk = falsifying[-1]
    assert len(shrunk) == min(len(choices) for choices in falsifying)
    assert len(falsifying) > 1  # it did shrink from a longer first failure
    replayed = simulate(_polling_program, ranks=3, chooser=ReplayChooser(shrunk))
    assert replayed.ranks[0].returned["saw_completed"] is True


def test_default_order_is_lowest_runnable_first_and_is_recorded() -> None:
    result = simulate(all_reduce_rank_value, ranks=3)
    # 0 and 1 block; 2 completes; then 0, 1, 2 resume in order.
    assert result.choices == (0, 1, 0, 1)
    assert (
        simulate(
            all_reduce_rank_value, ranks=3, chooser=ReplayChooser(result.choices)
        ).to_json()
        == result.to_json()
    )
