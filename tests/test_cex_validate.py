"""dpsim.cex.validate: a counterexample's rank batch, checked field by field without a release."""

from __future__ import annotations

from typing import Any

import pytest

from dpsim.cex import validate


def _case(**batch: Any) -> dict[str, Any]:
    fields = {"num_reqs": 1, "num_tokens": 1, "num_active_loras": 0, **batch}
    fields = {key: value for key, value in fields.items() if value is not ...}
    return {
        "scenario": "step",
        "profile": "caller",
        "policy": {"capture_sizes": [1]},
        "steps": [[fields, fields]],
    }


def test_a_batch_with_its_optional_fields_null_or_absent_is_accepted() -> None:
    case = _case(uniform_token_count=None, need_eager=False, kind="decode")
    assert validate.case(case) is case


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"num_tokens": ...}, "case.steps[0][0] has no 'num_tokens'"),
        (
            {"num_reqs": True},
            "case.steps[0][0].num_reqs must be an integer >= 0, got True",
        ),
        (
            {"num_active_loras": -1},
            "case.steps[0][0].num_active_loras must be an integer >= 0, got -1",
        ),
        (
            {"max_query_len": "3"},
            "case.steps[0][0].max_query_len must be an integer >= 0, got '3'",
        ),
        ({"need_eager": 1}, "case.steps[0][0].need_eager must be true or false"),
        (
            {"uniform_decode": None},
            "case.steps[0][0].uniform_decode must be true or false",
        ),
        ({"num_req": 1}, "case.steps[0][0] has unknown keys: num_req"),
    ],
)
def test_a_bad_batch_field_is_refused_in_one_line_naming_it(
    batch: dict[str, Any], message: str
) -> None:
    with pytest.raises(validate.Malformed) as caught:
        validate.case(_case(**batch))
    assert str(caught.value) == message


def test_the_required_counts_are_checked_in_their_declared_order() -> None:
    with pytest.raises(validate.Malformed, match=r"\.num_reqs must"):
        validate.case(_case(num_reqs=-1, num_tokens=-1, need_eager=0))


def _drafter_case(*calls: dict[str, Any]) -> dict[str, Any]:
    case = _case()
    case["scenario"] = "drafter"
    case["profile"] = "contract"
    case["reuse_calls"] = [list(calls)]
    return case


def test_reuse_calls_with_a_bound_or_none_are_accepted() -> None:
    case = _drafter_case(
        {"num_reqs": 2, "max_query_len": None, "num_active_loras": 0},
        {"num_reqs": 0, "max_query_len": 3},
    )
    assert validate.case(case) is case


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"max_query_len": 1}, "case.reuse_calls[0][1] has no 'num_reqs'"),
        (
            {"num_reqs": -1},
            "case.reuse_calls[0][1].num_reqs must be an integer >= 0, got -1",
        ),
        (
            {"num_reqs": 2.5},
            "case.reuse_calls[0][1].num_reqs must be an integer >= 0, got 2.5",
        ),
        (
            {"num_reqs": 1, "max_query_len": "3"},
            "case.reuse_calls[0][1].max_query_len must be an integer >= 0, got '3'",
        ),
        (
            {"num_reqs": 1, "num_active_loras": True},
            "case.reuse_calls[0][1].num_active_loras must be an integer >= 0, got True",
        ),
        ({"num_reqs": 1, "loras": 1}, "case.reuse_calls[0][1] has unknown keys: loras"),
    ],
)
def test_a_bad_reuse_call_is_refused_in_one_line_naming_it(
    call: dict[str, Any], message: str
) -> None:
    with pytest.raises(validate.Malformed) as caught:
        validate.case(_drafter_case({"num_reqs": 1}, call))
    assert str(caught.value) == message


def test_reuse_calls_are_bounded_like_steps() -> None:
    case = _drafter_case({"num_reqs": 1})
    case["reuse_calls"] = [[{"num_reqs": 1}]] * (validate.MAX_STEPS + 1)
    with pytest.raises(validate.Malformed, match=r"^case\.reuse_calls has 257 entries"):
        validate.case(case)
