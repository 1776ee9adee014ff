"""dpsim mutate --lane runner: mutants of the files the runner lane runs,
judged by its check; a mutant the lane cannot drive is refused, not killed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.mutate import Budget
from dpsim.mutate.mutants import sites
from dpsim.mutate.run import REFUSED, Job
from dpsim.mutate.runner import (
    RunnerPlan,
    check_runner_mutant,
    package_dir,
    runner_mutated_file,
    runner_target,
)
from dpsim.properties import RUNNER_LANE_PROPERTIES

RELEASE = "0.33.0"
VLLM_DEFAULT = (
    Path(__file__).resolve().parents[1] / "docs" / "policies" / "vllm-default.toml"
)
#: Small: a kill shows in the first cases with an idle rank.
QUICK = Budget(examples=20, ranks=(2, 3), profiles=(), seconds=120)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--target", "x.py"], "mutate --lane runner: --target is the sync lane's"),
        (["--profile", "caller"], "mutate --lane runner: --profile is the sync lane's"),
        (["--file", "sync"], "--file sync is the sync lane's; expected one of core"),
        (
            ["--runner", "v1", "--file", "model_runner"],
            "--file model_runner is not a file the V1 runner's lane runs; "
            "expected one of core, gpu_model_runner, eagle, dp_utils",
        ),
        (["--runner", "v1", "--vllm", "0.11.1"], "cannot be driven"),
        (["--vllm", "0.20.0"], "sort_batch_req_ids"),
        (["--examples", "0"], "--examples must be at least 1"),
    ],
)
def test_runner_lane_refusals_are_one_line_before_anything_runs(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mutate", "--lane", "runner", "--workers", "0", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--file", "core"], "--file core: a runner-lane file (--lane runner)"),
        (["--policy", "p.toml"], "mutate --policy: the runner lane's"),
    ],
)
def test_runner_lane_options_are_refused_on_the_sync_lane(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mutate", "--workers", "0", *arguments]) == 2
    assert message in capsys.readouterr().err


def _mutant(slot: str, function: str, description: str) -> str:
    mutated, _ = runner_mutated_file(runner_target(RELEASE), slot)
    found = [
        site.id
        for site in sites(mutated.text, ("drop",), mutated.functions)
        if site.function == function and site.description == description
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.release
def test_only_the_methods_the_lane_rebuilds_are_mutated() -> None:
    mutated, relative = runner_mutated_file(runner_target(RELEASE), "core")
    assert relative == "v1/engine/core.py"
    assert mutated.functions is not None
    assert "DPEngineCoreProc.run_busy_loop" in mutated.functions
    assert "EngineCore.execute_dummy_batch" in mutated.functions
    # The engine's start-up is stood in for: never run, never mutated.
    assert not any(name.endswith(".__init__") for name in mutated.functions)
    functions = {site.function for site in sites(mutated.text, None, mutated.functions)}
    assert functions <= {name.split(".")[-1] for name in mutated.functions}


@pytest.mark.release
def test_a_mutant_the_lane_cannot_drive_is_refused_not_killed(tmp_path: Path) -> None:
    target = runner_target(RELEASE)
    mutated, relative = runner_mutated_file(target, "core")
    # A planted edit (not a generated mutant): the dummy batch asks the
    # executor stand-in for something it was never written to answer.
    call = "self.model_executor.execute_dummy_batch()"
    assert mutated.text.count(call) == 1
    path = tmp_path / "m0000_core.py"
    path.write_text(
        mutated.text.replace(call, "self.model_executor.dpsim_not_modelled()")
    )
    plan = RunnerPlan(
        RELEASE,
        str(package_dir(target)),
        relative,
        mutated.path,
        QUICK,
        tuple(RUNNER_LANE_PROPERTIES),
        slot="core",
    )
    outcome = check_runner_mutant(Job("planted", str(path), plan))
    assert outcome.status == REFUSED and not outcome.killed
    assert outcome.message is not None and "dpsim_not_modelled" in outcome.message
    # The mutant really was the file the lane loaded: the original runs clean
    # past the same dummy batches (its own findings aside).
    original = tmp_path / "m0001_core.py"
    original.write_text(mutated.text)
    assert check_runner_mutant(Job("original", str(original), plan)).status != REFUSED


@pytest.mark.release
def test_dropping_the_idle_ranks_dummy_batch_is_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dropped = _mutant(
        "core", "run_busy_loop", "drop statement: self.execute_dummy_batch()"
    )
    common = ["mutate", "--lane", "runner", "--vllm", RELEASE, "--workers", "0"]
    # vLLM's default table: drawn ones meet finding 13 first, whose shrinking
    # would cost the baseline most of this test's time.
    budget = ["--examples", "8", "--ranks", "2..3", "--policy", str(VLLM_DEFAULT)]
    out = tmp_path / "out"
    assert (
        main([*common, *budget, "--mutant", dropped, "--json", "--out", str(out)]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["lane"] == "runner" and data["slot"] == "core"
    assert data["killed"] == 1 and data["refused"] == 0 and data["score"] == 1.0
    [result] = data["results"]
    # The idle rank never meets its busy peer's DP syncs: a runner-lane
    # property names it (no-hang, unless the original breaks that already).
    assert result["status"] == "killed"
    assert result["killer"] in RUNNER_LANE_PROPERTIES
    assert (out / "mutate.json").is_file()
    assert main([*common, "--list", "--operators", "drop"]) == 0
    listing = capsys.readouterr().out
    assert dropped in listing and "run_busy_loop" in listing
