"""The V1 runner's scenarios: oracle, generators, and real checks.

The fast tests run the oracle against a small dispatcher written here (FULL
graphs for uniform decodes, PIECEWISE ones for everything, at sizes 1-8) and
draw from the V1 strategies without a release. The release tests run the
scenarios on real V1 callers and dispatchers and hold the verdicts examined
in docs/findings.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsim.corpus as corpus
from dpsim.check import CheckOptions, run_check
from dpsim.properties import judge
from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy, CudagraphMode, Microbatching
from dpsim.records.sync import Descriptor, sync_records
from dpsim.scenarios import run_case
from dpsim.scenarios.expect_v1 import is_uniform_decode, v1_choices
from dpsim.scenarios.generate_v1 import (
    V1CallerModel,
    caller_batches,
    contract_batches,
)
from dpsim.scenarios.ranks import _v1_dp_metadata
from dpsim.scenarios.run import PolicyRefused, setting_for
from dpsim.targets import load_target


class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class Key:
    num_tokens: int
    uniform: bool = False


class TinyDispatcher:
    """A V1-style dispatcher: FULL keys for uniform decodes, PIECEWISE for
    all, at sizes 1, 2, 4, 8 (as 0.17+'s signature takes them)."""

    cudagraph_mode = Mode.FULL
    sizes = (1, 2, 4, 8)

    def dispatch(
        self,
        num_tokens: int,
        uniform_decode: bool = False,
        has_lora: bool = False,
        num_active_loras: int = 0,
        valid_modes: Any = None,
        invalid_modes: Any = None,
    ) -> tuple[Mode, Key]:
        allowed = set(valid_modes or {Mode.NONE, Mode.PIECEWISE, Mode.FULL})
        allowed -= set(invalid_modes or ())
        padded = next((size for size in self.sizes if size >= num_tokens), None)
        if padded is None or has_lora:
            return Mode.NONE, Key(num_tokens)
        if uniform_decode and Mode.FULL in allowed:
            return Mode.FULL, Key(padded, True)
        if Mode.PIECEWISE in allowed:
            return Mode.PIECEWISE, Key(padded)
        return Mode.NONE, Key(num_tokens)


def decode(reqs: int, **extra: Any) -> RankBatch:
    return RankBatch(
        num_reqs=reqs, num_tokens=reqs, uniform_token_count=1, max_query_len=1, **extra
    )


def prefill(tokens: int, **extra: Any) -> RankBatch:
    return RankBatch(num_reqs=1, num_tokens=tokens, max_query_len=tokens, **extra)


def shapes(step: list[RankBatch], splits: Microbatching | None = None) -> list[Any]:
    chosen = v1_choices(TinyDispatcher(), step, splits, 1)
    assert chosen is not None
    return [(c.cg_mode, c.num_tokens, c.num_ubatches) for c in chosen]


def test_the_oracle_pads_graphs_to_the_largest_at_the_least_mode() -> None:
    full, piecewise = CudagraphMode.FULL, CudagraphMode.PIECEWISE
    assert shapes([decode(3), decode(1)]) == [(full, 4, 1), (full, 4, 1)]
    # A mixed rank holds the uniform one to PIECEWISE: the least mode.
    assert shapes([decode(3), prefill(5)]) == [(piecewise, 8, 1), (piecewise, 8, 1)]


def test_the_oracle_makes_every_rank_eager_at_its_own_count_when_one_is() -> None:
    none = CudagraphMode.NONE
    assert shapes([decode(3), prefill(5, need_eager=True)]) == [
        (none, 4, 1),  # its own padded vote: nothing pads it to the largest
        (none, 5, 1),
    ]
    # Past the largest graph a rank votes eager at its own count.
    assert shapes([decode(3), prefill(9)]) == [(none, 4, 1), (none, 9, 1)]


def test_the_oracle_splits_only_when_every_rank_fills_the_last_microbatch() -> None:
    two = Microbatching(
        num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
    )
    allow = {"allow_ubatching": True}
    full = CudagraphMode.FULL
    assert shapes([decode(5, **allow), decode(6, **allow)], two) == [(full, 8, 2)] * 2
    # 4 tokens of an 8-token split leave rank 0's second half empty.
    assert shapes([decode(4, **allow), decode(6, **allow)], two) == [(full, 8, 1)] * 2
    # One rank not allowing it keeps everyone whole.
    assert shapes([decode(5), decode(6, **allow)], two) == [(full, 8, 1)] * 2
    # A prefill is held to the prefill threshold, a decode to the decode one.
    mixed = replace(two, prefill_token_threshold=7)
    assert shapes([prefill(6, **allow), decode(6, **allow)], mixed)[0][2] == 1


def test_the_oracle_judges_no_step_of_one_rank() -> None:
    assert v1_choices(TinyDispatcher(), [decode(1)], None, 1) is None


def test_dummy_runs_force_the_uniform_flag_and_execute_model_works_it_out() -> None:
    assert is_uniform_decode(decode(3), 1)
    assert not is_uniform_decode(decode(3), 2)
    dummy = RankBatch(
        num_reqs=1,
        num_tokens=1,
        uniform_token_count=1,
        uniform_decode=True,
        kind="dummy",
    )
    assert is_uniform_decode(dummy, 2)  # _dummy_run(1, uniform_decode=True)
    profile = replace(dummy, uniform_decode=False, kind="profile")
    assert not is_uniform_decode(profile, 1)  # the flag is forced either way


POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=8,
    decode_query_len=2,
)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), new=st.booleans())
def test_caller_batches_are_what_execute_model_and_dummy_runs_pass(
    data: st.DataObject, new: bool
) -> None:
    model = V1CallerModel(dummy_of_decode_length=new, lora_counts=True)
    step = caller_batches(model, POLICY, "step")(data.draw, 3)
    assert any(batch.kind != "dummy" for batch in step)
    for batch in step:
        assert not batch.need_eager and batch.allow_ubatching
        assert batch.num_active_loras == 0  # the policy configures no LoRA
        if batch.kind == "dummy":
            assert (batch.num_reqs, batch.uniform_decode) == (1, True)
            assert batch.num_tokens == (2 if new else 1)
        else:
            assert not batch.uniform_decode and batch.num_tokens >= batch.num_reqs
    profile = caller_batches(model, POLICY, "profile")(data.draw, 3)
    assert len(set(profile)) == 1 and profile[0].need_eager


@settings(max_examples=60, deadline=None)
@given(data=st.data(), takes=st.booleans(), encoder_decoder=st.booleans())
def test_caller_batches_have_encoder_inputs_on_prefills_only(
    data: st.DataObject, takes: bool, encoder_decoder: bool
) -> None:
    model = V1CallerModel(
        dummy_of_decode_length=True, lora_counts=True, encoder_inputs=takes
    )
    policy = replace(POLICY, encoder_decoder=encoder_decoder)
    for batch in caller_batches(model, policy, "step")(data.draw, 4):
        if not takes or batch.kind in ("decode", "varlen", "dummy"):
            assert batch.num_encoder_reqs == 0
        elif encoder_decoder and batch.kind == "prefill":
            # No chunked prefill: every prefill brings its encoder input.
            assert batch.num_encoder_reqs == batch.num_reqs
        elif encoder_decoder:
            assert 1 <= batch.num_encoder_reqs <= batch.num_reqs
        else:
            assert 0 <= batch.num_encoder_reqs <= batch.num_reqs


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_contract_batches_force_the_uniform_flag_only_where_it_describes_them(
    data: st.DataObject,
) -> None:
    model = V1CallerModel(dummy_of_decode_length=True, lora_counts=True)
    for batch in contract_batches(model, POLICY, "step")(data.draw, 4):
        if batch.kind == "idle":
            assert (batch.num_tokens, batch.num_reqs, batch.uniform_decode) == (
                0,
                0,
                False,
            )
            continue
        assert 1 <= batch.num_reqs <= batch.num_tokens
        longest = batch.max_query_len
        assert longest is not None and longest <= batch.num_tokens - batch.num_reqs + 1
        if batch.uniform_decode:
            assert longest <= 2 and (
                batch.num_reqs == 1 or batch.num_tokens == 2 * batch.num_reqs
            )


# -- real V1 callers (release tier) ------------------------------------------

GRAPHS = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=16,
)
TWO_WAY = CapturePolicy(
    capture_sizes=(8, 16),
    cudagraph_mode="FULL",
    max_num_seqs=16,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
    ),
)


def step_of(*batches: RankBatch, policy: CapturePolicy = GRAPHS) -> Case:
    scenario = "ubatch" if policy.microbatching else "step"
    return Case(scenario, "caller", policy, (tuple(batches),))


ALLOW = {"allow_ubatching": True}
#: Hand-made steps, each reaching one bug class of the V1 corpus.
STEPS = {
    # Both ranks decode: FULL graphs of 4 once padded to the largest.
    "graphs": step_of(decode(3, **ALLOW), decode(1, **ALLOW)),
    # A prefill past the largest graph makes every rank eager.
    "eager": step_of(decode(3, **ALLOW), prefill(20, **ALLOW)),
    # 4 tokens of an 8-token two-way split: rank 0's second half is empty.
    "half-empty split": step_of(decode(4, **ALLOW), decode(8, **ALLOW), policy=TWO_WAY),
    # Rank 0 does not allow microbatching: nobody splits.
    "one vetoes": step_of(decode(6), decode(8, **ALLOW), policy=TWO_WAY),
}


def judged(target: Any, case: Any) -> list[str]:
    return [verdict.property for verdict in judge(case, run_case(target, case))]


@pytest.mark.release
@pytest.mark.parametrize("name", sorted(STEPS))
def test_the_hand_made_steps_pass_on_0_33_0(name: str) -> None:
    assert judged(load_target("0.33.0", runner="v1"), STEPS[name]) == []


@pytest.mark.release
@pytest.mark.parametrize(
    ("entry", "step", "caught"),
    [
        ("v1-unpadded-count-row", "graphs", "no-error"),
        ("v1-graph-not-padded", "graphs", "no-hang"),
        ("v1-pad-own-rank-only", "graphs", "agreement"),
        ("v1-pad-own-rank-only", "graphs", "padded-counts"),
        ("v1-mode-not-synced", "eager", "eager-contagion"),
        ("v1-pad-to-smallest", "graphs", "coverage"),
        ("v1-ubatch-guard-dropped", "half-empty split", "ubatch-split"),
        ("v1-ubatch-own-vote", "one vetoes", "ubatch-decision"),
        ("v1-mode-max", "eager", "graph-choice"),
    ],
)
def test_each_property_catches_its_bug_in_a_faulty_v1_sync(
    entry: str, step: str, caught: str, tmp_path: Any
) -> None:
    path = corpus.materialize(corpus.entry(entry), tmp_path)
    assert caught in judged(load_target("0.33.0", path, runner="v1"), STEPS[step])


@pytest.mark.release
def test_solo_catches_a_skipped_sync_that_still_reduces(tmp_path: Any) -> None:
    twin = corpus.reference_path("v1-v33").read_text()
    faulty = tmp_path / "dp_utils.py"
    faulty.write_text(
        corpus.apply_edits(
            twin,
            (("    if should_skip_dp_coordination():\n", "    if False:\n"),),
            "solo",
        )
    )
    shared = step_of(decode(3, **ALLOW), decode(3, **ALLOW))
    assert judged(load_target("0.33.0", runner="v1"), shared) == []
    assert judged(load_target("0.33.0", faulty, runner="v1"), shared) == ["solo"]


#: The properties a few hundred cases of each profile fail on real V1
#: releases, each failure examined (docs/findings.md: a vLLM bug or
#: a gap in dpsim's model); the hand-made steps below reproduce each one.
EXAMINED: dict[str, set[str]] = {
    "0.33.0": set(),
    "0.17.0": {"no-error"},
    "0.13.0": {"no-error", "graph-choice", "eager-contagion", "no-hang"},
    "0.12.0": {
        "no-error",
        "graph-choice",
        "eager-contagion",
        "no-hang",
        "ubatch-split",
        "ubatch-decision",
    },
}


@pytest.mark.release
@pytest.mark.parametrize(
    ("profile", "version"),
    [
        (profile, version)
        for profile in ("caller", "contract")
        for version in sorted(EXAMINED)
        # A default contract check of 0.33.0 (300 cases, not 200), asserted
        # to fail nothing, is tests/test_reach_release.py's V1 reach test.
        if (profile, version) != ("contract", "0.33.0")
    ],
)
def test_a_real_check_on_v1_releases_fails_only_what_was_examined(
    version: str, profile: str
) -> None:
    target = load_target(version, runner="v1")
    # Unshrunk: a scenario stops at its first failing case either way, so the
    # search is the same; the first failing case is judged on every property,
    # as a shrunk one would be, and shrinking cost most of the test's CPU on
    # the releases that fail.
    report = run_check(
        target, CheckOptions(profile=profile, examples=200, shrink=False)
    )
    found = {
        verdict.property
        for run in report.runs
        if run.finding is not None
        for verdict in run.finding.verdicts
    }
    assert found <= EXAMINED[version]
    assert bool(found) == bool(EXAMINED[version])


def ranks_of(
    policy: CapturePolicy, *batches: RankBatch, scenario: str = "step"
) -> Case:
    return Case(scenario, "caller", policy, (tuple(batches),))


FULL_DECODES = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16), cudagraph_mode="FULL_DECODE_ONLY", max_num_seqs=16
)
SPEC_DECODES = replace(FULL_DECODES, capture_sizes=(2,), decode_query_len=2)
#: Each examined finding as a hand-made step, and the first property it fails
#: per release (None: it passes there).
FINDINGS: dict[str, tuple[Case, dict[str, str | None]]] = {
    # A decode (FULL at 2) and a prefill (eager, no mixed graphs) padded to
    # 3: the decode's re-dispatch lands on a FULL graph of 4, and 0.12's own
    # assertion that it runs the agreed count fails.
    "decode and prefill under FULL_DECODE_ONLY": (
        ranks_of(FULL_DECODES, decode(2, **ALLOW), prefill(3, **ALLOW)),
        {
            "0.12.0": "no-error",
            "0.13.0": "graph-choice",
            "0.17.0": None,
            "0.33.0": None,
        },
    ),
    # A speculative decode (FULL at 2) and a request that got no draft (one
    # token, eager): 0.12 syncs no mode, so one rank replays and one does not.
    "decode and a draftless request": (
        ranks_of(
            SPEC_DECODES,
            RankBatch(num_reqs=1, num_tokens=2, uniform_token_count=2, **ALLOW),
            RankBatch(num_reqs=1, num_tokens=1, uniform_token_count=1, **ALLOW),
        ),
        {"0.12.0": "no-hang", "0.13.0": "graph-choice", "0.17.0": None, "0.33.0": None},
    ),
    # One real token per rank in a two-way split of a 2-token graph: 0.12's
    # caller passes the padded count as the unpadded one, so its guard
    # against an empty last microbatch never fires.
    "one token per rank, split in two": (
        ranks_of(
            replace(
                TWO_WAY,
                capture_sizes=(2,),
                max_num_seqs=1,
                microbatching=Microbatching(
                    num_ubatches=2, decode_token_threshold=0, prefill_token_threshold=0
                ),
            ),
            decode(1, **ALLOW),
            decode(1, **ALLOW),
            scenario="ubatch",
        ),
        {"0.12.0": "ubatch-split", "0.13.0": None, "0.17.0": None, "0.33.0": None},
    ),
    # An idle rank's dummy batch (one token, uniform decode forced) under
    # cudagraph_mode=FULL with speculative decoding: 1 is no multiple of 2.
    "an idle rank under FULL with speculative decoding": (
        ranks_of(
            replace(
                FULL_DECODES,
                cudagraph_mode="FULL",
                capture_sizes=(1, 2),
                decode_query_len=2,
            ),
            RankBatch(num_reqs=1, num_tokens=2, uniform_token_count=2, **ALLOW),
            RankBatch(
                num_reqs=1,
                num_tokens=1,
                uniform_token_count=1,
                uniform_decode=True,
                kind="dummy",
                **ALLOW,
            ),
        ),
        {
            "0.12.0": "no-error",
            "0.13.0": "no-error",
            "0.17.0": "no-error",
            "0.33.0": None,
        },
    ),
    # Two eager steps (one past the largest graph): 0.12-0.16 pad eager
    # steps to the largest rank whenever the deployment has graphs.
    "an eager step": (
        ranks_of(GRAPHS, prefill(20, **ALLOW), prefill(3, **ALLOW)),
        {
            "0.12.0": "graph-choice",
            "0.13.0": "graph-choice",
            "0.17.0": None,
            "0.33.0": None,
        },
    ),
    # A rank forced eager and one with a PIECEWISE graph: 0.13-0.16 hold
    # the other ranks to "no FULL graph", not to eager.
    "a forced-eager rank beside a piecewise one": (
        ranks_of(
            CapturePolicy(
                capture_sizes=(20,), cudagraph_mode="PIECEWISE", max_num_seqs=2
            ),
            RankBatch(num_reqs=2, num_tokens=9, max_query_len=5, need_eager=True),
            RankBatch(num_reqs=1, num_tokens=9, max_query_len=9),
        ),
        {
            "0.12.0": "no-hang",
            "0.13.0": "no-hang",
            "0.17.0": None,
            "0.33.0": None,
        },
    ),
}


@pytest.mark.release
@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_each_examined_finding_fails_where_it_was_found_and_passes_after(
    finding: str,
) -> None:
    case, first = FINDINGS[finding]
    for version, expected in first.items():
        verdicts = judged(load_target(version, runner="v1"), case)
        assert (verdicts[0] if verdicts else None) == expected, version


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "returned"),
    [("0.12.0", (None,)), ("0.33.0", (False,))],
)
def test_the_forward_runs_the_releases_dp_metadata_count_check(
    version: str, returned: tuple[Any, ...]
) -> None:
    target = load_target(version, runner="v1")
    setting = setting_for(target, STEPS["graphs"])
    runs = Descriptor(CudagraphMode.FULL, 4, 4)
    # What coordinate_batch_across_dp returned: counts of 3 and 4 tokens.
    native = (*returned, torch.tensor([3, 4], dtype=torch.int32))
    # DPMetadata.make's own message: the rank's agreed count, then its own.
    with pytest.raises(AssertionError, match=r"^3 4$"):
        _v1_dp_metadata(setting, 0, runs, native)  # rank 0 runs 4, was told 3
    _v1_dp_metadata(setting, 1, runs, native)


@pytest.mark.release
def test_where_the_dispatcher_asserts_each_rank_raises_in_its_own_call() -> None:
    # The oracle runs in rank 0's program before its sync; the release's
    # dispatcher asserting there must leave the step unjudged, so that rank 0
    # is seen raising in its own call, like every other rank, not before it.
    # (0.17's FULL mode with a decode of 3: its graph of 4 is no multiple of 3.)
    policy = replace(
        FULL_DECODES, cudagraph_mode="FULL", capture_sizes=(1, 2, 4), decode_query_len=3
    )
    spec_decode = RankBatch(num_reqs=1, num_tokens=3, uniform_token_count=3, **ALLOW)
    result = run_case(
        load_target("0.17.0", runner="v1"), ranks_of(policy, spec_decode, spec_decode)
    )
    records = [sync_records(rank.events) for rank in result.ranks]
    assert [[record.raised for record in syncs] for syncs in records] == [[True]] * 2
    assert all("AssertionError" in (syncs[0].error or "") for syncs in records)


# -- encoder inputs ------------------------------------------------------------


class EncoderDecoderDispatcher(TinyDispatcher):
    """The tiny dispatcher, holding its model's config as vLLM's does."""

    def __init__(self, encoder_decoder: bool) -> None:
        model = type("ModelConfig", (), {"is_encoder_decoder": encoder_decoder})
        self.vllm_config = type("VllmConfig", (), {"model_config": model})


def test_the_oracle_leaves_full_out_of_an_encoder_decoder_ranks_encoder_step() -> None:
    full, piecewise = CudagraphMode.FULL, CudagraphMode.PIECEWISE
    step = [decode(3, num_encoder_reqs=1), decode(1)]

    def modes(encoder_decoder: bool) -> list[Any]:
        chosen = v1_choices(EncoderDecoderDispatcher(encoder_decoder), step, None, 1)
        assert chosen is not None
        return [(c.cg_mode, c.num_tokens) for c in chosen]

    # Rank 0's own lookup is PIECEWISE, the least mode every rank agrees on.
    assert modes(True) == [(piecewise, 4), (piecewise, 4)]
    # A decoder-only model's encoder inputs (multimodal) change nothing.
    assert modes(False) == [(full, 4), (full, 4)]


FULL_ONLY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16), cudagraph_mode="FULL", max_num_seqs=16
)


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.17.0", "0.33.0"])
@pytest.mark.parametrize("encoder_decoder", [True, False])
def test_an_encoder_prefill_of_an_encoder_decoder_model_replays_no_full_graph(
    version: str, encoder_decoder: bool
) -> None:
    # FULL mode captures FULL graphs for every batch: an encoder-decoder
    # model's prefill with encoder inputs (the caller's has_encoder_output) may
    # not replay one, so its rank runs eager and, the least mode, every rank.
    policy = replace(FULL_ONLY, encoder_decoder=encoder_decoder)
    encoder_prefill = prefill(5, num_encoder_reqs=1, **ALLOW)
    case = step_of(encoder_prefill, prefill(3, **ALLOW), policy=policy)
    target = load_target(version, runner="v1")
    result = run_case(target, case)
    modes = [
        sync_records(rank.events)[0].descriptor.cg_mode  # type: ignore[union-attr]
        for rank in result.ranks
    ]
    want = CudagraphMode.NONE if encoder_decoder else CudagraphMode.FULL
    assert modes == [want, want]
    assert [v.property for v in judge(case, result)] == []  # the oracle agrees


@pytest.mark.release
def test_encoder_requests_are_refused_where_the_sync_cannot_take_them() -> None:
    encoder_prefill = prefill(5, num_encoder_reqs=1)
    assert (
        load_target("0.33.0", runner="v2").api.unsupported_input(encoder_prefill)
        == "num_encoder_reqs"
    )
    assert (
        load_target("0.12.0", runner="v1").api.unsupported_input(encoder_prefill)
        == "num_encoder_reqs"
    )
    assert (
        load_target("0.13.0", runner="v1").api.unsupported_input(encoder_prefill)
        is None
    )


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.12.0", "0.20.0"])
def test_the_caller_profile_draws_lora_tables_before_the_v2_lora_rule(
    version: str,
) -> None:
    """Before 0.24 a release has no V2 ``get_lora_capture_cases``; the V1
    dispatcher's own rule stands in, so the caller profile still runs LoRA
    deployments (it drew none at all, and the dispatcher's LoRA paths went
    unrun), and each table it draws is one the release's dispatcher builds."""
    from dpsim.scenarios.generate import cases
    from dpsim.search.fast import Tally, search

    target = load_target(version, runner="v1")
    seen: list[Case] = []
    search(
        cases(target, scenario="step", profile="caller", ranks=(2, 4)),
        lambda case: seen.append(case) or False,
        200,
        0,
        Tally(),
    )
    with_lora = [
        case for case in seen if case.policy.lora_capture_cases not in (None, (0,))
    ]
    assert len(with_lora) > len(seen) // 5
    assert any(
        batch.num_active_loras
        for case in with_lora
        for step in case.steps
        for batch in step
    )
    # The release's dispatcher refuses LoRA cases it would not capture; other
    # refusals (a table vLLM's own config rounding empties) are not about LoRA.
    built, refused = 0, []
    for case in with_lora[:20]:
        try:
            setting_for(target, case)
        except PolicyRefused as refusal:
            refused.append(str(refusal))
        else:
            built += 1
    assert built and not [reason for reason in refused if "LoRA" in reason]
