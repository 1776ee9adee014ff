"""The simulator end to end on hand-written programs: agreement, the trace,
diagnosis, installation discipline, scale. No vLLM code involved."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import torch
import torch.distributed
from simprograms import ReduceOp, all_reduce_rank_value, dist, dp_cpu, group

from dpsim import sim
from dpsim.records.trace import Outcome, RankState
from dpsim.sim import (
    ReplayChooser,
    ReplayDivergedError,
    render_table,
    simulate,
)
from dpsim.sim.example import sync_like_program
from dpsim.targets import runtime

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
        assert not torch.is_inference_mode_enabled()
    with pytest.raises(ReplayDivergedError):
        simulate(hangs, ranks=3, chooser=ReplayChooser([7]))
    assert runtime.current() is runtime.NO_WORLD
    assert not torch.is_inference_mode_enabled()
    with pytest.raises(RuntimeError, match="not inside a program"):
        sim.record("outside")


def test_every_rank_runs_in_inference_mode_as_vllms_step_does() -> None:
    # vLLM reaches the DP sync inside execute_model or _dummy_run, both
    # decorated with torch.inference_mode(); a rank's tensors are inference
    # tensors, and an in-place write to a leaf that requires grad is allowed.
    def program(rank: int) -> tuple[bool, bool, bool]:
        leaf = torch.zeros(2, requires_grad=True)
        dist.all_reduce(leaf)
        return (
            torch.is_inference_mode_enabled(),
            leaf.is_inference(),
            torch.is_grad_enabled(),
        )

    result = simulate(program, ranks=3)

    assert result.outcome is Outcome.OK
    assert result.returns() == [(True, True, False)] * 3
    assert not torch.is_inference_mode_enabled()


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
    # The same comparison by CPU time (None only below the clock's resolution).
    assert numbers["cpu_overhead"] is None or numbers["cpu_overhead"] > 0


def test_measure_overhead_times_each_side_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A side's first round after the other side ran is not timed.

    On a real machine that round refills the caches the other side evicted,
    and only the simulated side has code and data of its own to refill. Here
    a fake clock charges each call 1 and a side's first call after the other
    side's 3 (bare) or 7 (simulated) more: timed warm, both sides read alike.
    """
    from types import SimpleNamespace

    from dpsim.sim import overhead
    from dpsim.sim.instant import InstantWorld

    clock = [0.0]
    last_side = [""]

    def program(rank: int) -> int:
        side = "bare" if isinstance(runtime.current(), InstantWorld) else "sim"
        if side != last_side[0]:
            clock[0] += 3.0 if side == "bare" else 7.0
            last_side[0] = side
        clock[0] += 1.0
        return rank

    def read() -> float:
        return clock[0]

    monkeypatch.setattr(
        overhead, "time", SimpleNamespace(perf_counter=read, process_time=read)
    )
    numbers = sim.measure_overhead(program, ranks=2, rounds=6, chunks=3)

    assert numbers["overhead"] == 1.0
    assert numbers["cpu_overhead"] == 1.0


def test_measure_overhead_times_both_sides_with_the_heap_frozen() -> None:
    """Timed rounds run as a check's cases do: the heap alive before them is
    left out of the collector's full collections, and given back after."""
    import gc

    frozen_while_timed: set[bool] = set()

    def program(rank: int) -> int:
        frozen_while_timed.add(gc.get_freeze_count() > 0)
        return rank

    # A runner-lane test in this worker may have frozen the heap for good.
    frozen_before = gc.get_freeze_count() > 0
    gc.unfreeze()
    try:
        sim.measure_overhead(program, ranks=2, rounds=4, chunks=2)
        unfrozen_after = gc.get_freeze_count() == 0
    finally:
        if frozen_before:
            gc.freeze()

    # The reference run and the honesty check run before the freeze.
    assert frozen_while_timed == {False, True}
    assert unfrozen_after


class _Highest(sim.choosers.LowestFirst):
    """A chooser that only looks like the default: it picks the highest rank."""

    def choose(self, runnable: Any) -> int:
        return runnable[-1]


class _Lowest:
    """The default's order through an ordinary chooser call."""

    def choose(self, runnable: Any) -> int:
        return runnable[0]


def test_default_order_recorded_as_a_chooser_would() -> None:
    # The scheduler picks for the default chooser without calling it; the run
    # and its recorded choices must be what calling a lowest-first chooser
    # gives, and a subclass overriding choose() must still be asked.
    default = simulate(sync_like_program, ranks=4)
    called = simulate(sync_like_program, ranks=4, chooser=_Lowest())
    assert default.to_json() == called.to_json()
    assert default.choices == (0, 1, 2, 0, 1, 2)
    highest = simulate(sync_like_program, ranks=4, chooser=_Highest())
    assert highest.choices != default.choices
    assert highest.choices[0] == 3
