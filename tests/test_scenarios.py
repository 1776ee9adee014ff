"""Cases, generators and the per-rank programs of each scenario."""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy, Microbatching
from dpsim.records.sync import sync_records
from dpsim.records.trace import Outcome
from dpsim.scenarios import PolicyRefused, run_case
from dpsim.scenarios.expect import expected_split, table_choices
from dpsim.scenarios.generate import _split, cases, scenarios_for, seeded_draws_only
from dpsim.scenarios.run import setting_for
from dpsim.targets import load_target
from dpsim.targets.buildable import rules_of

pytestmark = pytest.mark.release

SMALL = CapturePolicy(
    capture_sizes=(1, 2, 4, 8), cudagraph_mode="FULL_AND_PIECEWISE", max_num_seqs=8
)


def _phases(result) -> list[list[str]]:
    return [
        [record.phase for record in sync_records(trace.events)]
        for trace in result.ranks
    ]


@pytest.mark.parametrize("version", ["0.20.0", "0.29.0", "0.33.0"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_caller_batches_are_what_a_model_runner_builds(
    version: str, data: st.DataObject
) -> None:
    target = load_target(version)
    scenario = data.draw(st.sampled_from(scenarios_for(target)))
    case = data.draw(cases(target, scenario=scenario, profile="caller", ranks=(2, 6)))
    query_len = case.policy.decode_query_len
    for step in case.steps:
        assert any(batch.kind != "dummy" for batch in step) or scenario == "profile"
        for batch in step:
            assert 1 <= batch.num_reqs <= batch.num_tokens
            assert batch.num_reqs <= case.policy.max_num_seqs
            if batch.uniform_token_count is not None:
                assert batch.uniform_token_count * batch.num_reqs == batch.num_tokens
            if batch.max_query_len is not None:
                assert batch.max_query_len * batch.num_reqs >= batch.num_tokens
            if batch.kind == "dummy":
                assert (batch.num_reqs, batch.num_tokens) == (1, query_len)
            if batch.kind == "varlen":
                # Fewer drafts on some requests: 1..q tokens each, never more.
                assert batch.num_reqs <= batch.num_tokens < batch.num_reqs * query_len
                assert not batch.uniform_decode
            if scenario == "profile":
                assert batch.need_eager and batch == step[0]
            cases_ = case.policy.lora_capture_cases
            if batch.kind in ("dummy", "profile") and target.api.has(
                "num_active_loras"
            ):
                # vLLM's dummy and profile runs pass max_loras + 1.
                assert batch.num_active_loras == (max(cases_) if cases_ else 0)
            elif cases_:
                # No batch has more adapters active than max_loras, or than
                # it has requests.
                assert batch.num_active_loras < max(cases_)
                assert batch.num_active_loras <= batch.num_reqs
            else:
                assert batch.num_active_loras == 0
    # Only tables the release's own config code builds.
    rules = rules_of(target)
    if case.policy.drafter is not None:
        drafter = case.policy.drafter
        assert drafter.lora_capture_cases is None and drafter.microbatching is None
        assert not drafter.varlen_decode
    for table in (case.policy, case.policy.drafter):
        if table is None:
            continue
        assert table.lora_capture_cases is None or 0 in table.lora_capture_cases
        assert table.max_capture_size in (None, max(table.capture_sizes, default=0))
        if table.microbatching is not None:
            assert rules.accepts_thresholds(table.microbatching)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_contract_batches_stay_inside_the_documented_contract(
    data: st.DataObject,
) -> None:
    target = load_target("0.33.0")
    case = data.draw(cases(target, scenario="step", profile="contract", ranks=(2, 4)))
    for batch in case.steps[0]:
        assert 0 <= batch.num_reqs <= batch.num_tokens
        assert (batch.num_tokens == 0) == (batch.num_reqs == 0)
        if batch.uniform_token_count is not None:
            assert batch.uniform_token_count * batch.num_reqs == batch.num_tokens
            assert batch.uniform_decode == (
                batch.uniform_token_count == case.policy.decode_query_len
            )


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_cases_round_trip_through_json(data: st.DataObject) -> None:
    target = load_target("0.33.0")
    scenario = data.draw(st.sampled_from(scenarios_for(target)))
    case = data.draw(cases(target, scenario=scenario, profile="contract", ranks=(2, 3)))
    assert Case.from_dict(case.to_dict()) == case


def _showing(target, scenario: str, wanted) -> list[Case]:
    """The cases, of a seeded check's 100 caller cases, whose run shows ``wanted``."""
    shown: list[Case] = []

    def look(case: Case) -> bool:
        try:
            result = run_case(target, case)
        except PolicyRefused:
            return False
        records = [
            record
            for trace in result.ranks
            for record in sync_records(trace.events)
            if not record.raised
        ]
        if any(wanted(record) for record in records):
            shown.append(case)
        return False

    with pytest.raises(NoSuchExample), seeded_draws_only():
        find(
            cases(target, scenario=scenario, profile="caller"),
            look,
            settings=settings(
                max_examples=100, database=None, phases=[Phase.generate], deadline=None
            ),
            random=Random(0),
        )
    return shown


def test_the_ubatch_scenario_reaches_microbatched_graphs_often() -> None:
    # 0.33.0's microbatching branch, bugs included, sits behind steps where every
    # rank decodes near one graph's size, in a FULL mode. Mixed palettes reached
    # it in 2 cases of 100; the scenario now draws such steps on purpose (5 on
    # seed 0, 12 to 15 on seeds 1-3).
    shown = _showing(
        load_target("0.33.0"),
        "ubatch",
        lambda record: (
            record.descriptor.num_ubatches > 1 and record.descriptor.cg_mode != "NONE"
        ),
    )
    assert len(shown) >= 4
    for case in shown:
        assert any(all(batch.uniform_decode for batch in step) for step in case.steps)


def test_caller_steps_reach_varlen_decodes() -> None:
    shown = _showing(
        load_target("0.33.0"),
        "step",
        lambda record: (
            record.inputs.kind == "varlen"
            and record.descriptor.max_query_len is not None
        ),
    )
    assert shown and all(case.policy.varlen_decode for case in shown)


def test_scenarios_follow_each_versions_api() -> None:
    assert scenarios_for(load_target("0.33.0")) == (
        "step",
        "drafter",
        "profile",
        "ubatch",
    )
    assert "ubatch" not in scenarios_for(load_target("0.29.0"))


def test_the_drafter_scenario_runs_prefill_then_its_own_decode_syncs() -> None:
    target = load_target("0.29.0")
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        cudagraph_mode="FULL_AND_PIECEWISE",
        max_num_seqs=8,
        decode_query_len=3,
        drafter=CapturePolicy(
            capture_sizes=(1, 2, 4), cudagraph_mode="FULL_AND_PIECEWISE", max_num_seqs=8
        ),
    )
    decode = RankBatch(
        num_reqs=2, num_tokens=6, uniform_token_count=3, max_query_len=3, kind="decode"
    )
    case = Case(
        "drafter", "caller", policy, ((decode, decode),), num_speculative_steps=2
    )
    result = run_case(target, case)
    assert result.outcome == Outcome.OK
    assert (
        _phases(result) == [["step 0", "drafter prefill 0", "drafter decode 0.1"]] * 2
    )
    step, prefill = sync_records(result.ranks[0].events)[:2]
    # The prefill reuses the target's agreement: same padded count, no collective.
    assert step.descriptor is not None
    assert prefill.inputs.num_tokens == step.descriptor.num_tokens
    syncs = [c for c in result.ranks[0].collectives if c.group == "dp_cpu"]
    assert (
        len(syncs) == 2
    )  # the target's sync and the drafter decode's, not the prefill


def test_a_step_records_what_each_rank_passed_and_chose() -> None:
    target = load_target("0.33.0")
    busy = RankBatch(
        num_reqs=3, num_tokens=3, uniform_token_count=1, max_query_len=1, kind="decode"
    )
    idle = RankBatch(
        num_reqs=1, num_tokens=1, uniform_token_count=1, max_query_len=1, kind="dummy"
    )
    result = run_case(target, Case("step", "caller", SMALL, ((busy, idle),)))
    first, second = (sync_records(trace.events)[0] for trace in result.ranks)
    assert first.inputs.num_tokens == 3 and second.inputs.kind == "dummy"
    assert first.descriptor == second.descriptor
    assert first.descriptor is not None and first.descriptor.num_tokens == 4
    assert first.agreement is not None
    assert first.agreement.num_tokens_across_dp == (4, 4)
    ep = [c for c in result.ranks[1].collectives if c.group == "ep"]
    assert [c.signature.shape for c in ep] == [(4,)]


def test_a_policy_the_versions_manager_refuses_is_reported_as_such() -> None:
    target = load_target("0.24.0")  # rounds sizes to the decode length itself
    policy = CapturePolicy(
        capture_sizes=(1,),
        cudagraph_mode="FULL",
        max_num_seqs=4,
        decode_query_len=3,
        max_capture_size=2,
    )
    batch = RankBatch(num_reqs=1, num_tokens=3, uniform_token_count=3)
    # Every time: a policy's managers are looked up once, a refusal is not kept.
    for _ in range(2):
        with pytest.raises(PolicyRefused, match="No valid cudagraph sizes"):
            run_case(target, Case("step", "caller", policy, ((batch, batch),)))


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [(7, 3, [2, 2, 3]), (4, 4, [1, 1, 1, 1]), (3, 5, [1, 1, 1])],
)
def test_split_puts_the_remainder_on_the_last_requests(
    total: int, parts: int, expected: list[int]
) -> None:
    assert _split(total, parts) == expected


def _decode(tokens: int, **extra: object) -> RankBatch:
    return RankBatch(
        num_reqs=tokens,
        num_tokens=tokens,
        uniform_token_count=1,
        max_query_len=1,
        uniform_decode=True,
        kind="decode",
        **extra,  # type: ignore[arg-type]
    )


def _chosen(policy: CapturePolicy, step: tuple[RankBatch, ...]) -> list[tuple]:
    target = load_target("0.33.0")
    manager = setting_for(target, Case("step", "caller", policy, (step,))).manager
    choices = table_choices(manager, step, policy.microbatching)
    assert choices is not None
    return [(c.cg_mode, c.num_tokens, c.num_ubatches) for c in choices]


def test_the_oracle_asks_the_real_table_for_the_agreed_batch() -> None:
    # The largest rank's 3 tokens, uniform 1 on both: the table's FULL graph of 4.
    assert _chosen(SMALL, (_decode(3), _decode(1))) == [("FULL", 4, 1)] * 2
    # One rank asking for eager makes every rank run its own batch eager.
    eager = (_decode(3), _decode(1, need_eager=True))
    assert _chosen(SMALL, eager) == [("NONE", 3, 1), ("NONE", 1, 1)]
    # A prefill gets no FULL_DECODE_ONLY graph on its own: everyone eager.
    decode_only = replace(SMALL, cudagraph_mode="FULL_DECODE_ONLY")
    prefill = RankBatch(num_reqs=1, num_tokens=3, kind="prefill")
    assert _chosen(decode_only, (_decode(2), prefill)) == [
        ("NONE", 2, 1),
        ("NONE", 3, 1),
    ]


def test_the_oracle_splits_into_a_graph_only_when_every_rank_fills_it() -> None:
    policy = replace(
        SMALL,
        cudagraph_mode="FULL",
        microbatching=Microbatching(
            num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
        ),
    )
    allow = {"allow_ubatching": True}
    full = (_decode(4, **allow), _decode(3, **allow))
    assert _chosen(policy, full) == [("FULL", 4, 2)] * 2
    # 2 tokens leave the second half of a 4-token graph empty (vLLM 57020).
    half = (_decode(4, **allow), _decode(2, **allow))
    assert _chosen(policy, half) == [("NONE", 4, 2)] * 2
    # One rank not allowing it: no split.
    assert _chosen(policy, (_decode(4, **allow), _decode(3)))[0][2] == 1
    assert expected_split(full, policy.microbatching) == 2
    assert expected_split(full[:1], policy.microbatching) == 1  # one rank: no sync


@pytest.mark.parametrize(("version", "solo"), [("0.29.0", False), ("0.33.0", True)])
def test_identical_batches_are_synced_again_alone_where_vllm_allows_it(
    version: str, solo: bool
) -> None:
    plain = replace(_decode(3), uniform_decode=False)  # 0.29 takes no such vote
    same = (plain, plain)
    different = (plain, replace(plain, num_reqs=1, num_tokens=1))
    result = run_case(
        load_target(version), Case("step", "caller", SMALL, (same, different))
    )
    phases = _phases(result)[0]
    assert phases == (["step 0", "solo 0", "step 1"] if solo else ["step 0", "step 1"])
    if solo:
        together, alone = sync_records(result.ranks[1].events)[:2]
        assert alone.solo and not together.solo
        assert alone.descriptor == together.descriptor


@pytest.mark.parametrize(
    ("profile", "space"),
    [
        ("caller", "policies drawn from what the release's config builds"),
        ("contract", "policies drawn from every valid table"),
    ],
)
def test_a_reported_case_says_which_policy_space_it_came_from(
    profile: str, space: str
) -> None:
    from dpsim.properties.base import Evidence
    from dpsim.report import render_case_run

    target = load_target("0.33.0")
    batch = RankBatch(num_reqs=1, num_tokens=1, uniform_token_count=1)
    case = Case(scenario="step", profile=profile, policy=SMALL, steps=((batch,) * 2,))
    text = render_case_run("title", case, Evidence(case, run_case(target, case)))
    assert f"({profile} profile: {space})" in text.splitlines()[3]
