"""``--engine`` on the command line: parsed, refused where it cannot apply,
and named in a report only when it is not the default (so a default report
keeps its bytes). Fast tier: nothing here loads a release."""

from __future__ import annotations

import pytest

from dpsim.check import CheckOptions, run_check
from dpsim.cli import build_parser, main
from dpsim.errors import UsageError


def test_check_and_bench_take_an_engine() -> None:
    assert build_parser().parse_args(["check"]).engine == "hypothesis"
    assert build_parser().parse_args(["check", "--engine", "fast"]).engine == "fast"
    both = build_parser().parse_args(
        ["bench", "--engine", "fast", "--engine", "hypothesis"]
    )
    assert both.engine == ["fast", "hypothesis"]
    assert build_parser().parse_args(["bench"]).engine is None


def test_an_unknown_engine_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--engine", "quick"]) == 2
    assert "invalid choice: 'quick'" in capsys.readouterr().err


def test_the_runner_lane_refuses_the_fast_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--lane", "runner", "--engine", "fast"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--engine fast: the sync lane only" in line


def test_run_check_refuses_an_unknown_engine() -> None:
    with pytest.raises(UsageError, match="unknown engine 'quick'"):
        run_check(None, CheckOptions(engine="quick"))  # type: ignore[arg-type]
