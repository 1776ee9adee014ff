"""Target coverage of the runner lane: the real methods it rebuilds and runs."""

from __future__ import annotations

from typing import Any

import pytest

from dpsim.coverage import measure
from dpsim.coverage.render import render_text
from dpsim.coverage.targets import runner_lane_scopes, scopes_for
from dpsim.lanes.runner.check import (
    COVERAGE_CONTEXT,
    RunnerCheckOptions,
    run_runner_check,
)

pytestmark = pytest.mark.release


def test_the_runner_lanes_real_methods_are_measured(release: Any) -> None:
    target = release("0.33.0")
    measurement = measure(runner_lane_scopes(target))
    options = RunnerCheckOptions(examples=2, shrink=False, coverage=measurement)
    run_runner_check(target, options)
    result = measurement.result(target.version)
    files = {file.display: file for file in result.files}
    # In a fixed order (lane_origins' is not, from one process to the next).
    lane_files = list(files)[: -len(scopes_for(target))]
    assert lane_files == sorted(lane_files)
    core = files["v1/engine/core.py"]
    assert core.scope.functions is not None
    assert "DPEngineCoreProc.run_busy_loop" in core.scope.functions
    assert core.executed_lines and core.missing_lines  # ran, and not all of it
    runner = files["v1/worker/gpu/model_runner.py"]
    assert runner.scope.functions is not None
    assert "GPUModelRunner.execute_model" in runner.scope.functions
    assert runner.executed_lines
    # The release's own sync ran under the engines too.
    assert files["v1/worker/gpu/dp_utils.py"].executed_lines
    assert result.context_keys == ((COVERAGE_CONTEXT, "caller"),)
    text = render_text(result)
    # Two measured files named speculator.py: listed by their path.
    assert "v1/worker/gpu/spec_decode/mtp/speculator.py:" in text
    assert " and " in text.split("v1/engine/core.py [", 1)[1].split("]", 1)[0]


def test_the_v1_runner_lane_measures_its_real_classes(release: Any) -> None:
    target = release("0.33.0", None, "v1")
    measurement = measure(runner_lane_scopes(target))
    options = RunnerCheckOptions(
        examples=3, shrink=False, runner="v1", coverage=measurement
    )
    run_runner_check(target, options)
    files = {file.display: file for file in measurement.result(target.version).files}
    runner = files["v1/worker/gpu_model_runner.py"]
    assert runner.scope.functions is not None
    # The lane's rebuilt methods and the sync lane's caller method, one file.
    assert "GPUModelRunner.execute_model" in runner.scope.functions
    assert "GPUModelRunner._determine_batch_execution_and_padding" in (
        runner.scope.functions
    )
    assert runner.executed_lines
    assert files["v1/worker/dp_utils.py"].executed_lines
    # No file is listed for a class that keeps no method of its own.
    assert all(file.executable_lines for file in files.values())
