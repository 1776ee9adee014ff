"""dpsim.options: --ranks and --runner spelled one way for every command and the suite."""

from __future__ import annotations

import pytest

from dpsim.errors import UsageError
from dpsim.options import parse_ranks, parse_runner


def test_ranks_read_as_one_size_or_a_range() -> None:
    assert parse_ranks("4") == (4, 4)
    assert parse_ranks("2..16") == (2, 16)


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("two", r"--ranks 'two': expected N or LO\.\.HI, e\.g\. 2\.\.16"),
        ("2..x", r"expected N or LO\.\.HI"),
        ("0", r"--ranks '0': need 1 <= LO <= HI"),
        ("8..2", r"need 1 <= LO <= HI"),
        ("1025", r"at most 1,024 ranks"),
    ],
)
def test_bad_ranks_are_one_line_usage_errors(text: str, refusal: str) -> None:
    with pytest.raises(UsageError, match=refusal) as raised:
        parse_ranks(text)
    assert "\n" not in str(raised.value)


def test_a_runner_reads_as_itself_or_the_default() -> None:
    assert parse_runner("v1") == "v1"
    assert parse_runner("v2") == "v2"
    assert parse_runner(None) is None
    assert parse_runner("") is None  # an empty variable: the default


def test_an_unknown_runner_is_a_one_line_usage_error_naming_the_flag() -> None:
    with pytest.raises(
        UsageError, match=r"^DPSIM_RUNNER 'v3': expected one of v1, v2$"
    ):
        parse_runner("v3", "DPSIM_RUNNER")
