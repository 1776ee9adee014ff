"""Branch reach without a release: the contract profile's steered steps and drafter
reuse calls, what they draw and how a case carries them."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from dpsim.coverage.unreachable import UNREACHABLE
from dpsim.errors import UsageError
from dpsim.records.case import Case, RankBatch, ReuseCall
from dpsim.records.policy import CapturePolicy
from dpsim.scenarios.reuse_calls import reuse_calls
from dpsim.scenarios.steer import bound_straddles

ALL = frozenset({"max_query_len", "num_active_loras", "allow_skip_drafts"})
VARLEN = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16, 32),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=16,
    decode_query_len=3,
    varlen_decode=True,
)


def _first(strategy: st.SearchStrategy, condition, seed: int = 0):
    return find(
        strategy,
        condition,
        settings=settings(
            max_examples=500,
            phases=(Phase.generate,),
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
        random=Random(seed),
    )


def _straddle_steps(policy: CapturePolicy, features: frozenset[str] = ALL):
    step = bound_straddles(policy, features, st.integers(0, 2))
    assert step is not None

    @st.composite
    def steps(draw: st.DrawFn) -> list[RankBatch]:
        dp_size = draw(st.integers(1, 6))
        batches = step(draw, dp_size)
        assert len(batches) == dp_size
        return batches

    return steps()


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_straddled_steps_put_ranks_on_both_sides_of_the_decode_length(
    data: st.DataObject,
) -> None:
    batches = data.draw(_straddle_steps(VARLEN))
    q = VARLEN.decode_query_len
    short = batches[0].max_query_len
    assert short is not None and short <= q
    if len(batches) > 1:
        long = batches[1].max_query_len
        assert long is None or long > q
    for batch in batches:
        # A consistent batch: one request of ``bound`` tokens, none longer
        # (the shorter rank's bound, or at most 2q + 2 where none is passed).
        bound = batch.max_query_len or 2 * q + 2
        assert batch.num_reqs <= batch.num_tokens <= batch.num_reqs * bound
        assert batch.num_tokens <= max(VARLEN.capture_sizes)
        assert not batch.need_eager and not batch.allow_ubatching


def test_no_straddled_steps_where_the_agreed_bound_decides_nothing() -> None:
    assert (
        bound_straddles(replace(VARLEN, varlen_decode=False), ALL, st.just(0)) is None
    )
    assert bound_straddles(replace(VARLEN, decode_query_len=1), ALL, st.just(0)) is None
    assert bound_straddles(VARLEN, ALL - {"max_query_len"}, st.just(0)) is None


def _reuse_steps(features: frozenset[str] = ALL):
    draw_calls = reuse_calls(VARLEN, features, st.integers(0, 3))
    target = RankBatch(num_reqs=4, num_tokens=12, uniform_token_count=3)
    other = RankBatch(num_reqs=2, num_tokens=7, max_query_len=5)

    @st.composite
    def calls(draw: st.DrawFn) -> tuple[tuple[RankBatch, ...], tuple[ReuseCall, ...]]:
        step = (target, other, target)
        return step, draw_calls(draw, step)

    return calls()


@pytest.mark.parametrize(
    "wanted",
    [
        lambda call, batch: call.max_query_len is None,
        lambda call, batch: call.max_query_len is not None,
        lambda call, batch: call.num_reqs != batch.num_reqs,
        lambda call, batch: call.num_active_loras != batch.num_active_loras,
    ],
    ids=["no-bound", "own-bound", "other-request-count", "other-lora-count"],
)
def test_the_contracts_reuse_calls_include(wanted) -> None:
    _first(
        _reuse_steps(),
        lambda drawn: any(
            wanted(call, batch) for batch, call in zip(*drawn, strict=True)
        ),
    )


@settings(max_examples=80, deadline=None)
@given(drawn=_reuse_steps())
def test_reuse_calls_stay_inside_what_the_batch_allows(drawn) -> None:
    step, calls = drawn
    # Ranks given one batch share its call.
    assert calls[0] == calls[2]
    for batch, call in zip(step, calls, strict=True):
        per_request = batch.uniform_token_count or 1
        assert 1 <= call.num_reqs <= batch.num_tokens // per_request
        assert 0 <= call.num_active_loras <= 3


@settings(max_examples=30, deadline=None)
@given(drawn=_reuse_steps(frozenset()))
def test_a_sync_without_bound_or_lora_parameters_gets_neither(drawn) -> None:
    for call in drawn[1]:
        assert call.max_query_len is None and call.num_active_loras == 0


def _case(reuse: tuple[tuple[ReuseCall, ...], ...] = ()) -> Case:
    batch = RankBatch(num_reqs=1, num_tokens=4)
    return Case(
        scenario="drafter",
        profile="contract",
        policy=VARLEN,
        steps=((batch, batch),),
        num_speculative_steps=2,
        reuse_calls=reuse,
    )


def test_a_case_carries_its_reuse_calls_and_files_without_them_read_as_before() -> None:
    plain = _case()
    assert "reuse_calls" not in plain.to_dict()
    assert Case.from_dict(plain.to_dict()) == plain
    calls = ((ReuseCall(3, None, 1), ReuseCall(1, 5, 0)),)
    drawn = _case(calls)
    assert drawn.to_dict()["reuse_calls"] == [
        [
            {"num_reqs": 3, "max_query_len": None, "num_active_loras": 1},
            {"num_reqs": 1, "max_query_len": 5, "num_active_loras": 0},
        ]
    ]
    assert Case.from_dict(drawn.to_dict()) == drawn


def test_reuse_calls_of_the_wrong_shape_or_keys_are_refused() -> None:
    data = _case(((ReuseCall(1),),)).to_dict()
    with pytest.raises(UsageError, match="one call per step and rank"):
        Case.from_dict(data)
    data = _case(((ReuseCall(1), ReuseCall(1)),)).to_dict()
    data["reuse_calls"][0][0]["num_tokens"] = 4
    with pytest.raises(UsageError, match="unknown keys: num_tokens"):
        Case.from_dict(data)


def test_every_unreachable_mark_gives_a_reason_and_a_release_range() -> None:
    assert UNREACHABLE
    for mark in UNREACHABLE:
        assert mark.reason.strip() and mark.releases and mark.source
        mark.applies_to("0.33.0")  # a valid specifier
