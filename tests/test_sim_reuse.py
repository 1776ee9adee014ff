"""A world serves many runs of one layout: each run must be as if it had a new one."""

from __future__ import annotations

import gc

import greenlet
import pytest
import torch
from simprograms import dist

from dpsim.records.trace import Outcome, RankState
from dpsim.sim import current_world, simulate, workers
from dpsim.sim import world as sim_world
from dpsim.sim.collectives import Pending
from dpsim.targets import runtime


def _sum_program(rank: int) -> int:
    tensor = torch.tensor([rank + 1, 10 * rank], dtype=torch.int32)
    dist.all_reduce(tensor)
    runtime.tick()
    dist.all_reduce(tensor, group=runtime.current().dp_group().cpu_group)
    return int(tensor.sum())


def _hanging_program(rank: int) -> None:
    if rank == 0:
        dist.all_reduce(torch.zeros(3))


def test_a_run_after_a_hung_run_of_its_layout_is_as_if_it_had_a_new_world() -> None:
    sim_world._IDLE.by_layout.clear()
    fresh = simulate(_sum_program, ranks=3).to_json()

    hung = simulate(_hanging_program, ranks=3)
    assert hung.outcome is Outcome.HANG
    assert sim_world._IDLE.by_layout, "the hung run's world was not kept for reuse"
    again = simulate(_sum_program, ranks=3)

    assert again.to_json() == fresh
    # The hung run's own trace still reads what it did, after the reuse.
    assert hung.ranks[0].state is RankState.WAITING
    assert hung.ranks[0].waiting is not None
    assert [record.contribution for record in hung.ranks[0].collectives] == [
        [0.0, 0.0, 0.0]
    ]


def test_a_trace_read_after_later_runs_reads_its_own_run() -> None:
    first = simulate(_sum_program, ranks=4)
    for _ in range(3):
        simulate(lambda rank: dist.all_reduce(torch.ones(2)), ranks=4)
    reference = simulate(_sum_program, ranks=4).to_json()

    assert first.to_json() == reference


def test_a_run_inside_a_run_gets_its_own_world() -> None:
    def outer(rank: int) -> tuple[int, str]:
        before = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(before)
        inner = simulate(_sum_program, ranks=4)
        after = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(after)
        return int(before + after), inner.outcome.value

    result = simulate(outer, ranks=4)

    assert result.outcome is Outcome.OK
    assert result.returns() == [(12, "ok")] * 4
    assert [len(trace.collectives) for trace in result.ranks] == [2] * 4


def test_runs_with_equal_declared_groups_share_one_world() -> None:
    # Each run declares its groups in a new mapping, as a scenario does.
    def run() -> object:
        worlds: list[object] = []

        def program(rank: int) -> None:
            worlds.append(current_world())
            dist.all_reduce(torch.ones(1), group=current_world().group("pair"))

        result = simulate(program, ranks=3, groups={"pair": [0, 1, 2]})
        assert result.outcome is Outcome.OK
        return worlds[0]

    sim_world._IDLE.by_layout.clear()
    assert run() is run()
    # A layout that differs gets a world of its own.
    other = simulate(lambda rank: None, ranks=3, groups={"pair": [2, 1, 0]})
    assert (
        other.groups
        != simulate(lambda rank: None, ranks=3, groups={"pair": [0, 1, 2]}).groups
    )


def test_a_copy_that_torch_refuses_raises_what_copy_raises() -> None:
    def program(rank: int) -> None:
        # Two elements over one memory location: torch refuses to write it,
        # in inference mode too (where a leaf that requires grad is written).
        dist.all_reduce(torch.zeros(1).expand(2))

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.CRASH
    error = result.ranks[1].error
    assert error is not None and error.type == "RuntimeError"
    assert "refers to a single memory location" in error.message


def test_an_idle_world_keeps_nothing_of_its_last_run() -> None:
    def program(rank: int) -> None:
        dist.all_reduce(torch.ones(2), group=current_world().group("reuse_probe"))

    result = simulate(program, ranks=2, groups={"reuse_probe": [0, 1]})
    assert result.outcome is Outcome.OK
    assert result.ranks[0].collectives  # read, so the records hold the values
    del result
    gc.collect()

    assert not [
        held
        for held in gc.get_objects()
        if type(held) is Pending and held.name == "reuse_probe"
    ]


def _meddling_program(rank: int) -> None:
    view = runtime.current().dp_group()
    if rank == 0:
        view.ranks.append(99)
    else:
        view.marker = rank  # type: ignore[attr-defined]


def _reading_program(rank: int) -> tuple[list[int], object]:
    view = runtime.current().dp_group()
    return list(view.ranks), getattr(view, "marker", None)


def test_what_a_target_does_to_its_dp_view_is_refused_and_does_not_outlive_the_run() -> (
    None
):
    sim_world._IDLE.by_layout.clear()
    meddled = simulate(_meddling_program, ranks=3)

    assert meddled.outcome is Outcome.CRASH
    errors = [trace.error for trace in meddled.ranks]
    assert errors[0] is not None and errors[0].type == "TypeError"
    assert "GroupCoordinator.ranks" in errors[0].message
    for error in errors[1:]:
        assert error is not None and error.type == "AttributeError"
        assert "'marker'" in error.message
    assert sim_world._IDLE.by_layout, "the meddled run's world was not kept for reuse"

    later = simulate(_reading_program, ranks=3)

    assert later.returns() == [([0, 1, 2], None)] * 3


def test_a_dp_views_ranks_is_a_list_as_vllms_is() -> None:
    def program(rank: int) -> bool:
        ranks = runtime.current().dp_group().ranks
        return isinstance(ranks, list) and ranks == [0, 1]

    assert simulate(program, ranks=2).returns() == [True, True]


def test_a_run_after_an_interrupted_run_of_its_layout_runs_every_rank() -> None:
    def interrupted(rank: int) -> None:
        raise KeyboardInterrupt

    sim_world._IDLE.by_layout.clear()
    fresh = simulate(_sum_program, ranks=2).to_json()
    with pytest.raises(KeyboardInterrupt):
        simulate(interrupted, ranks=2)

    assert simulate(_sum_program, ranks=2).to_json() == fresh


def test_a_world_reuses_its_ranks_greenlets_until_the_pool_is_reset() -> None:
    # Kept, not just their ids: a dropped greenlet's id can come back.
    seen: list[list[greenlet.greenlet]] = []

    def program(rank: int) -> None:
        seen[-1].append(greenlet.getcurrent())

    sim_world._IDLE.by_layout.clear()
    for reset_first in (False, False, True):
        if reset_first:
            workers.reset_pool()
        seen.append([])
        simulate(program, ranks=3)
    first, again, fresh = seen

    assert again == first
    assert not set(fresh) & set(first)


def test_idle_worlds_keep_at_most_max_idle_ranks_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sim_world, "MAX_IDLE_RANKS", 4)
    sim_world._IDLE.by_layout.clear()

    simulate(_sum_program, ranks=5)
    assert not sim_world._IDLE.by_layout
    simulate(_sum_program, ranks=3)
    simulate(_sum_program, ranks=2)
    kept = sim_world._IDLE.by_layout.values()
    assert [world.dist.world_size for world in kept] == [2]
