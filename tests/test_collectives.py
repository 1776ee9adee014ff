"""The fake collectives (``dpsim.sim.collectives``) and the coordinator view:
async ops, several groups, each collective's semantics, the DistLike protocol.
No vLLM code involved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed
from simprograms import ReduceOp, dist, dp_cpu, group

from dpsim.records.trace import Outcome, RankState
from dpsim.sim import simulate
from dpsim.targets import runtime

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
