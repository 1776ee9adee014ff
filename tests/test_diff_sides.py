"""Resolving diff's two sides, and the refusals made before anything runs
(no release needed: releases are only named, never fetched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.diff.sides import parse_sides
from dpsim.errors import UsageError


def test_a_release_against_another_runner_of_itself() -> None:
    sides = parse_sides("0.33.0", "0.33.0", base_runner="v1", new_runner="v2")
    assert (sides.base.runner, sides.new.runner) == ("v1", "v2")
    assert str(sides.base.base) == str(sides.new.base) == "0.33.0"


def test_runner_serves_both_sides_unless_a_side_names_its_own() -> None:
    sides = parse_sides("0.29.0", "0.33.0", runner="v1", new_runner="v2")
    assert (sides.base.runner, sides.new.runner) == ("v1", "v2")


def test_a_file_side_runs_against_vllm_and_takes_the_runner_its_sync_fits(
    tmp_path: Path,
) -> None:
    file = tmp_path / "dp_utils.py"
    file.write_text("def coordinate_batch_across_dp(num_tokens_unpadded):\n    pass\n")
    sides = parse_sides("0.33.0", str(file), vllm="0.33.0")
    assert sides.new.dp_utils_file == file.resolve()
    assert (sides.base.runner, sides.new.runner) == ("v2", "v1")
    own = parse_sides(str(file), "0.30.0", base_vllm="0.32.0", vllm="0.31.0")
    assert str(own.base.base) == "0.32.0"


@pytest.mark.parametrize(
    ("base", "new", "options", "message"),
    [
        ("FILE", "0.33.0", {}, "base side: FILE is a file: name the vLLM"),
        ("0.33.0", "0.33.0", {"new_vllm": "0.32.0"}, "new side: --new-vllm 0.32.0"),
        ("0.33.0", "nonsense", {}, "new side: 'nonsense' is neither a vLLM release"),
        ("0.33.0", "gone.py", {"vllm": "0.33.0"}, "new side: gone.py: no such file"),
        ("0.17.0", "0.33.0", {"runner": "v2"}, "base side: vllm 0.17.0 is older"),
    ],
)
def test_a_bad_side_is_refused_naming_it(
    tmp_path: Path, base: str, new: str, options: dict[str, str], message: str
) -> None:
    file = tmp_path / "dp_utils.py"
    file.write_text("x = 1\n")
    base = base.replace("FILE", str(file))
    with pytest.raises(UsageError) as refused:
        parse_sides(base, new, **options)
    assert str(refused.value).startswith(message.replace("FILE", str(file)))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--lane", "runner"], "--lane 'runner': diff runs the sync lane only"),
        (["--expect", "paddings"], "--expect 'paddings': not a kind of difference"),
        (["--examples", "0"], "--examples must be at least 1"),
        (["--ranks", "3..2"], "--ranks '3..2'"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(
    capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    assert main(["diff", "0.33.0", "0.33.0", *arguments]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"dpsim: error: {message}")
    assert error.count("\n") == 1


def test_an_out_that_is_a_file_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "taken"
    out.write_text("mine\n")
    assert main(["diff", "0.33.0", "0.33.0", "--out", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert out.read_text() == "mine\n"


def test_help_shows_the_reviewers_workflow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["diff", "--help"])
    shown = capsys.readouterr().out
    assert "dpsim diff ~/src/vllm-main ~/src/vllm-pr" in shown
    assert "only `sync`" in shown
