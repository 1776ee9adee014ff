"""Target coverage of the runner lane: the real methods it rebuilds and runs."""

from __future__ import annotations

from typing import Any

import pytest

from dpsim.coverage import measure
from dpsim.coverage.render import render_text
from dpsim.coverage.targets import runner_lane_scopes
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
