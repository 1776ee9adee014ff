"""The real-distributed lane: real processes, real gloo groups, real hangs.

Each test runs a case on N real processes and checks that the lane's verdict
and per-rank diagnosis agree with the simulator's, and that no process
outlives the test. Timeouts are short (1 s) so a hang costs little.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import faults as faulty
import pytest

from dpsim import cex
from dpsim.cli import main
from dpsim.cli.replay import _render_lane
from dpsim.properties import judge
from dpsim.records.case import Case
from dpsim.records.trace import Outcome, RankState
from dpsim.replay import LaneError, LaneRun, disagreements, run_lane
from dpsim.scenarios import run_case
from dpsim.targets import load_target

pytestmark = [pytest.mark.release, pytest.mark.gloo]

TIMEOUT_S = 1.0


def _children() -> set[int]:
    """Live processes whose parent is this one, read from /proc."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def no_process_survives() -> Iterator[None]:
    before = _children()
    yield
    assert multiprocessing.active_children() == []
    assert _children() - before == set(), "a lane process outlived its test"


def _agree(target_file: Path | None, vllm: str, case: Case) -> LaneRun:
    """Run ``case`` on the simulator and on the lane; they must agree."""
    target = load_target(vllm, target_file)
    simulated = run_case(target, case)
    verdicts = tuple(judge(case, simulated))
    lane = run_lane(
        case,
        vllm=vllm,
        target_file=None if target_file is None else str(target_file),
        timeout_s=TIMEOUT_S,
        expected_files={item.module: item.sha256 for item in target.files},
    )
    assert disagreements(simulated, verdicts, lane.result, lane.verdicts) == ()
    assert lane.source_mismatch == ()
    assert [end.pid for end in lane.ends] and all(
        not Path(f"/proc/{end.pid}").exists() for end in lane.ends
    )
    return lane


# Four ranks, not also two: the same lane code with one waiting peer is a
# subset of three waiting peers, and each rank is a process importing torch.
def test_an_idle_rank_skipping_the_sync_hangs_its_peers_for_real(
    tmp_path: Path,
) -> None:
    source = faulty.write(tmp_path, "idle.py", faulty.IDLE_RETURNS_EARLY)
    lane = _agree(source, faulty.BASE, faulty.step_case(3, 0, 2, 1))
    assert lane.result.outcome is Outcome.HANG
    # Whatever the idle rank does next, its peers wait for it in the sync.
    for rank, trace in enumerate(lane.result.ranks):
        if rank != 1:
            assert trace.state is RankState.WAITING and trace.waiting is not None
            assert (trace.waiting.group, trace.waiting.seq) == ("dp_cpu", 0)
            assert 1 in trace.waiting.missing


# Four ranks alone, as above: two ranks mismatching is the same lane code.
def test_ranks_padding_to_their_own_graphs_mismatch_for_real(tmp_path: Path) -> None:
    source = faulty.write(tmp_path, "pads.py", faulty.PADS_LOCALLY)
    lane = _agree(source, faulty.BASE, faulty.step_case(1, 3, 5, 2))
    result = lane.result
    assert result.outcome is Outcome.MISMATCH
    assert any(item.group == "ep" and item.mismatched for item in result.incomplete)
    assert {verdict.property for verdict in lane.verdicts} >= {"no-hang", "agreement"}


def test_a_correct_target_passes_on_both_lanes() -> None:
    case = faulty.step_case(2, 1, profile="caller")
    lane = _agree(None, "0.33.0", case)
    assert lane.result.outcome is Outcome.OK
    assert lane.verdicts == ()
    assert lane.watchdog_fired is False


def test_the_real_033_idle_rank_case_replays_on_gloo_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = faulty.idle_case_on_033(tmp_path)
    recorded = cex.read(found)
    args = ["replay", str(found), "--backend", "gloo", "--timeout", str(TIMEOUT_S)]
    assert main([*args, "--json"]) == (1 if recorded.verdicts else 0)
    summary = json.loads(capsys.readouterr().out)
    assert summary["lane"]["disagreements"] == []
    assert summary["lane"]["outcome"] == recorded.outcome
    assert summary["lane"]["verdicts"] == list(recorded.verdicts)


def test_a_v1_runner_counterexample_replays_on_gloo_and_agrees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # V1's sync reduces on the DP device group: the lane's gloo stand-in for it.
    found = faulty.v1_mode_not_synced_on_033(tmp_path)
    recorded = cex.read(found)
    args = ["replay", str(found), "--backend", "gloo", "--timeout", str(TIMEOUT_S)]
    assert main([*args, "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["runner"] == "v1"
    assert summary["lane"]["disagreements"] == []
    assert summary["lane"]["outcome"] == recorded.outcome == "mismatch"
    assert summary["lane"]["verdicts"] == list(recorded.verdicts)


def test_the_watchdog_ends_a_rank_stuck_outside_any_collective(tmp_path: Path) -> None:
    source = faulty.write(tmp_path, "sleeps.py", faulty.IDLE_SLEEPS)
    lane = run_lane(
        faulty.step_case(1, 0),
        vllm=faulty.BASE,
        target_file=str(source),
        timeout_s=1.0,
    )
    assert lane.watchdog_fired
    assert lane.ends[1].reaped in ("terminated", "killed")
    shown = "\n".join(_render_lane(lane, ()))
    assert "watchdog fired" in shown and "the real lane agrees" in shown
    assert lane.result.outcome is Outcome.HANG
    sleeper = lane.result.ranks[1]
    assert sleeper.state is RankState.WAITING and sleeper.collectives == ()
    assert lane.result.ranks[0].waiting is not None
    assert lane.result.ranks[0].waiting.missing == (1,)


def test_a_rank_that_cannot_start_fails_the_lane_cleanly(tmp_path: Path) -> None:
    with pytest.raises(
        LaneError, match=r"rank \d failed to start: TargetError: .*no such file"
    ):
        run_lane(
            faulty.step_case(1, 1),
            vllm=faulty.BASE,
            target_file=str(tmp_path / "gone.py"),
            timeout_s=TIMEOUT_S,
        )


def test_nccl_without_gpus_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for machines without")
    case = faulty.step_case(1, 0)
    target = load_target("0.33.0")
    result = run_case(target, case)
    path = cex.write(
        cex.files.build(target, case, result, tuple(judge(case, result)), ()),
        tmp_path,
    )
    assert main(["replay", str(path), "--backend", "nccl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dpsim: error: --backend nccl needs CUDA GPUs; none is visible here"


@pytest.mark.gpu
def test_nccl_lane_agrees_with_the_simulator(tmp_path: Path) -> None:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    source = faulty.write(tmp_path, "pads.py", faulty.PADS_LOCALLY)
    case = faulty.step_case(1, 3)
    target = load_target(faulty.BASE, source)
    simulated = run_case(target, case)
    lane = run_lane(
        case,
        vllm=faulty.BASE,
        target_file=str(source),
        backend="nccl",
        timeout_s=5.0,
    )
    assert (
        disagreements(
            simulated, tuple(judge(case, simulated)), lane.result, lane.verdicts
        )
        == ()
    )
