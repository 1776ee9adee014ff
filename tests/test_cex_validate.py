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
