"""Target specs: what --vllm and --target name, refused in one line when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.errors import TargetError
from dpsim.targets.spec import (
    OLDEST_RELEASE,
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
    mine.write_text("")
    assert parse_target("0.29.0", mine) == TargetSpec(
        parse_target("0.29.0").base, mine.resolve()
    )


@pytest.mark.parametrize("version", ["0.18.0", "0.18.0rc1", "0.33.0", "1.0"])
def test_releases_from_the_oldest_supported_on_pass_the_gate(version: str) -> None:
    assert check_release(version) == version


@pytest.mark.parametrize("version", ["0.17.0", "0.17.1.post1", "0.15.0", "0.9.2"])
def test_releases_older_than_the_oldest_supported_are_refused(version: str) -> None:
    with pytest.raises(
        TargetError, match=f"older than dpsim supports .{OLDEST_RELEASE}"
    ):
        check_release(version)
