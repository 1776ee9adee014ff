"""dpsim.fields: each check's refusal, as the readers that declare fields print it."""

from __future__ import annotations

import pytest

from dpsim.fields import Field, boolean, integer, integers, member, optional


def test_integer_is_the_shared_bounds_check() -> None:
    check = integer(1, 8)
    assert check(1) is None and check(8) is None
    assert check(0) == "must be an integer >= 1, got 0"
    assert check(9) == "must be at most 8, got 9"
    assert check(True) == "must be an integer >= 1, got True"
    assert check("3") == "must be an integer >= 1, got '3'"


def test_boolean_refuses_what_python_would_count_as_truth() -> None:
    assert boolean(False) is None
    assert boolean(0) == "must be true or false, got 0"
    assert boolean("yes") == "must be true or false, got 'yes'"


def test_member_lists_the_choices_in_their_order() -> None:
    check = member(("b", "a"), "mode")
    assert check("a") is None
    assert check("c") == "unknown mode 'c'; expected one of b, a"
    assert check(3) == "unknown mode 3; expected one of b, a"


def test_optional_lets_null_through_and_nothing_else() -> None:
    check = optional(integer(0, 1))
    assert check(None) is None
    assert check(2) == "must be at most 1, got 2"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([3, 1], None),
        ((1,), None),
        ("1, 2", "expected a list of integers, got '1, 2'"),
        (5, "expected a list of integers, got 5"),
        ([1, 2, 3, 4], "4 entries; at most 3 allowed"),
        ([], "empty; say null"),
        ([1, 0], "every size must be an integer >= 1, got 0"),
        ([2, 1, 2], "size 2 is listed twice"),
    ],
)
def test_integers_names_the_first_problem(value: object, problem: str | None) -> None:
    check = integers(3, integer(1, 9), "size", empty="empty; say null")
    assert check(value) == problem


def test_an_empty_list_passes_unless_refused() -> None:
    assert integers(3, integer(1, 9), "size")([]) is None


def test_a_field_adds_its_note_to_a_problem_only() -> None:
    spec = Field("max", integer(1, 4), " (leave it out for the default)")
    assert spec.problem(2) is None
    assert spec.problem(5) == "must be at most 4, got 5 (leave it out for the default)"
