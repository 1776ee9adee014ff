"""The real lane's trace builder on hand-written per-rank logs, without processes.

Each log is what ``dpsim.replay.world`` writes, one JSON object per line; the
builder must judge them as the simulator judges the same run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpsim.records.groups import DEFAULT_GROUP_NAMES, DP_CPU_GROUP
from dpsim.records.trace import (
    ErrorInfo,
    IncompleteCollective,
    Outcome,
    Peer,
    RankState,
    Signature,
    SimResult,
)
from dpsim.replay.traces import parse_log, result_from_logs

SUM_2 = Signature("all_reduce", "SUM", (2,), "torch.int32", None)
SUM_3 = Signature("all_reduce", "SUM", (3,), "torch.int32", None)


def enter(seq: int, contribution: list[int], steps: int) -> dict[str, Any]:
    shape = [len(contribution)]
    return {
        "enter": [DP_CPU_GROUP, seq, "all_reduce", "SUM", shape, "torch.int32", None],
        "contribution": contribution,
        "is_async": False,
        "steps": steps,
    }


def ready() -> dict[str, Any]:
    return {"ready": {"files": {"sync.py": "0" * 64}}}


def lane_result(tmp_path: Path, *logs: list[dict[str, Any] | str]) -> SimResult:
    """Writes each rank's entries (a str is written as is: a line cut short) and builds."""
    parsed = []
    for rank, entries in enumerate(logs):
        path = tmp_path / f"rank{rank}.jsonl"
        path.write_text(
            "".join(
                (entry if isinstance(entry, str) else json.dumps(entry)) + "\n"
                for entry in entries
            )
        )
        parsed.append(parse_log(rank, path))
    return result_from_logs(parsed)


def test_a_clean_run_is_ok_with_every_collective_completed(tmp_path: Path) -> None:
    result = lane_result(
        tmp_path,
        [
            ready(),
            enter(0, [1, 0], steps=1),
            {"exit": [1, 2]},
            {"event": ["sync", 1, {"tokens": 1}]},
            {"finished": [2], "steps": 2},
        ],
        [
            ready(),
            enter(0, [0, 2], steps=1),
            {"exit": [1, 2]},
            {"finished": [2], "steps": 1},
        ],
    )
    assert result.outcome is Outcome.OK
    assert [trace.state for trace in result.ranks] == [RankState.FINISHED] * 2
    assert result.returns() == [[2], [2]]
    assert [trace.steps for trace in result.ranks] == [2, 1]
    assert result.incomplete == ()
    assert result.groups == tuple((name, (0, 1)) for name in DEFAULT_GROUP_NAMES)
    first = result.ranks[0].collectives[0]
    assert (first.group, first.seq, first.signature) == (DP_CPU_GROUP, 0, SUM_2)
    assert (first.contribution, first.result, first.completed) == ([1, 0], [1, 2], True)
    assert [
        (e.kind, e.after_collectives, e.payload) for e in result.ranks[0].events
    ] == [("sync", 1, {"tokens": 1})]


def test_a_rank_left_alone_in_a_collective_hangs(tmp_path: Path) -> None:
    # Rank 0 entered and was killed there: its last line is cut short, and an
    # event it wrote before entering stays while none after does.
    result = lane_result(
        tmp_path,
        [
            ready(),
            {"event": ["sync", 0, {"tokens": 3}]},
            enter(0, [3, 0], steps=4),
            {"event": ["late", 1, {}]},
            '{"exit": [3',
        ],
        [ready(), {"finished": [0], "steps": 2}],
    )
    assert result.outcome is Outcome.HANG
    stuck, idle = result.ranks
    assert (stuck.state, stuck.steps, stuck.returned) == (RankState.WAITING, 4, None)
    assert stuck.waiting is not None
    assert (stuck.waiting.group, stuck.waiting.seq) == (DP_CPU_GROUP, 0)
    assert (stuck.waiting.missing, stuck.waiting.disagreeing) == ((1,), ())
    assert [event.kind for event in stuck.events] == ["sync"]
    assert stuck.collectives[0].completed is False
    assert stuck.collectives[0].result is None
    assert idle.state is RankState.FINISHED
    assert result.incomplete == (
        IncompleteCollective(DP_CPU_GROUP, 0, (0,), (1,), False),
    )


def test_members_that_disagree_are_a_mismatch_whatever_the_backend_returned(
    tmp_path: Path,
) -> None:
    # gloo may hand back garbage on a size mismatch and let both go on: the
    # mismatched collective is where both are stuck, and what followed is cut.
    result = lane_result(
        tmp_path,
        [
            ready(),
            enter(0, [1, 0], steps=1),
            {"exit": [1, 9]},
            enter(1, [5, 5], steps=2),
            {"exit": [6, 6]},
            {"finished": [1], "steps": 3},
        ],
        [
            ready(),
            enter(0, [0, 2, 0], steps=1),
            {"exit": [0, 2, 0]},
            enter(1, [1, 1], steps=2),
            {"exit": [6, 6]},
            {"finished": [2], "steps": 3},
        ],
    )
    assert result.outcome is Outcome.MISMATCH
    for trace, own, other in zip(
        result.ranks, (SUM_2, SUM_3), (SUM_3, SUM_2), strict=True
    ):
        assert (trace.state, trace.steps) == (RankState.WAITING, 1)
        assert len(trace.collectives) == 1
        assert (trace.collectives[0].result, trace.collectives[0].completed) == (
            None,
            False,
        )
        assert trace.waiting is not None
        assert trace.waiting.signature == own
        assert trace.waiting.disagreeing == (Peer(1 - trace.rank, other),)
        assert trace.waiting.missing == ()
    assert result.incomplete == (
        IncompleteCollective(DP_CPU_GROUP, 0, (0, 1), (), True),
    )


def test_a_rank_that_raised_makes_a_crash_and_leaves_its_peer_waiting(
    tmp_path: Path,
) -> None:
    error = {"type": "ValueError", "message": "bad batch", "where": "sync.py:7 in run"}
    result = lane_result(
        tmp_path,
        [ready(), enter(0, [2, 0], steps=1)],
        [ready(), {"raised": error, "steps": 3}],
    )
    assert result.outcome is Outcome.CRASH
    waiting, raised = result.ranks
    assert raised.state is RankState.RAISED
    assert raised.error == ErrorInfo("ValueError", "bad batch", "sync.py:7 in run")
    assert raised.steps == 3
    assert waiting.state is RankState.WAITING
    assert waiting.waiting is not None
    assert waiting.waiting.missing == (1,)
    assert result.incomplete == (
        IncompleteCollective(DP_CPU_GROUP, 0, (0,), (1,), False),
    )


def test_the_lane_judges_a_mismatch_as_the_simulator_does(tmp_path: Path) -> None:
    import torch

    from dpsim.sim import current_world, simulate
    from dpsim.targets import runtime

    contributions = ([1, 0], [0, 2, 0])

    def program(rank: int) -> None:
        tensor = torch.tensor(contributions[rank], dtype=torch.int32)
        runtime.DIST_PROXY.all_reduce(tensor, group=current_world().group(DP_CPU_GROUP))

    simulated = simulate(program, ranks=2).to_dict()
    real = lane_result(
        tmp_path,
        *[
            [ready(), enter(0, contribution, steps=1), {"exit": contribution}]
            for contribution in contributions
        ],
    ).to_dict()
    del simulated["choices"], real["choices"]
    assert real == simulated
