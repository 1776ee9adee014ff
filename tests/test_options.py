"""dpsim.options: --ranks spelled one way for every command and the suite."""

from __future__ import annotations

import pytest

from dpsim.errors import UsageError
from dpsim.options import parse_ranks


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
