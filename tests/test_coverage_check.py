"""``dpsim check --coverage`` on cached releases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpsim.check import CheckOptions, run_check
from dpsim.cli import main
from dpsim.coverage import Unreachable, measure
from dpsim.coverage.targets import scopes_for

pytestmark = pytest.mark.release


def check_json(
    capsys: pytest.CaptureFixture[str], out: Path, *args: str
) -> dict[str, Any]:
    main(
        [
            "check",
            "--coverage",
            "--json",
            "--out",
            str(out),
            "--scenario",
            "step",
            *args,
        ]
    )
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_v2_reports_dp_utils_lines_branches_and_html(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = check_json(capsys, tmp_path / "a", "--vllm", "0.33.0", "--examples", "20")
    covered = data["coverage"]
    assert covered["version"] == "0.33.0"
    files = {item["file"]: item for item in covered["files"]}
    assert list(files) == [
        "v1/worker/gpu/dp_utils.py",
        "v1/worker/gpu/cudagraph_utils.py",
    ]
    dp_utils = files["v1/worker/gpu/dp_utils.py"]
    assert (
        dp_utils["functions"]
        == [
            "DPSyncState.__post_init__",
            "sync_cudagraph_and_dp_padding",
            "dispatch_cg_and_sync_dp",
        ][-len(dp_utils["functions"]) :]
        or dp_utils["functions"]
    )
    assert 0 < dp_utils["lines_executed"] < dp_utils["lines"]
    assert 0 < dp_utils["branches_executed"] <= dp_utils["branches"]
    # Every line is counted once: run, listed as never run, or marked unreachable.
    assert (
        dp_utils["lines_executed"]
        + len(dp_utils["missing_lines"])
        + len(dp_utils["unreachable_lines"])
        == dp_utils["lines"]
    )
    assert [(item["scenario"], item["profile"]) for item in covered["contexts"]] == [
        ("step", "caller")
    ]
    assert set(covered["files"][0]) >= {
        "missing_lines",
        "missing_branches",
        "unreachable_branches",
        "unreachable_lines",
    }
    html = Path(covered["html"])
    assert html == tmp_path / "a" / "coverage" / "index.html"
    page = (html.parent / "v1_worker_gpu_dp_utils.py.html").read_text()
    assert "dispatch_cg_and_sync_dp" in page
    # The same seed: the same coverage, byte for byte (HTML path aside).
    again = check_json(capsys, tmp_path / "a", "--vllm", "0.33.0", "--examples", "20")
    assert json.dumps(again["coverage"], sort_keys=True) == json.dumps(
        covered, sort_keys=True
    )


def test_v1_measures_the_dispatcher_and_the_caller_method(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = check_json(
        capsys, tmp_path, "--vllm", "0.33.0", "--runner", "v1", "--examples", "10"
    )
    files = {item["file"]: item for item in data["coverage"]["files"]}
    assert set(files) == {
        "v1/worker/dp_utils.py",
        "v1/cudagraph_dispatcher.py",
        "v1/worker/gpu_model_runner.py",
    }
    caller = files["v1/worker/gpu_model_runner.py"]
    assert (
        caller["functions"][0]
        == "GPUModelRunner._determine_batch_execution_and_padding"
    )
    assert caller["lines_executed"] > 0
    assert files["v1/cudagraph_dispatcher.py"]["functions"][0] == (
        "CudagraphDispatcher.dispatch"
    )


def test_the_text_report_lists_never_run_lines_by_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    main(
        [
            *("check", "--vllm", "0.33.0", "--coverage", "--scenario", "profile"),
            *("--examples", "5", "--out", str(tmp_path)),
        ]
    )
    out = capsys.readouterr().out
    assert "target coverage (" in out and "not the `coverage` property" in out
    assert "lines never run: dp_utils.py:" in out
    assert "    profile caller: dp_utils.py lines " in out
    assert f"html: {tmp_path / 'coverage' / 'index.html'}" in out


def test_a_mark_on_a_release_branch_lists_it_apart(release: Any) -> None:
    target = release("0.33.0")
    mark = Unreachable(
        ">=0.33",
        "v1/worker/gpu/dp_utils.py",
        "dispatch_cg_and_sync_dp",
        "if dp_size == 1:",
        "return batch_desc, None",
        "dpsim checks DP groups of two ranks and more",
    )
    measurement = measure(scopes_for(target), marks=(mark,))
    options = CheckOptions(scenarios=("step",), examples=5, coverage=measurement)
    run_check(target, options)
    dp_utils = measurement.result(target.version).files[0]
    (arc,) = dp_utils.unreachable_branches
    assert dp_utils.analysis.text(arc[0]) == "if dp_size == 1:"
    assert arc not in dp_utils.missing_branches
    assert dp_utils.unreachable_branches[arc] == mark.reason


def test_a_target_file_is_shown_as_the_file_it_stands_for(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, release_file: Any
) -> None:
    mine = tmp_path / "my_dp_utils.py"
    mine.write_bytes(release_file("0.33.0", "v1/worker/gpu/dp_utils.py").read_bytes())
    data = check_json(
        capsys,
        tmp_path / "out",
        *("--vllm", "0.33.0", "--target", str(mine), "--examples", "3"),
    )
    dp_utils = data["coverage"]["files"][0]
    # Named (and matched by the unreachable marks) as the module it plays.
    assert dp_utils["file"] == "v1/worker/gpu/dp_utils.py"
    assert dp_utils["path"] == str(mine)
    assert dp_utils["lines_executed"] > 0


def test_a_modelled_v1_caller_is_not_measured(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = check_json(
        capsys, tmp_path, *("--vllm", "0.11.1", "--runner", "v1", "--examples", "3")
    )
    files = [item["file"] for item in data["coverage"]["files"]]
    assert files == ["v1/worker/dp_utils.py", "v1/cudagraph_dispatcher.py"]
