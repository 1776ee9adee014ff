"""``--runner`` on every command, the suite's runner, and the runner a file records.

Fast tier: every refusal here is decided from the spelling, version numbers and
file texts, before anything is fetched or loaded (the fast tier runs with an
empty cache and no package index, so a fetch would fail the test).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import faults as faulty
import pytest

from dpsim.cex.files import Counterexample
from dpsim.cli import build_parser, main
from dpsim.errors import UsageError
from dpsim.pytest_plugin import _configure
from dpsim.replay import choose, recorded_spec
from dpsim.suite.config import SuiteOptions
from dpsim.versions import V1_RELEASES, default_requests, requests_for

POLICY = Path(__file__).parent.parent / "docs" / "policies" / "pow2.toml"

#: Every command that takes a target takes a runner.
COMMANDS_WITH_A_TARGET = (
    ["check"],
    ["targets"],
    ["versions"],
    ["replay", "x.json"],
    ["mutate"],
    ["fuzz"],
    ["policy", "validate", "p.toml"],
    ["policy", "show", "p.toml"],
)


@pytest.mark.parametrize("command", COMMANDS_WITH_A_TARGET, ids=" ".join)
def test_every_command_with_a_target_reads_a_runner(command: list[str]) -> None:
    parsed = build_parser().parse_args([*command, "--runner", "v1"])
    assert parsed.runner == "v1"
    assert build_parser().parse_args(command).runner is None  # the default


@pytest.mark.parametrize("command", COMMANDS_WITH_A_TARGET, ids=" ".join)
def test_an_unknown_runner_is_one_line_exit_2(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--runner", "v3"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "dpsim: error: argument --runner: invalid choice: 'v3' (choose from 'v1', 'v2')"
    )


def test_help_says_what_each_runner_is_and_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "v1 = the V1 model runner (coordinate_batch_across_dp" in text
    assert "v2 = the V2 model runner" in text
    assert "default: v2 where the vLLM has V2's sync, else v1" in text


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        (
            ["check", "--runner", "v2", "--vllm", "0.12.0"],
            "vllm 0.12.0 is older than dpsim supports with the V2 runner",
        ),
        (
            ["check", "--runner", "v1", "--vllm", "0.11.0"],
            "vllm 0.11.0 is older than dpsim supports (0.11.1 and later with the V1",
        ),
        (
            ["targets", "--runner", "v2", "--fetch", "0.17.1"],
            "vllm 0.17.1 is older than dpsim supports with the V2 runner",
        ),
        (
            ["versions", "--runner", "v2", "0.16.0"],
            "vllm 0.16.0 is older than dpsim supports with the V2 runner",
        ),
        (
            ["versions", "0.10.2"],
            "vllm 0.10.2 is older than dpsim supports",
        ),
        (
            [*("policy", "show", str(POLICY), "--runner", "v2", "--vllm", "0.14.1")],
            "vllm 0.14.1 is older than dpsim supports with the V2 runner",
        ),
        (
            [
                *(
                    "policy",
                    "validate",
                    str(POLICY),
                    "--runner",
                    "v2",
                    "--vllm",
                    "0.13.0",
                )
            ],
            "vllm 0.13.0 is older than dpsim supports with the V2 runner",
        ),
    ],
)
def test_a_release_too_old_for_the_runner_is_refused_before_any_fetch(
    arguments: list[str],
    refusal: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path / "cache"))
    assert main(arguments) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dpsim: error: ") and refusal in line
    assert not (tmp_path / "cache").exists()  # nothing fetched
    assert not (tmp_path / "dpsim-out").exists()  # nothing written


def test_a_target_file_fitting_the_other_runner_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v1_sync = tmp_path / "v1_dp_utils.py"
    v1_sync.write_text("def coordinate_batch_across_dp(*args):\n    pass\n")
    assert main(["check", "--target", str(v1_sync), "--runner", "v2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "(pass --runner v1)" in line


def test_suite_options_refuse_a_bad_runner_in_one_line() -> None:
    SuiteOptions(runner="v1").validate()
    SuiteOptions(runner=None).validate()
    with pytest.raises(UsageError, match=r"^runner 'V1': expected one of v1, v2$"):
        SuiteOptions(runner="V1").validate()


def test_dpsim_runner_and_caller_file_are_read_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPSIM_RUNNER", "v1")
    assert _configure({}, False).options.runner == "v1"
    assert _configure({"runner": "v2"}, False).options.runner == "v2"
    monkeypatch.setenv("DPSIM_RUNNER", "v9")
    with pytest.raises(UsageError, match=r"^runner 'v9': expected one of v1, v2$"):
        _configure({}, False)
    monkeypatch.setenv("DPSIM_CALLER_FILE", "/env/gpu_model_runner.py")
    monkeypatch.setenv("DPSIM_RUNNER", "v1")
    assert _configure({}, False).options.caller_file == "/env/gpu_model_runner.py"
    flagged = _configure({"caller-file": "/flag/gpu_model_runner.py"}, False)
    assert flagged.options.caller_file == "/flag/gpu_model_runner.py"


def test_a_named_v1_runner_keys_its_own_examples_and_v2_keys_stay() -> None:
    before = b"dpsim-suite/v1/step/caller/2..16/any"
    assert SuiteOptions().database_key("step") == before
    assert SuiteOptions(runner="v2").database_key("step") == before
    assert SuiteOptions(runner="v1").database_key("step") == before + b"/runner-v1"


# -- dpsim versions: one check per (release, runner) ------------------------------


def test_the_default_report_has_a_row_per_release_and_runner() -> None:
    requests = default_requests()
    pairs = [(request.vllm, request.runner) for request in requests]
    assert len(pairs) == len(set(pairs)) == len(V1_RELEASES) + 17
    assert pairs[0] == ("0.11.1", "v1")
    # 0.34.0 removed the V1 runner: its row is V2's alone.
    assert pairs[-3:] == [("0.33.0", "v1"), ("0.33.0", "v2"), ("0.34.0", "v2")]
    assert ("0.17.1", "v2") not in pairs and ("0.18.0", "v2") in pairs
    assert {request.runner for request in default_requests("v1")} == {"v1"}
    assert len(default_requests("v2")) == 17


def test_a_named_release_runs_each_runner_it_has() -> None:
    assert [request.runner for request in requests_for("0.29.0")] == ["v1", "v2"]
    assert [request.runner for request in requests_for("0.12.0")] == ["v1"]
    assert [request.runner for request in requests_for("0.29.0", "v2")] == ["v2"]
    with pytest.raises(UsageError, match="older than dpsim supports"):
        requests_for("0.10.0")


# -- the runner a counterexample file records ---------------------------------------


def _recorded(spec: dict[str, str | None]) -> Counterexample:
    return Counterexample(
        target={"label": "x", "spec": spec, "version": None, "files": {}},
        case=faulty.step_case(1, 0),
        choices=(),
        properties=(),
        verdicts=(),
        outcome="completed",
        trace={},
        dpsim_version="0",
    )


V2_SPEC = {"kind": "release", "base": "0.33.0", "dp_utils_file": None}
V1_SPEC = {**V2_SPEC, "runner": "v1", "caller_file": "/src/gpu_model_runner.py"}


def test_a_file_without_a_runner_is_a_v2_file() -> None:
    assert recorded_spec(_recorded(V2_SPEC)).runner == "v2"
    chosen = choose(_recorded(V2_SPEC))
    assert (chosen.runner, chosen.overridden) == ("v2", False)


def test_replay_runs_the_recorded_runner_unless_told() -> None:
    recorded = _recorded(V1_SPEC)
    chosen = choose(recorded)
    assert (chosen.runner, chosen.caller_file, chosen.overridden) == (
        "v1",
        "/src/gpu_model_runner.py",
        False,
    )
    # The caller file is the file's, not the user's: said before it runs.
    assert chosen.unasked == ("/src/gpu_model_runner.py",)
    other = choose(recorded, vllm="0.32.0")
    assert (other.vllm, other.runner, other.caller_file) == ("0.32.0", "v1", None)
    assert other.overridden
    swapped = choose(recorded, runner="v2")
    assert (swapped.vllm, swapped.runner, swapped.overridden) == ("0.33.0", "v2", True)


# -- on real releases -----------------------------------------------------------------


@pytest.mark.release
def test_targets_shows_the_v1_caller_dispatcher_and_group_it_loaded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["targets", "--runner", "v1", "0.12.0", "0.33.0"]) == 0
    out = capsys.readouterr().out
    assert "vllm 0.12.0 (V1 runner)\n  runner:     v1\n" in out
    assert "GPUModelRunner._determine_batch_execution_and_padding" in out
    assert "gpu_model_runner.py:2744-2823" in out  # the method's own lines
    assert "gpu_model_runner.py:3684-3786" in out
    assert "  group:      get_dp_group().device_group\n" in out
    assert main(["targets", "--json", "--runner", "v1", "0.33.0"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["runner"] == "v1"
    assert described["spec"]["runner"] == "v1"
    assert described["v1"]["caller"]["lines"] == [3684, 3786]
    assert described["v1"]["sync"]["entry"] == "coordinate_batch_across_dp"


@pytest.mark.release
def test_targets_loads_each_release_with_its_default_runner(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["targets", "--json", "0.12.0", "0.33.0"]) == 0
    runners = [
        json.loads(line)["runner"] for line in capsys.readouterr().out.splitlines()
    ]
    assert runners == ["v1", "v2"]


@pytest.mark.release
def test_policy_show_reads_the_v1_dispatchers_own_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arguments = ["policy", "show", str(POLICY), "--runner", "v1", "--vllm", "0.33.0"]
    assert main(arguments) == 0
    out = capsys.readouterr().out
    assert out.startswith("target table on vllm 0.33.0 (V1 runner)\n")
    # Mixed batches get PIECEWISE keys at every size; FULL keys are uniform
    # decodes of one token, at most max_num_seqs (256) of them.
    assert "  FULL          256   256        1      -      0         1\n" in out
    assert "  PIECEWISE     512     -        -      -      0         1\n" in out
    assert "  19 graphs (FULL 9, PIECEWISE 10)\n" in out


@pytest.mark.release
def test_a_caller_file_is_checked_recorded_said_and_replayed(
    tmp_path: Path,
    release_file: Callable[[str, str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 0.33.0's caller, derived here, re-dispatching in any mode instead of the
    # synced one: the ranks' graph modes part again after the sync.
    real = release_file("0.33.0", "v1/worker/gpu_model_runner.py")
    synced = "valid_modes={CUDAGraphMode(synced_cudagraph_mode)},"
    text = real.read_text()
    assert text.count(synced) == 1
    faulty = tmp_path / "gpu_model_runner.py"
    faulty.write_text(text.replace(synced, "valid_modes=None,"))
    out = tmp_path / "out"
    check = ["check", "--runner", "v1", "--vllm", "0.33.0", "--scenario", "step"]
    arguments = [*check, "--caller-file", str(faulty), "--out", str(out), "--json"]
    assert main([*arguments, "--examples", "200"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["target"] == "vllm 0.33.0 with caller gpu_model_runner.py (V1 runner)"
    )
    found = summary["counterexample"]
    spec = json.loads(Path(found).read_text())["target"]["spec"]
    assert (spec["runner"], spec["caller_file"]) == ("v1", str(faulty))
    assert main(["replay", found]) == 1
    said = capsys.readouterr()
    assert said.err.startswith(f"dpsim: replay will execute {faulty}, named by")
    assert "the failure reproduces" in said.out
    # The release's own caller, named: the same case holds there.
    assert main(["replay", found, "--caller-file", str(real)]) == 0


def test_targets_without_a_spec_show_the_cached_releases_the_runner_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpsim.cli.targets import _cached_for

    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path))
    for version in ("0.11.0", "0.12.0", "0.33.0"):
        (tmp_path / "releases" / f"vllm-{version}").mkdir(parents=True)
    # No runner: each entry, loaded with its default (0.11.0 then says why not).
    assert _cached_for(None) == ["0.11.0", "0.12.0", "0.33.0"]
    assert _cached_for("v1") == ["0.12.0", "0.33.0"]
    assert _cached_for("v2") == ["0.33.0"]


@pytest.mark.release
def test_a_v1_check_says_which_properties_it_left_out_and_a_v2_check_does_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    common = ["check", "--vllm", "0.33.0", "--examples", "3", "--out", str(tmp_path)]
    assert main([*common, "--runner", "v1"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert header.startswith("  not judged on the V1 runner: agreed-values (")
    assert "reuse (" in header and "idle (" in header
    assert main([*common, "--runner", "v1", "--json"]) == 0
    left_out = json.loads(capsys.readouterr().out)["properties_not_run"]
    assert sorted(left_out) == ["agreed-values", "idle", "reuse"]
    assert main([*common, "--runner", "v2", "--json"]) == 0
    assert "properties_not_run" not in json.loads(capsys.readouterr().out)


# -- the runner lane's runner (--lane runner --runner v1) ---------------------------

#: The V1 runner lane's refusal of a release before its caller method.
_V1_LANE_REFUSAL = (
    "runner lane (V1 runner): vLLM 0.11.1 cannot be driven: its GPUModelRunner "
    "has no _determine_batch_execution_and_padding"
)


@pytest.mark.parametrize(
    "arguments",
    [
        ["check", "--lane", "runner", "--runner", "v1", "--vllm", "0.11.1"],
        ["targets", "--lane", "runner", "--runner", "v1", "0.11.1"],
        ["targets", "--lane", "runner", "--runner", "v1", "--fetch", "0.11.1"],
        ["bench", "--measure", "runner", "--runner", "v1", "--vllm", "0.11.1"],
        ["fuzz", "--lane", "runner", "--runner", "v1", "--vllm", "0.11.1"],
        ["mutate", "--lane", "runner", "--runner", "v1", "--vllm", "0.11.1"],
    ],
    ids=" ".join,
)
def test_the_v1_runner_lane_refuses_a_release_it_cannot_drive_unfetched(
    arguments: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(arguments) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dpsim: error: ") and _V1_LANE_REFUSAL in line
    assert "refused without fetching it" in line
    assert not (tmp_path / "cache").exists()


def test_the_runner_lanes_runner_is_v2_unless_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.17.0's default runner is V1's, but the runner lane's stays V2: without
    --runner it is refused as V2's, with --runner v1 it is V1's to drive."""
    from dpsim.options import lane_runner

    assert lane_runner("runner", None) == "v2"
    assert lane_runner("runner", "v1") == "v1"
    assert lane_runner("sync", None) is None  # the target's default
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path / "cache"))
    assert main(["check", "--lane", "runner", "--vllm", "0.17.0"]) == 2
    assert "older than dpsim supports with the V2 runner" in capsys.readouterr().err


def test_targets_lane_runner_refuses_per_release_and_goes_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path / "cache"))
    arguments = ["targets", "--lane", "runner", "--runner", "v1", "0.11.1", "0.11.2"]
    assert main(arguments) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert "vLLM 0.11.1 cannot be driven" in lines[0]
    assert "vLLM 0.11.2 cannot be driven" in lines[1]


@pytest.mark.parametrize("command", ["check", "targets", "bench", "fuzz", "mutate"])
def test_the_help_teaches_the_v1_runner_lane(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--runner v1" in shown and "runner" in shown
    if command != "bench":
        assert "--lane runner --runner v1" in shown
