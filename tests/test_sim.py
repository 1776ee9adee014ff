"""The simulator on hand-written programs: agreement, diagnosis, async, groups,
determinism, interleaving exploration and replay. No vLLM code involved."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpsim import sim
from dpsim.sim import (
    HypothesisChooser,
    Outcome,
    RankState,
    ReplayChooser,
    ReplayDivergedError,
    SimResult,
    render_table,
    simulate,
)
from dpsim.sim.example import sync_like_program
from dpsim.targets import runtime

dist = runtime.DIST_PROXY
ReduceOp = torch.distributed.ReduceOp


def dp_cpu() -> Any:
    return runtime.current().dp_group().cpu_group


def group(name: str) -> sim.SimProcessGroup:
    return sim.current_world().group(name)


def all_reduce_rank_value(rank: int) -> list[int]:
    tensor = torch.tensor([rank + 1, 10 * (rank + 1)], dtype=torch.int32)
    dist.all_reduce(tensor, group=dp_cpu())
    return tensor.tolist()


# -- agreement and the trace ---------------------------------------------------


def test_correct_program_agrees_and_traces_each_collective() -> None:
    result = simulate(sync_like_program, ranks=4)

    assert result.outcome is Outcome.OK
    returns = result.returns()
    assert all(returned == returns[0] for returned in returns)
    results = {json.dumps(trace.collectives[0].result) for trace in result.ranks}
    assert len(results) == 1
    for trace in result.ranks:
        assert trace.state is RankState.FINISHED
        (record,) = trace.collectives
        assert (record.group, record.seq) == ("dp_cpu", 0)
        assert record.signature.kind == "all_reduce"
        assert record.signature.op == "SUM"
        assert record.signature.shape == (5, 4)
        assert record.signature.dtype == "torch.int32"
        assert record.completed and not record.is_async
        # The contribution is the rank's own column only, taken before the reduce.
        column = [row[trace.rank] for row in record.contribution]
        assert column[0] > 0
        others = [
            value
            for row in record.contribution
            for rank, value in enumerate(row)
            if rank != trace.rank
        ]
        assert others == [0] * len(others)
    summed = [
        [
            sum(t.collectives[0].contribution[i][j] for t in result.ranks)
            for j in range(4)
        ]
        for i in range(5)
    ]
    assert result.ranks[0].collectives[0].result == summed


def test_events_are_recorded_with_their_place_among_collectives() -> None:
    def program(rank: int) -> int:
        sim.record("before", rank=rank)
        all_reduce_rank_value(rank)
        sim.record("after", value=sim.current_rank())
        return rank

    result = simulate(program, ranks=2)

    events = result.ranks[1].events
    assert [(e.kind, e.after_collectives, e.payload) for e in events] == [
        ("before", 0, {"rank": 1}),
        ("after", 1, {"value": 1}),
    ]
    assert result.to_dict()["ranks"][1]["events"][1] == {
        "kind": "after",
        "after_collectives": 1,
        "payload": {"value": 1},
    }


# -- diagnosis ---------------------------------------------------------------------


def test_rank_skipping_a_collective_is_a_hang_naming_the_waiting_ranks() -> None:
    def program(rank: int) -> str:
        all_reduce_rank_value(rank)
        if rank == 2:
            return "skipped"
        all_reduce_rank_value(rank)
        return "done"

    result = simulate(program, ranks=4)

    assert result.outcome is Outcome.HANG
    assert result.ranks[2].state is RankState.FINISHED
    for rank in (0, 1, 3):
        trace = result.ranks[rank]
        assert trace.state is RankState.WAITING
        assert trace.waiting is not None
        assert (trace.waiting.group, trace.waiting.seq) == ("dp_cpu", 1)
        assert trace.waiting.missing == (2,)
        assert trace.waiting.disagreeing == ()
        assert trace.collectives[-1].result is None
    assert [(i.group, i.seq, i.entered, i.missing) for i in result.incomplete] == [
        ("dp_cpu", 1, (0, 1, 3), (2,))
    ]
    table = render_table(result)
    assert table.splitlines()[0] == "outcome: hang"
    assert "dp_cpu#1" in table and "ranks [2] never entered" in table


def test_disagreeing_shapes_are_a_mismatch_found_at_entry() -> None:
    def program(rank: int) -> None:
        width = 3 if rank == 1 else 4
        dist.all_reduce(torch.zeros(5, width, dtype=torch.int32), group=dp_cpu())

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.MISMATCH
    assert [(i.group, i.seq, i.mismatched) for i in result.incomplete] == [
        ("dp_cpu", 0, True)
    ]
    # Rank 1 disagrees with 0 and 2; 0 and 2 each disagree with 1 only.
    odd = result.ranks[1].waiting
    assert odd is not None and odd.signature.shape == (5, 3)
    assert [peer.rank for peer in odd.disagreeing] == [0, 2]
    for rank in (0, 2):
        waiting = result.ranks[rank].waiting
        assert waiting is not None and waiting.signature.shape == (5, 4)
        assert [
            (p.rank, p.entered_as.shape) for p in waiting.disagreeing if p.entered_as
        ] == [(1, (5, 3))]
    assert "MISMATCH: rank 1 entered all_reduce:SUM 5x3 int32" in render_table(result)


def test_mismatch_stops_the_disagreeing_rank_where_it_entered() -> None:
    reached: list[int] = []

    def program(rank: int) -> None:
        op = ReduceOp.MAX if rank == 0 else ReduceOp.SUM
        dist.all_reduce(torch.zeros(2), op=op, group=dp_cpu())
        reached.append(rank)

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.MISMATCH
    assert reached == []


def test_crash_on_one_rank_reports_it_and_where_the_others_wait() -> None:
    def program(rank: int) -> list[int]:
        if rank == 1:
            raise ValueError(f"bad batch on rank {rank} at {object()!r}")
        return all_reduce_rank_value(rank)

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.CRASH
    crashed = result.ranks[1]
    assert crashed.state is RankState.RAISED
    assert crashed.error is not None
    assert crashed.error.type == "ValueError"
    assert crashed.error.message.startswith(
        "bad batch on rank 1 at <object object at 0x?"
    )
    assert crashed.error.where.startswith("test_sim.py:")
    for rank in (0, 2):
        waiting = result.ranks[rank].waiting
        assert waiting is not None
        assert (waiting.group, waiting.seq, waiting.missing) == ("dp_cpu", 0, (1,))
    assert "ValueError: bad batch" in render_table(result)


def test_sys_exit_on_one_rank_is_that_ranks_error_not_the_end_of_the_run() -> None:
    def program(rank: int) -> list[int]:
        if rank == 1:
            sys.exit(0)
        return all_reduce_rank_value(rank)

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.CRASH
    exited = result.ranks[1]
    assert exited.state is RankState.RAISED
    assert exited.error is not None
    assert (exited.error.type, exited.error.message) == ("SystemExit", "0")
    assert [result.ranks[rank].state for rank in (0, 2)] == [RankState.WAITING] * 2


def test_keyboard_interrupt_in_a_rank_still_ends_the_run() -> None:
    def program(rank: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate(program, ranks=2)


def test_infinite_loop_is_stopped_by_the_step_budget_even_through_except() -> None:
    def program(rank: int) -> list[int]:
        if rank == 0:
            while True:
                # The pattern target code might use; it cannot swallow the stop.
                try:  # noqa: SIM105
                    runtime.tick()
                except Exception:
                    pass
        return all_reduce_rank_value(rank)

    result = simulate(program, ranks=2, step_budget=500)

    assert result.outcome is Outcome.BUDGET
    assert result.ranks[0].state is RankState.BUDGET
    assert result.ranks[0].steps == 501
    waiting = result.ranks[1].waiting
    assert waiting is not None and waiting.missing == (0,)


def test_crash_takes_precedence_over_budget_and_hang() -> None:
    def program(rank: int) -> None:
        if rank == 0:
            raise RuntimeError("boom")
        if rank == 1:
            while True:
                runtime.tick()
        all_reduce_rank_value(rank)

    result = simulate(program, ranks=3, step_budget=50)

    assert result.outcome is Outcome.CRASH
    assert [t.state for t in result.ranks] == [
        RankState.RAISED,
        RankState.BUDGET,
        RankState.WAITING,
    ]


def test_async_op_left_unmatched_is_a_hang_even_if_every_rank_finished() -> None:
    def program(rank: int) -> None:
        if rank == 0:
            dist.all_reduce(torch.ones(1), group=dp_cpu(), async_op=True)

    result = simulate(program, ranks=2)

    assert all(t.state is RankState.FINISHED for t in result.ranks)
    assert result.outcome is Outcome.HANG
    assert [(i.entered, i.missing) for i in result.incomplete] == [((0,), (1,))]


def test_hung_ranks_are_ended_so_their_finally_blocks_run() -> None:
    cleaned_up: list[int] = []

    def program(rank: int) -> None:
        try:
            if rank != 0:
                all_reduce_rank_value(rank)
        finally:
            cleaned_up.append(rank)
            sim.record("too late")  # ignored: the trace is final by then

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.HANG
    assert sorted(cleaned_up) == [0, 1, 2]
    assert [len(t.events) for t in result.ranks] == [1, 0, 0]


# -- async ---------------------------------------------------------------------------


def test_async_result_is_visible_only_after_completion_and_input_taken_at_call() -> (
    None
):
    def program(rank: int) -> dict[str, Any]:
        tensor = torch.tensor([rank + 1], dtype=torch.int64)
        work = dist.all_reduce(tensor, group=dp_cpu(), async_op=True)
        seen = {"completed_at_once": work.is_completed(), "before": tensor.tolist()}
        tensor.fill_(100)  # too late to change what this rank contributed
        work.wait()
        seen["after"] = tensor.tolist()
        seen["completed_after_wait"] = work.is_completed()
        return seen

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.OK
    rank0 = result.ranks[0].returned
    assert rank0 == {
        "completed_at_once": False,  # rank 1 had not entered yet
        "before": [1],
        "after": [3],
        "completed_after_wait": True,
    }
    # Rank 1 entered last, so its op completed in the call: the result was
    # already in its tensor, and its own later fill_ overwrote it.
    assert result.ranks[1].returned == {
        "completed_at_once": True,
        "before": [3],
        "after": [100],
        "completed_after_wait": True,
    }
    record = result.ranks[0].collectives[0]
    assert record.is_async and record.contribution == [1] and record.result == [3]


# -- several groups ------------------------------------------------------------------


def _two_groups_opposite_order(asynchronous: bool) -> Callable[[int], list[float]]:
    def program(rank: int) -> list[float]:
        first, second = ("dp_cpu", "ep") if rank == 0 else ("ep", "dp_cpu")
        a = torch.tensor([float(rank + 1)])
        b = torch.tensor([float(10 * (rank + 1))])
        if asynchronous:
            work = dist.all_reduce(a, group=group(first), async_op=True)
            dist.all_reduce(b, group=group(second))
            work.wait()
        else:
            dist.all_reduce(a, group=group(first))
            dist.all_reduce(b, group=group(second))
        return [a.item(), b.item()]

    return program


def test_two_groups_in_opposite_orders_complete_when_the_first_is_async() -> None:
    result = simulate(_two_groups_opposite_order(asynchronous=True), ranks=2)

    assert result.outcome is Outcome.OK
    # rank 0: dp_cpu <- 1+20, ep <- 10+2 ; rank 1: ep <- 2+10, dp_cpu <- 20+1
    assert result.returns() == [[21.0, 12.0], [12.0, 21.0]]


def test_two_groups_in_opposite_orders_deadlock_when_both_are_blocking() -> None:
    result = simulate(_two_groups_opposite_order(asynchronous=False), ranks=2)

    assert result.outcome is Outcome.HANG
    waits = [
        (t.waiting.group, t.waiting.seq, t.waiting.missing)
        for t in result.ranks
        if t.waiting
    ]
    assert waits == [("dp_cpu", 0, (1,)), ("ep", 0, (0,))]


def test_one_group_in_different_orders_is_a_mismatch() -> None:
    def program(rank: int) -> None:
        shapes = [(2,), (3,)] if rank == 0 else [(3,), (2,)]
        for shape in shapes:
            dist.all_reduce(torch.zeros(shape), group=dp_cpu())

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.MISMATCH


def test_groups_number_their_collectives_independently() -> None:
    def program(rank: int) -> None:
        for name in ("dp_cpu", "dp_device", "dp_cpu", "ep"):
            dist.all_reduce(torch.ones(1), group=group(name))
        dist.all_reduce(torch.ones(1))  # group=None: the world group

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.OK
    assert [(c.group, c.seq) for c in result.ranks[0].collectives] == [
        ("dp_cpu", 0),
        ("dp_device", 0),
        ("dp_cpu", 1),
        ("ep", 0),
        ("world", 0),
    ]


def test_user_declared_groups_and_membership() -> None:
    def program(rank: int) -> int:
        pair = group("pair_a" if rank < 2 else "pair_b")
        tensor = torch.tensor([rank])
        dist.all_reduce(tensor, group=pair)
        assert dist.get_world_size(pair) == 2
        return int(tensor.item()) * 10 + dist.get_rank(pair)

    result = simulate(program, ranks=4, groups={"pair_a": [0, 1], "pair_b": [2, 3]})

    assert result.outcome is Outcome.OK
    assert result.returns() == [10, 11, 50, 51]


def test_collective_on_a_group_the_rank_is_not_in_raises_on_that_rank() -> None:
    def program(rank: int) -> None:
        dist.all_reduce(torch.ones(1), group=group("solo"))

    result = simulate(program, ranks=2, groups={"solo": [0]})

    assert result.ranks[0].state is RankState.FINISHED
    assert result.ranks[1].error is not None
    assert "not a member" in result.ranks[1].error.message


# -- the collectives themselves --------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "dtype", "expected"),
    [
        (ReduceOp.SUM, torch.int32, [2 + 3 + 5, 1 + 6 + 4]),
        (ReduceOp.PRODUCT, torch.int32, [2 * 3 * 5, 1 * 6 * 4]),
        (ReduceOp.MIN, torch.int32, [2, 1]),
        (ReduceOp.MAX, torch.int32, [5, 6]),
        (ReduceOp.BAND, torch.int32, [2 & 3 & 5, 1 & 6 & 4]),
        (ReduceOp.BOR, torch.int32, [2 | 3 | 5, 1 | 6 | 4]),
        (ReduceOp.BXOR, torch.int32, [2 ^ 3 ^ 5, 1 ^ 6 ^ 4]),
        (ReduceOp.AVG, torch.float64, [10 / 3, 11 / 3]),
    ],
)
def test_reduce_ops(op: Any, dtype: torch.dtype, expected: list[float]) -> None:
    values = [[2, 1], [3, 6], [5, 4]]

    def program(rank: int) -> list[float]:
        tensor = torch.tensor(values[rank], dtype=dtype)
        dist.all_reduce(tensor, op=op, group=dp_cpu())
        return tensor.tolist()

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.OK
    for returned in result.returns():
        assert returned == pytest.approx(expected)
    assert result.ranks[0].collectives[0].signature.op == op.name


def test_all_gather_broadcast_and_barrier() -> None:
    def program(rank: int) -> dict[str, Any]:
        mine = torch.tensor([rank, rank * rank])
        gathered = [torch.empty(2, dtype=torch.int64) for _ in range(3)]
        dist.all_gather(gathered, mine, group=dp_cpu())
        flat = torch.empty(6, dtype=torch.int64)
        dist.all_gather_into_tensor(flat, mine, group=dp_cpu())
        shared = torch.tensor([100 + rank])
        dist.broadcast(shared, src=2, group=dp_cpu())
        dist.barrier(group=dp_cpu())
        return {
            "gathered": [t.tolist() for t in gathered],
            "flat": flat.tolist(),
            "shared": shared.item(),
            "rank": dist.get_rank(),
            "size": dist.get_world_size(),
        }

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.OK
    for rank, returned in enumerate(result.returns()):
        assert returned == {
            "gathered": [[0, 0], [1, 1], [2, 4]],
            "flat": [0, 0, 1, 1, 2, 4],
            "shared": 102,
            "rank": rank,
            "size": 3,
        }
    kinds = [(c.signature.kind, c.signature.src) for c in result.ranks[0].collectives]
    assert kinds == [
        ("all_gather", None),
        ("all_gather_into_tensor", None),
        ("broadcast", 2),
        ("barrier", None),
    ]


def test_broadcast_from_different_sources_is_a_mismatch() -> None:
    def program(rank: int) -> None:
        dist.broadcast(torch.zeros(1), src=rank, group=dp_cpu())

    assert simulate(program, ranks=2).outcome is Outcome.MISMATCH


def test_group_coordinator_methods_route_to_the_dp_groups() -> None:
    def program(rank: int) -> dict[str, Any]:
        coordinator = runtime.current().dp_group()
        tensor = torch.tensor([rank + 1])
        same = coordinator.cpu_all_reduce_(tensor)
        device_sum = coordinator.all_reduce(torch.tensor([10 * (rank + 1)]))
        gathered = coordinator.all_gather(torch.tensor([[rank]]), dim=1)
        shared = coordinator.broadcast(torch.tensor([rank + 7]), src=1)
        coordinator.barrier()
        return {
            "in_place": same is tensor,
            "cpu": tensor.item(),
            "device": device_sum.item(),
            "gathered": gathered.tolist(),
            "shared": shared.item(),
            "rank_in_group": coordinator.rank_in_group,
            "world_size": coordinator.world_size,
            "first": coordinator.is_first_rank,
            "skip": runtime.current().skip_dp_coordination(),
        }

    result = simulate(program, ranks=2, skip_dp_coordination={1})

    assert result.outcome is Outcome.OK
    first, second = result.returns()
    assert first == {
        "in_place": True,
        "cpu": 3,
        "device": 30,
        "gathered": [[0, 1]],
        "shared": 8,
        "rank_in_group": 0,
        "world_size": 2,
        "first": True,
        "skip": False,
    }
    assert (second["rank_in_group"], second["first"], second["skip"]) == (
        1,
        False,
        True,
    )
    assert [c.group for c in result.ranks[0].collectives] == [
        "dp_cpu",
        "dp_device",
        "dp_device",
        "dp_device",
        "dp_cpu",
    ]


def test_unsimulated_distributed_calls_fail_loudly() -> None:
    def program(rank: int) -> None:
        dist.send(torch.zeros(1), dst=1 - rank)

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.CRASH
    assert result.ranks[0].error is not None
    assert "has no 'send'" in result.ranks[0].error.message


# -- installation discipline -------------------------------------------------------------


def test_nothing_stays_installed_after_any_run() -> None:
    real_all_reduce = torch.distributed.all_reduce

    def hangs(rank: int) -> None:
        if rank:
            all_reduce_rank_value(rank)

    for program in (sync_like_program, hangs):
        simulate(program, ranks=2)
        assert runtime.current() is runtime.NO_WORLD
        assert torch.distributed.all_reduce is real_all_reduce
    with pytest.raises(ReplayDivergedError):
        simulate(hangs, ranks=3, chooser=ReplayChooser([7]))
    assert runtime.current() is runtime.NO_WORLD
    with pytest.raises(RuntimeError, match="not inside a program"):
        sim.record("outside")


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
        "import sys; sys.path.insert(0, sys.argv[1]); import test_sim; "
        "sys.stdout.write(test_sim.deterministic_case().to_json())"
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


# -- scale and the benchmark hooks --------------------------------------------------------------


def test_256_ranks_run_and_agree() -> None:
    result = simulate(sync_like_program, ranks=256)

    assert result.outcome is Outcome.OK
    returns = result.returns()
    assert all(returned == returns[0] for returned in returns)
    assert len(result.ranks[255].collectives[0].contribution[0]) == 256


def _every_kind_with_what_each_rank_saw(rank: int) -> None:
    """Every collective kind, async and a hang; records each input and output as lists."""

    def entered(tensor: torch.Tensor) -> None:
        sim.record("in", value=tensor.tolist())

    def received(value: Any) -> None:
        sim.record("out", value=value)

    base = torch.arange(6, dtype=torch.int32).reshape(2, 3) * (rank + 1)
    reduced = base.clone()
    entered(reduced)
    dist.all_reduce(reduced, op=ReduceOp.MAX, group=dp_cpu())
    received(reduced.tolist())
    parts = [torch.empty(3, dtype=torch.float64) for _ in range(3)]
    mine = torch.full((3,), rank / 3, dtype=torch.float64)
    entered(mine)
    dist.all_gather(parts, mine, group=group("ep"))
    received([part.tolist() for part in parts])
    gathered = torch.empty(3, 2, dtype=torch.int64)
    row = torch.tensor([rank, -rank], dtype=torch.int64)
    entered(row)
    dist.all_gather_into_tensor(gathered, row, group=group("ep"))
    received(gathered.tolist())
    sent = torch.tensor([rank + 0.5])
    entered(sent)
    dist.broadcast(sent, src=2, group=group("dp_device"))
    received(sent.tolist())
    dist.barrier(group=dp_cpu())
    asynchronous = torch.tensor([rank + 1])
    entered(asynchronous)
    work = dist.all_reduce(asynchronous, group=dp_cpu(), async_op=True)
    work.wait()
    received(asynchronous.tolist())
    if rank != 1:
        stuck = torch.tensor([rank])
        entered(stuck)
        dist.all_reduce(stuck, group=dp_cpu())  # rank 1 never comes: a hang


def test_trace_values_are_the_tensors_as_lists_however_and_whenever_read() -> None:
    import copy
    import pickle

    result = simulate(_every_kind_with_what_each_rank_saw, ranks=3)
    assert result.outcome is Outcome.HANG

    # Read in one order ...
    for trace in result.ranks:
        ins = [e.payload["value"] for e in trace.events if e.kind == "in"]
        outs = [e.payload["value"] for e in trace.events if e.kind == "out"]
        records = [c for c in trace.collectives if c.signature.kind != "barrier"]
        assert [c.contribution for c in records] == ins
        completed = [c for c in records if c.completed]
        assert [c.result for c in completed] == outs
        assert all(c.result is None for c in records if not c.completed)
    # ... or in another, in a fresh run, or only through JSON: the same bytes.
    again = simulate(_every_kind_with_what_each_rank_saw, ranks=3)
    assert [r.result for t in again.ranks for r in t.collectives][::-1] == [
        r.result for t in result.ranks for r in t.collectives
    ][::-1]
    third = simulate(_every_kind_with_what_each_rank_saw, ranks=3)
    assert third.to_json() == result.to_json() == again.to_json()
    assert third == result
    # Copies and pickles carry the values, not the tensors they came from.
    fresh = simulate(_every_kind_with_what_each_rank_saw, ranks=3)
    assert pickle.loads(pickle.dumps(fresh)).to_json() == result.to_json()
    assert (
        copy.deepcopy(simulate(_every_kind_with_what_each_rank_saw, ranks=3)) == result
    )


def test_trace_size_grows_linearly_in_ranks_until_values_are_read() -> None:
    """A DP sync's contribution has O(ranks) values; nothing converts them unread.

    Counted in bytes of Python objects a result keeps (``tracemalloc``), not in
    time. Converting every rank's row to lists made them grow with ranks^2.
    """
    import gc
    import tracemalloc

    def kept(ranks: int) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            result = simulate(sync_like_program, ranks=ranks)
            gc.collect()
            count = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert [trace.state for trace in result.ranks] == [RankState.FINISHED] * ranks
        return count

    kept(256)  # warm caches and the worker pool
    small, large = kept(64), kept(256)
    assert large < 6 * small  # 4x when linear


def test_measure_overhead_reports_both_sides() -> None:
    numbers = sim.measure_overhead(sync_like_program, ranks=4, rounds=5)

    assert numbers["ranks"] == 4 and numbers["rounds"] == 5
    assert numbers["rounds_per_s"] > 0 and numbers["bare_rounds_per_s"] > 0
    assert numbers["overhead"] == pytest.approx(
        numbers["bare_rounds_per_s"] / numbers["rounds_per_s"]
    )


@pytest.mark.parametrize(
    "implementation",
    [
        "dpsim.sim.collectives.SimCollectives",
        "dpsim.sim.instant.InstantDist",
        "dpsim.replay.world.RecordingDist",
    ],
)
def test_every_fake_torch_distributed_defines_the_whole_protocol(
    implementation: str,
) -> None:
    # mypy holds the three to DistLike; this also catches a call that a class
    # answers only through its __getattr__ fallback, or under another name.
    import importlib
    import inspect

    from dpsim.records.dist import DistLike

    module, _, name = implementation.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    for member, declared in vars(DistLike).items():
        if member.startswith("_") or not inspect.isfunction(declared):
            continue
        defined = inspect.getattr_static(cls, member)
        wanted = list(inspect.signature(declared).parameters)
        accepted = inspect.signature(defined).parameters
        takes_any_keyword = any(
            parameter.kind is inspect.Parameter.VAR_KEYWORD
            for parameter in accepted.values()
        )
        missing = [p for p in wanted if p not in accepted and not takes_any_keyword]
        assert not missing, f"{name}.{member} lacks {missing}"
    assert inspect.getattr_static(cls, "ReduceOp") is torch.distributed.ReduceOp
