"""The sim's mailbox and quiescence hook: a rank parks until a message comes,
the ``on_quiescent`` callback may wake parked ranks, and a rank still parked at
the end is told apart from one waiting in a collective. No vLLM code."""

from __future__ import annotations

from types import FrameType
from typing import Any

import pytest
import torch
from simprograms import dist, dp_cpu

from dpsim.records.trace import Outcome, RankState
from dpsim.sim import current_world, simulate
from dpsim.sim.mailbox import PARKED_EVENT, Mailbox, Quiescence


def _frames_names(frame: FrameType | None) -> list[str]:
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


def test_a_put_wakes_the_parked_owner_with_messages_in_order() -> None:
    boxes = [Mailbox(0, "input"), Mailbox(1, "input")]

    def program(rank: int) -> list[Any]:
        if rank == 1:
            boxes[0].put("a")
            boxes[0].put("b")
            return []
        return [boxes[0].get(), boxes[0].get()]

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.OK
    assert result.returns() == [["a", "b"], []]
    assert all(not trace.events for trace in result.ranks)


def test_on_quiescent_delivers_to_parked_ranks_and_the_run_goes_on() -> None:
    boxes = [Mailbox(rank, "input") for rank in range(3)]
    seen: list[tuple[dict[int, str], tuple[int, ...], list[str]]] = []

    def program(rank: int) -> Any:
        got = boxes[rank].get()
        if got == "reduce":
            tensor = torch.tensor([rank + 1])
            dist.all_reduce(tensor, group=dp_cpu())
            return int(tensor.item())
        return got

    def on_quiescent(now: Quiescence) -> bool:
        parked = now.parked
        seen.append(
            (
                {rank: box.name for rank, box in parked.items()},
                now.blocked,
                _frames_names(now.frame(0)),
            )
        )
        if not parked:
            return False
        for rank in parked:
            boxes[rank].put("reduce")
        return True

    result = simulate(program, ranks=3, on_quiescent=on_quiescent)

    assert result.outcome is Outcome.OK
    assert result.returns() == [6, 6, 6]
    first, last = seen[0], seen[-1]
    assert first[0] == {0: "input", 1: "input", 2: "input"}
    assert first[1] == (0, 1, 2)
    # The parked rank's stack reaches back through Mailbox.get into its program.
    assert "get" in first[2] and "program" in first[2]
    assert last == ({}, (), [])
    assert len(seen) == 2


def test_a_rank_left_parked_is_waiting_with_a_parked_event_not_a_collective_wait() -> (
    None
):
    box = Mailbox(1, "engine input")

    def program(rank: int) -> None:
        if rank == 0:
            dist.all_reduce(torch.tensor([1]), group=dp_cpu())
        else:
            box.get()

    frames: list[list[str]] = []

    def on_quiescent(now: Quiescence) -> bool:
        frames.extend(_frames_names(now.frame(rank)) for rank in now.blocked)
        return False

    result = simulate(program, ranks=2, on_quiescent=on_quiescent)

    # Where each stood: one in the collective, the other in its mailbox.
    assert "all_reduce" in frames[0] and "program" in frames[0]
    assert "get" in frames[1] and "program" in frames[1]
    assert result.outcome is Outcome.HANG
    waiting, parked = result.ranks
    assert waiting.state is RankState.WAITING and waiting.waiting is not None
    assert not waiting.events
    assert parked.state is RankState.WAITING and parked.waiting is None
    (event,) = parked.events
    assert event.kind == PARKED_EVENT
    assert event.payload == {"mailbox": "engine input"}


def test_a_callback_that_wakes_no_one_ends_the_run_once() -> None:
    box = Mailbox(0)
    calls = []

    def on_quiescent(now: Quiescence) -> bool:
        calls.append(dict(now.parked))
        return True  # says go on, but put nothing: the run must still end

    result = simulate(lambda rank: box.get(), ranks=1, on_quiescent=on_quiescent)

    assert result.outcome is Outcome.HANG
    assert calls == [{0: box}]


def test_taking_from_another_ranks_mailbox_is_an_error_in_that_rank() -> None:
    box = Mailbox(1)

    def program(rank: int) -> None:
        if rank == 0:
            box.get()

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.CRASH
    error = result.ranks[0].error
    assert error is not None and "rank 0 took from rank 1's mailbox" in error.message


def test_a_mailbox_outside_a_run_only_queues() -> None:
    box = Mailbox(0)
    box.put(1)
    assert not box.empty() and len(box) == 1
    assert box.get() == 1 and box.empty()
    with pytest.raises(IndexError):
        box.get_nowait()
    with pytest.raises(RuntimeError, match="inside a run"):
        box.get()


def test_the_world_forgets_a_parked_rank_once_woken() -> None:
    box = Mailbox(0)
    parked_during: list[dict[int, Mailbox]] = []

    def program(rank: int) -> None:
        if rank == 0:
            box.get()
            parked_during.append(dict(current_world().parked))
        else:
            box.put("x")

    result = simulate(program, ranks=2)

    assert result.outcome is Outcome.OK
    assert parked_during == [{}]
