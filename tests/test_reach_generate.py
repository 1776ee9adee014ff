"""Branch reach without a release: the contract profile's steered steps and drafter
reuse calls, what they draw and how a case carries them, and the V1 caller
profile's microbatching veto."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from dpsim.coverage.unreachable import UNREACHABLE
from dpsim.errors import UsageError
from dpsim.records.case import PROFILES, Case, RankBatch, ReuseCall
from dpsim.records.policy import CapturePolicy, Microbatching
from dpsim.scenarios.generate_v1 import V1CallerModel, caller_batches
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
        assert set(mark.profiles) <= set(PROFILES)
        if mark.profiles == ("caller",):
            # Why vLLM's callers never get there, with the lines that show it.
            assert mark.reason.startswith("vLLM's callers never reach this: ")
            assert " line " in mark.reason


UBATCHED = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16, 32),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=16,
    decode_query_len=2,
    microbatching=Microbatching(),
)


def _v1_caller_steps(veto: bool, policy: CapturePolicy = UBATCHED):
    model = V1CallerModel(
        dummy_of_decode_length=True, lora_counts=True, microbatch_veto=veto
    )
    step = caller_batches(model, policy, "step")

    @st.composite
    def steps(draw: st.DrawFn) -> list[RankBatch]:
        return step(draw, draw(st.integers(2, 4)))

    return steps()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_v1_callers_veto_microbatching_only_where_a_prefix_can_split(
    data: st.DataObject,
) -> None:
    # 0.28+'s _allow_microbatching: a prefill longer than a decode reading a
    # prefix that another prefill of the step is writing.
    for rank in data.draw(_v1_caller_steps(veto=True)):
        if not rank.allow_ubatching:
            assert rank.kind in ("prefill", "mixed")
            assert rank.num_reqs >= 2
            assert (rank.max_query_len or 0) > UBATCHED.decode_query_len


def test_the_v1_callers_veto_is_drawn_from_0_28_with_microbatching_only() -> None:
    def vetoed(steps: list[RankBatch]) -> bool:
        return any(not rank.allow_ubatching for rank in steps)

    assert vetoed(_first(_v1_caller_steps(veto=True), vetoed))
    with pytest.raises(NoSuchExample):
        _first(_v1_caller_steps(veto=False), vetoed)
    without = replace(UBATCHED, microbatching=None)
    with pytest.raises(NoSuchExample):
        _first(_v1_caller_steps(veto=True, policy=without), vetoed)
