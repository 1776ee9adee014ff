"""Target specs: what --vllm and --target name, refused in one line when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.errors import TargetError, UsageError
from dpsim.targets.spec import (
    OLDEST_RELEASE,
    OLDEST_V1_RELEASE,
    TargetSpec,
    check_release,
    parse_target,
)


def _only_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_directory_as_target_says_what_is_missing_and_suggests_both_fixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = str(tmp_path / "x")
    (tmp_path / "x").mkdir()
    assert _only_error(capsys, ["targets", "--target", given]) == (
        f"dpsim: error: --target {given} is a directory; expected a dp_utils.py "
        f"file (did you mean --vllm {given}, or --target "
        f"{given}/vllm/v1/worker/gpu/dp_utils.py?)"
    )


@pytest.mark.parametrize(
    "layout",
    ["vllm/v1/worker/gpu/dp_utils.py", "v1/worker/gpu/dp_utils.py", "dp_utils.py"],
)
def test_a_directory_as_target_points_at_the_dp_utils_inside_it(
    layout: str, tmp_path: Path
) -> None:
    inside = tmp_path / "tree" / layout
    inside.parent.mkdir(parents=True)
    inside.write_text("")
    given = f"{tmp_path / 'tree'}/"
    with pytest.raises(TargetError) as refused:
        parse_target("0.29.0", given)
    assert f"or --target {tmp_path / 'tree'}/{layout}?)" in str(refused.value)


def test_a_file_as_target_still_parses(tmp_path: Path) -> None:
    mine = tmp_path / "dp_utils.py"
    mine.write_text("def dispatch_cg_and_sync_dp(manager, num_reqs):\n    pass\n")
    assert parse_target("0.29.0", mine) == TargetSpec(
        parse_target("0.29.0").base, mine.resolve()
    )


@pytest.mark.parametrize("version", ["0.18.0", "0.18.0rc1", "0.33.0", "0.34.0", "1.0"])
def test_releases_from_the_oldest_supported_on_pass_the_gate(version: str) -> None:
    assert check_release(version) == version
    assert check_release(version, "v2") == version


@pytest.mark.parametrize("version", ["0.18.0", "0.33.0", "0.33.1"])
def test_releases_before_the_v1_runner_was_removed_pass_the_v1_gate(
    version: str,
) -> None:
    assert check_release(version, "v1") == version


@pytest.mark.parametrize("version", ["0.34.0", "0.34.1", "0.35.0rc1", "1.0"])
def test_the_v1_runner_is_refused_from_its_removal_on_saying_so(version: str) -> None:
    with pytest.raises(TargetError) as refused:
        check_release(version, "v1")
    said = str(refused.value)
    assert said.startswith(
        f"vllm {version} has no V1 model runner (vLLM 0.34.0 removed"
    )
    assert "needs vLLM" not in said and "\n" not in said


@pytest.mark.parametrize("version", ["0.11.1", "0.11.2", "0.12.0", "0.17.1.post1"])
def test_releases_with_only_the_v1_runners_sync_pass_the_gate_for_v1(
    version: str,
) -> None:
    assert check_release(version) == version
    assert check_release(version, "v1") == version
    with pytest.raises(
        TargetError,
        match=f"older than dpsim supports with the V2 runner .{OLDEST_RELEASE}",
    ):
        check_release(version, "v2")


@pytest.mark.parametrize("version", ["0.11.0", "0.10.2", "0.9.2", "0.11.0.post1"])
@pytest.mark.parametrize("runner", [None, "v1", "v2"])
def test_releases_older_than_the_oldest_supported_are_refused(
    version: str, runner: str | None
) -> None:
    with pytest.raises(
        TargetError,
        match=f"older than dpsim supports .{OLDEST_V1_RELEASE} and later with the V1",
    ):
        check_release(version, runner)


def test_an_unknown_runner_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError, match="unknown runner 'v3': choose v1") as refused:
        parse_target("0.33.0", runner="v3")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("version", "runner"),
    [("0.11.1", "v1"), ("0.17.1", "v1"), ("0.18.0", "v2"), ("0.33.0", "v2")],
)
def test_a_release_defaults_to_the_v2_runner_where_it_has_v2s_sync(
    version: str, runner: str
) -> None:
    assert parse_target(version).runner == runner
    assert parse_target(version, runner="v1").runner == "v1"


def test_a_v2_spec_writes_what_it_wrote_before_runners_and_v1_says_its_runner(
    tmp_path: Path,
) -> None:
    assert parse_target("0.33.0").to_dict() == {
        "kind": "release",
        "base": "0.33.0",
        "dp_utils_file": None,
    }
    caller = tmp_path / "gpu_model_runner.py"
    caller.write_text("")
    assert parse_target("0.33.0", caller_file=caller).to_dict() == {
        "kind": "release",
        "base": "0.33.0",
        "dp_utils_file": None,
        "runner": "v1",
        "caller_file": str(caller.resolve()),
    }


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dp_utils.py"
    path.write_text(text)
    return path


def test_a_file_target_without_a_runner_gets_the_runner_its_sync_belongs_to(
    tmp_path: Path,
) -> None:
    v1 = _file(
        tmp_path, "def coordinate_batch_across_dp(num_tokens_unpadded):\n  pass\n"
    )
    assert parse_target("0.33.0", v1).runner == "v1"
    v2 = _file(tmp_path, "def sync_cudagraph_and_dp_padding(m, d):\n  pass\n")
    assert parse_target("0.33.0", v2).runner == "v2"


def test_a_file_target_of_neither_runner_gets_the_bases_runner(
    tmp_path: Path,
) -> None:
    # Its loader refuses it, after naming anything else wrong in it.
    other = _file(tmp_path, "def helper():\n    return 1\n")
    assert parse_target("0.33.0", other).runner == "v2"
    assert parse_target("0.12.0", other).runner == "v1"


def test_a_file_target_of_the_other_runner_is_refused_naming_the_right_one(
    tmp_path: Path,
) -> None:
    v2 = _file(tmp_path, "def dispatch_cg_and_sync_dp(m, n):\n  pass\n")
    with pytest.raises(TargetError, match=r"not the V1 runner's \(pass --runner v2\)"):
        parse_target("0.33.0", v2, runner="v1")


def test_a_caller_file_is_for_the_v1_runner_only(tmp_path: Path) -> None:
    caller = tmp_path / "gpu_model_runner.py"
    caller.write_text("")
    assert parse_target("0.33.0", caller_file=caller).runner == "v1"
    with pytest.raises(TargetError, match="only the V1 runner has a caller"):
        parse_target("0.33.0", runner="v2", caller_file=caller)
    with pytest.raises(TargetError, match=r"--caller-file nope\.py: no such file"):
        parse_target("0.33.0", caller_file="nope.py")


@pytest.mark.parametrize(
    ("layout", "has", "lacks"),
    [
        ("v1/worker/dp_utils.py", "v1", "v2"),
        ("v1/worker/gpu/dp_utils.py", "v2", "v1"),
    ],
)
def test_a_tree_defaults_to_the_runner_it_has_and_refuses_the_other(
    tmp_path: Path, layout: str, has: str, lacks: str
) -> None:
    package = tmp_path / "vllm"
    (package / layout).parent.mkdir(parents=True)
    entry = "coordinate_batch_across_dp" if has == "v1" else "dispatch_cg_and_sync_dp"
    (package / layout).write_text(f"def {entry}(a):\n    pass\n")
    assert parse_target(str(tmp_path)).runner == has
    with pytest.raises(TargetError, match=f"the {lacks.upper()} runner's DP sync"):
        parse_target(str(tmp_path), runner=lacks)


def _tree(root: Path, *, v1_runner: bool) -> Path:
    """A source tree with both runners' syncs (written here, no vLLM code),
    the V2 model runner, and the V1 runner's files only when ``v1_runner``."""
    package = root / "vllm"
    files = {
        "v1/worker/gpu/dp_utils.py": "def dispatch_cg_and_sync_dp(manager):\n    pass\n",
        "v1/worker/dp_utils.py": "def coordinate_batch_across_dp(n):\n    pass\n",
        "v1/worker/gpu/model_runner.py": "",
    }
    if v1_runner:
        files["v1/worker/gpu_model_runner.py"] = ""
        files["v1/cudagraph_dispatcher.py"] = ""
    for relative, text in files.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    return root


def test_a_tree_without_the_v1_runners_files_is_refused_for_v1_saying_it_was_removed(
    tmp_path: Path,
) -> None:
    tree = _tree(tmp_path, v1_runner=False)
    # Its coordinate_batch_across_dp stays (0.34's CPU runner calls it), but
    # with no V1 model runner there is nothing for --runner v1 to test.
    assert parse_target(str(tree)).runner == "v2"
    with pytest.raises(TargetError) as refused:
        parse_target(str(tree), runner="v1")
    assert str(refused.value).startswith(
        f"{tree / 'vllm'} has no V1 model runner (vLLM 0.34.0 removed"
    )


def test_a_tree_with_the_v1_runners_files_still_runs_v1(tmp_path: Path) -> None:
    tree = _tree(tmp_path, v1_runner=True)
    assert parse_target(str(tree), runner="v1").runner == "v1"
