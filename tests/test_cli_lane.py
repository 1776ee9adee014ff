"""``--lane`` on the commands: the runner lane where it is wired, one-line
refusals where it is not or cannot be combined.

Fast tier: every refusal is decided from the options, before anything is
fetched or loaded. The release-marked tests run ``check --lane runner`` and
``replay`` of the file it writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import schemas

from dpsim.cli import build_parser, main


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_check_takes_a_lane_and_defaults_to_sync() -> None:
    assert build_parser().parse_args(["check"]).lane == "sync"
    assert build_parser().parse_args(["check", "--lane", "runner"]).lane == "runner"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (
            ["check", "--lane", "runner", "--runner", "v1", "--vllm", "0.11.1"],
            "runner lane (V1 runner): vLLM 0.11.1 cannot be driven",
        ),
        (
            ["check", "--lane", "runner", "--runner", "v1", "--caller-file", "x.py"],
            "check --lane runner: --caller-file is the sync lane's",
        ),
        (
            ["check", "--lane", "runner", "--scenario", "step"],
            "check --lane runner: --scenario is the sync lane's",
        ),
        (
            ["check", "--lane", "runner", "--profile", "contract"],
            "check --lane runner: --profile is the sync lane's",
        ),
        (
            ["check", "--lane", "runner", "--property", "graph-choice"],
            "property 'graph-choice' is not run on the runner lane",
        ),
        (
            ["check", "--property", "dummy-shape"],
            "unknown property 'dummy-shape'",
        ),
        (["check", "--lane", "runner", "--examples", "0"], "--examples must be"),
        (["check", "--lane", "bus"], "argument --lane: invalid choice: 'bus'"),
        (
            ["versions", "--lane", "runner", "--runner", "v1", "--profile", "contract"],
            "versions --lane runner: --profile is the sync lane's",
        ),
        (
            ["versions", "--lane", "runner", "--target", "x.py@0.33.0"],
            "versions --lane runner: --target FILE@SPEC is the sync lane's",
        ),
        (
            ["fuzz", "--lane", "runner", "--scenario", "step"],
            "fuzz --lane runner: --scenario is the sync lane's",
        ),
        (
            ["mutate", "--lane", "runner", "--target", "x.py"],
            "mutate --lane runner: --target is the sync lane's",
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_what_the_runner_lane_cannot_do_is_one_line_exit_2(
    arguments: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(arguments) == 2
    line = _one_error_line(capsys)
    assert line.startswith("dpsim: error: ") and says in line


def test_a_release_before_the_runner_lane_is_refused_unfetched(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    arguments = ["check", "--lane", "runner", "--vllm", "0.25.0"]
    assert main([*arguments, "--out", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert "no sort_batch_req_ids" in line
    assert "refused without fetching it" in line


def test_replay_refuses_a_malformed_runner_file_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"kind": "dpsim-runner-case", "schema": 1}))
    assert main(["replay", str(path)]) == 2
    line = _one_error_line(capsys)
    assert "malformed runner case" in line and str(path) in line


def test_the_pytest_plugin_takes_a_lane() -> None:
    from dpsim.errors import UsageError
    from dpsim.pytest_plugin import _configure

    assert _configure({}, False).options.lane == "sync"
    runner = _configure({"lane": "runner"}, False).options
    assert runner.lane == "runner" and runner.ranks == "2..4"
    assert _configure({}, False).options.ranks == "2..16"
    v1 = _configure({"lane": "runner", "runner": "v1"}, False).options
    assert v1.lane == "runner" and v1.runner == "v1"
    # The runner lane's own test gets a key of its own under V1 (V2's is as it was).
    assert v1.database_key("runner-lane").endswith(b"/runner-v1")
    assert not runner.database_key("runner-lane").endswith(b"/runner-v1")
    with pytest.raises(UsageError, match="lane 'bus'"):
        _configure({"lane": "bus"}, False)
    with pytest.raises(UsageError, match="--dpsim-target is the sync lane's"):
        _configure({"lane": "runner", "target": "dp_utils.py"}, False)


@pytest.mark.release
def test_targets_lane_runner_shows_what_runs_for_real(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["targets", "--lane", "runner", "--json", "0.33.0"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lane"] == "runner" and shown["refused"] == {}
    functions = {f["function"].split()[-1]: f for f in shown["functions"]}
    for name in (
        "GPUModelRunner.execute_model",
        "GPUModelRunner._dummy_run",
        "DPEngineCoreProc.run_busy_loop",
        "TargetDependentARSpeculator.propose",
    ):
        assert 0 < functions[name]["executed"] <= functions[name]["executable"]


@pytest.mark.release
def test_bench_measures_the_runner_lane(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--measure", "runner", "--vllm", "0.33.0", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["ranks"], shown["iterations"], shown["refused"]) == (4, 8, 0)
    assert shown["cases"] == 20 and 0 < shown["vllm_share"] < 1


@pytest.mark.release
def test_check_writes_a_runner_case_that_replays_byte_for_byte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The check finds the 0.33 drafter-prefill assertion under a dummy run
    (see the report: FULL graphs padding the dummy's requests) within its
    default budget, writes it, and replay reproduces it."""
    arguments = ["check", "--lane", "runner", "--vllm", "0.33.0", "--json"]
    assert main([*arguments, "--out", str(tmp_path)]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["lane"] == "runner" and summary["verdict"] == "fail"
    written = summary["counterexample"]
    schemas.assert_valid(written)
    assert main(["replay", written, "--json"]) == 1
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["status"] == "reproduced"


@pytest.mark.release
def test_versions_lane_runner_writes_one_row_per_release(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    arguments = ["versions", "--lane", "runner", "--runner", "v2", "0.28.0", "0.25.0"]
    # 0.25.0's row has no verdict, and no property failed: an error, status 2.
    assert main([*arguments, "--examples", "5", "--out", str(tmp_path)]) == 2
    report = (tmp_path / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2
    assert rows[0].startswith("| vllm 0.28.0 | v2 | ")
    assert rows[1].startswith(
        "| 0.25.0 | v2 | error | runner lane: vLLM 0.25.0 cannot be"
    )


def test_versions_lane_runner_has_a_row_per_runner_and_release(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Without --runner each release gets the V2 and the V1 runner's row; a
    release neither drives gets both refusals, nothing fetched."""
    arguments = ["versions", "--lane", "runner", "0.11.1", "--out", str(tmp_path)]
    assert main(arguments) == 2  # no row has a verdict
    report = (tmp_path / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[:3] for row in rows] == [
        ["| 0.11.1", "v2", "error"],
        ["| 0.11.1", "v1", "error"],
    ]
    assert "older than dpsim supports with the V2 runner" in rows[0]
    assert "V1 runner" in rows[1] and "refused without fetching it" in rows[1]


def test_a_runner_policy_must_be_one_the_lane_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = Path(__file__).parent.parent / "docs" / "policies" / "microbatching.toml"
    assert main(["check", "--lane", "runner", "--policy", str(policy)]) == 2
    assert "--policy: the runner lane does not model microbatching" in _one_error_line(
        capsys
    )


def test_a_fixed_policy_is_fitted_to_each_engine() -> None:
    from dpsim.lanes.runner.check import fitted
    from dpsim.lanes.runner.stream import EngineOptions
    from dpsim.records.policy import CapturePolicy

    options = EngineOptions(
        max_num_seqs=4,
        max_num_batched_tokens=12,
        speculator="ar",
        num_speculative_tokens=2,
    )
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16, 32), max_capture_size=32, cudagraph_mode="FULL"
    )
    fit = fitted(policy, options)
    assert fit.capture_sizes == (1, 2, 4, 8)
    assert (fit.max_capture_size, fit.max_num_seqs, fit.decode_query_len) == (12, 4, 3)
    assert fit.cudagraph_mode == policy.cudagraph_mode


def test_targets_fetch_for_the_runner_lane_takes_releases_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["targets", "--lane", "runner", "--refetch", "0.33.0"]) == 2
    assert "--refetch are the sync lane's" in _one_error_line(capsys)


@pytest.mark.release
def test_targets_fetch_for_the_runner_lane_keeps_the_lanes_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Set-up's one download per release: the entry then holds the engine
    loop's file, so the lane's first run fetches nothing again."""
    from dpsim.targets.cache import cache_root, release_dir

    assert main(["targets", "--fetch", "--lane", "runner", "0.33.0"]) == 0
    assert capsys.readouterr().out.strip() == "cached  vllm 0.33.0"
    entry = release_dir("0.33.0", cache_root())
    assert (entry / "vllm" / "v1" / "engine" / "core.py").is_file()
