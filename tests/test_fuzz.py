"""dpsim fuzz: stops at its deadline and on Ctrl-C, leaves nothing running,
and writes every counterexample it reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults import OWN_PADDING, RELEASE, write_faulty

from dpsim import cex
from dpsim.cli import main
from dpsim.errors import UsageError
from dpsim.fuzz import parse_duration

pytestmark = pytest.mark.release


def _fuzz_command(target: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from dpsim.cli import run; run()",
        "fuzz",
        "--vllm",
        RELEASE,
        "--target",
        str(target),
        "--workers",
        "2",
        "--ranks",
        "2..3",
        "--batch",
        "20",
        # profile holds on this target and keeps the workers busy until told
        # to stop; step breaks, and is shrunk and written.
        "--scenario",
        "step",
        "--scenario",
        "profile",
        "--db",
        str(tmp_path / "db"),
        "--out",
        str(tmp_path / "out"),
        "--json",
        *extra,
    ]


def _start(command: list[str], cwd: Path) -> subprocess.Popen[str]:
    # A session of its own: Ctrl-C is sent to a process group, as a terminal
    # does, and whatever is left of the group afterwards is a leak.
    return subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _left_in_group(group: int) -> list[int]:
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, [2] the process group; zombies are gone in
        # all but name (and their parent has exited).
        if int(fields[2]) == group and fields[0] != "Z":
            left.append(int(entry.name))
    return left


def _assert_clean_exit(process: subprocess.Popen[str], out: Path) -> dict[str, object]:
    stdout, _ = process.communicate(timeout=120)
    summary = json.loads(stdout)
    # The coordinator has exited; multiprocessing's helper may take a moment.
    deadline = time.monotonic() + 10
    while _left_in_group(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _left_in_group(process.pid) == []
    assert len(summary["pids"]) == 2
    for pid in summary["pids"]:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
    # Every failure reported has its file, and every file is a reported failure.
    reported = {failure["counterexample"] for failure in summary["failures"]}
    assert None not in reported
    assert reported == {str(path) for path in out.glob("*.json")}
    for path in reported:
        assert cex.read(Path(path)).case.scenario == "step"
    return summary


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_fuzz_stops_at_its_deadline(tmp_path: Path) -> None:
    target = write_faulty(OWN_PADDING, tmp_path / "own_padding.py")
    process = _start(_fuzz_command(target, tmp_path, "--for", "3s"), tmp_path)
    summary = _assert_clean_exit(process, tmp_path / "out")
    assert summary["stopped"] == "deadline"
    assert process.returncode == (1 if summary["failures"] else 0)
    assert summary["scenarios"]["profile"] > 0


def test_fuzz_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    target = write_faulty(OWN_PADDING, tmp_path / "own_padding.py")
    process = _start(_fuzz_command(target, tmp_path), tmp_path)
    assert process.stderr is not None
    for line in process.stderr:
        if "workers started" in line:
            break
    else:
        pytest.fail(f"fuzz never started: {process.communicate()}")
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)
    summary = _assert_clean_exit(process, tmp_path / "out")
    assert summary["stopped"] == "interrupted"
    # Cut short is not a pass, whatever it found by then.
    assert process.returncode == 130
    assert summary["verdict"] == ("fail" if summary["failures"] else "interrupted")


def test_durations_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_duration("90") == 90
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2.5s") == 2.5
    for bad in ("", "soon", "0s", "5x"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    assert main(["fuzz", "--vllm", RELEASE, "--for", "soon"]) == 2
    assert main(["fuzz", "--vllm", RELEASE, "--workers", "0", "--for", "1s"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


def test_an_interrupted_campaign_does_not_read_as_a_pass() -> None:
    from dpsim.cli.fuzz import render, summary
    from dpsim.fuzz import Tally

    tally = Tally("vllm 0.20.0", 2, ("step",), stopping="interrupted")
    assert summary(tally)["verdict"] == "interrupted"
    assert "result: INTERRUPTED: 0 failure(s)" in render(tally)
    tally.stopping = "deadline"
    assert summary(tally)["verdict"] == "pass"


# -- the runner lane ----------------------------------------------------------------

RUNNER_RELEASE = "0.33.0"


def test_runner_lane_fuzz_writes_the_known_finding(tmp_path: Path) -> None:
    """0.33.0 under drawn default-grid policies breaks no-error within a few
    dozen cases (the drafter prefill's reuse assertion, G2): the campaign
    ends as soon as its one test fails, and the runner case file it writes
    replays to the same verdicts byte for byte."""
    out = tmp_path / "out"
    command = [
        *("fuzz", "--lane", "runner", "--vllm", RUNNER_RELEASE, "--workers", "1"),
        *("--for", "10m", "--db", str(tmp_path / "db"), "--out", str(out), "--json"),
    ]
    process = subprocess.run(
        [sys.executable, "-c", "from dpsim.cli import run; run()", *command],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    summary = json.loads(process.stdout)
    assert process.returncode == 1, process.stderr
    assert summary["stopped"] == "finished"
    assert list(summary["scenarios"]) == ["runner-lane"]
    [failure] = summary["failures"]
    assert failure["property"] == "no-error"
    assert "reusing a DP sync" in failure["message"]
    written = Path(failure["counterexample"])
    assert json.loads(written.read_text())["lane"] == "runner"
    assert main(["replay", str(written), "--json"]) == 1


def test_runner_lane_fuzz_refuses_the_sync_lanes_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for extra, flag in (
        (["--scenario", "step"], "--scenario"),
        (["--profile", "contract"], "--profile"),
        (["--caller-file", "x.py"], "--caller-file"),
    ):
        assert main(["fuzz", "--lane", "runner", "--for", "1s", *extra]) == 2
        assert flag in capsys.readouterr().err
    # A release the lane does not drive: refused in one line, before a fetch.
    assert main(["fuzz", "--lane", "runner", "--vllm", "0.20.0", "--for", "1s"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sort_batch_req_ids" in err
