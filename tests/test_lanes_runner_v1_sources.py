"""The V1 runner lane's release range, refusals and files."""

from __future__ import annotations

import pytest

from dpsim.errors import TargetError
from dpsim.lanes.runner.sources import (
    OLDEST_V1_RUNNER_LANE,
    RUNNER_LANE_MODULES,
    V1_RUNNER_LANE_MODULES,
    RunnerSources,
    check_runner_lane_release,
    lane_modules,
    wheel_prefixes,
)
from dpsim.targets.cache import ensure_release
from dpsim.targets.load import V1_CALLER_MODULE
from dpsim.targets.spec import ReleaseSpec, TargetSpec


def test_a_release_before_the_v1_caller_method_is_refused_naming_it() -> None:
    with pytest.raises(TargetError) as refused:
        check_runner_lane_release("0.11.2", "v1")
    said = str(refused.value)
    assert said.startswith("runner lane (V1 runner): vLLM 0.11.2 cannot be driven: ")
    assert "no _determine_batch_execution_and_padding (0.12 added it;" in said
    assert said.endswith("refused without fetching it")
    # Before the V1 sync lane's range: the sync lane's own refusal, unfetched.
    with pytest.raises(TargetError, match="older than dpsim supports"):
        check_runner_lane_release("0.10.2", "v1")


def test_the_oldest_v1_release_is_not_refused_and_v2_keeps_its_range() -> None:
    oldest = ".".join(map(str, OLDEST_V1_RUNNER_LANE)) + ".0"
    check_runner_lane_release(oldest, "v1")
    check_runner_lane_release("0.33.0", "v1")
    with pytest.raises(TargetError, match=r"the runner lane drives 0\.26\.0"):
        check_runner_lane_release("0.25.1")


def test_each_runner_fetches_its_own_files() -> None:
    assert lane_modules("v2") == RUNNER_LANE_MODULES
    assert lane_modules("v1") == V1_RUNNER_LANE_MODULES
    v1 = set(wheel_prefixes(V1_RUNNER_LANE_MODULES))
    assert "vllm/v1/worker/gpu_model_runner.py" in v1
    assert "vllm/v1/spec_decode/" in v1
    # The V2 lane's fetch does not grow with V1's runner files.
    assert "vllm/v1/spec_decode/" not in set(wheel_prefixes(RUNNER_LANE_MODULES))


@pytest.mark.release
@pytest.mark.parametrize(("version", "has"), [("0.11.2", False), ("0.12.0", True)])
def test_the_caller_method_appears_in_0_12(version: str, has: bool) -> None:
    # The fact behind the refusal, read off the releases' own files.
    package = ensure_release(version, runner="v1")
    text = (package / "v1/worker/gpu_model_runner.py").read_text()
    assert ("def _determine_batch_execution_and_padding(" in text) is has


@pytest.mark.release
def test_v1_sources_read_the_v1_runner_and_seed_the_v1_targets_modules() -> None:
    sources = RunnerSources.for_spec(TargetSpec(ReleaseSpec("0.33.0"), runner="v1"))
    assert sources.runner == "v1"
    assert sources.has(V1_CALLER_MODULE)
    target = sources.target
    assert target.runner == "v1"
    # The runner's code imports the very sync module the sync lane loaded.
    assert sources.loader.module("vllm.v1.worker.dp_utils") is target.dp_utils
