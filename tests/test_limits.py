"""The shared bounds and the one integer check every reader uses."""

from __future__ import annotations

import pytest

from dpsim import limits
from dpsim.limits import int_problem, shown


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, None),
        (10, None),
        (11, "must be at most 10, got 11"),
        (-1, "must be an integer >= 0, got -1"),
        (True, "must be an integer >= 0, got True"),
        (1.0, "must be an integer >= 0, got 1.0"),
        ("3", "must be an integer >= 0, got '3'"),
        (None, "must be an integer >= 0, got None"),
        pytest.param(
            10**5000,
            "must be at most 10, got an integer of 16610 bits",
            id="5000-digit",  # no repr: Python refuses to print it
        ),
    ],
)
def test_int_problem_says_what_is_wrong(value: object, problem: str | None) -> None:
    assert int_problem(value, 0, 10) == problem


def test_shown_is_short_for_anything() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(100_000):
        node.append([])
        node = node[0]  # type: ignore[assignment]
    for value in (deep, list(range(10**5)), "x" * 10**5, {"a": {"b": {"c": [1]}}}):
        assert len(shown(value)) <= 80
    assert shown("FULL\x1b") == "'FULL\\x1b'"


def test_bounds_keep_their_stated_relations() -> None:
    # vLLM's default grid up to the largest capture size fits in one list.
    from dpsim.records.policy import vllm_default_sizes

    grid = vllm_default_sizes(limits.MAX_CAPTURE_SIZE)
    assert len(grid) <= limits.MAX_CAPTURE_ENTRIES
    assert limits.MAX_DECODE_QUERY_LEN == limits.MAX_SPECULATIVE_TOKENS + 1
    assert limits.MAX_CAPTURE_SIZE <= limits.MAX_INT
