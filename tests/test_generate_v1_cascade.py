"""Cascade attention in the V1 caller profile: which rank batches may carry
``use_cascade_attn=True`` (0.12-0.31's ``execute_model``), how the flag
reaches the caller method, what the oracle makes of it, and what it reaches
on real releases."""

from __future__ import annotations

from dataclasses import dataclass, replace
from random import Random

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from v1cascade import (
    CASCADE_BRANCH_012,
    DISPATCHER_012,
    POLICY,
    Mode,
    api_taking,
    cascade_step,
    decodes,
)

from dpsim.check import CheckOptions, run_check
from dpsim.properties import judge
from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode, Microbatching
from dpsim.scenarios import run_case
from dpsim.scenarios.expect_v1 import v1_choices
from dpsim.scenarios.generate_v1 import (
    CASCADE_MIN_REQUESTS,
    V1CallerModel,
    caller_batches,
    cascades,
)
from dpsim.targets import load_target
from dpsim.targets.v1.modelled import PARAMETERS as MODELLED_PARAMETERS

TWO_WAY = Microbatching(
    num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
)
CASCADING = V1CallerModel(
    dummy_of_decode_length=True, lora_counts=True, cascade_attn=True
)


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (decodes(CASCADE_MIN_REQUESTS), True),
        (decodes(CASCADE_MIN_REQUESTS - 1), False),
        (replace(decodes(9), kind="mixed"), True),
        (replace(decodes(9), kind="varlen"), True),
        (replace(decodes(9), kind="prefill"), True),
        # _dummy_run passes use_cascade_attn=False, profile runs included.
        (replace(decodes(9), kind="dummy"), False),
        (replace(decodes(9), kind="profile"), False),
    ],
)
def test_only_scheduled_batches_of_eight_or_more_requests_may_cascade(
    batch: RankBatch, expected: bool
) -> None:
    assert cascades(batch) is expected


@settings(max_examples=80, deadline=None)
@given(data=st.data(), takes=st.booleans(), microbatched=st.booleans())
def test_cascade_is_drawn_only_where_the_release_and_config_let_vllm_pass_it(
    data: st.DataObject, takes: bool, microbatched: bool
) -> None:
    model = replace(CASCADING, cascade_attn=takes)
    policy = replace(POLICY, microbatching=TWO_WAY if microbatched else None)
    scenario = "ubatch" if microbatched else "step"
    for batch in caller_batches(model, policy, scenario)(data.draw, 4):
        if batch.cascade_attn:
            # 0.32 turns cascade attention off; DBO disables it in the config.
            assert takes and not microbatched and cascades(batch)
    for batch in caller_batches(model, policy, "profile")(data.draw, 4):
        assert not batch.cascade_attn


def test_ranks_with_the_same_batch_may_differ_in_cascade() -> None:
    """The flag is drawn per rank: the common prefix is each KV cache's own."""

    @st.composite
    def steps(draw: st.DrawFn) -> list[RankBatch]:
        return caller_batches(CASCADING, POLICY, "step")(draw, 2)

    step = find(
        steps(),
        lambda step: (
            replace(step[0], cascade_attn=False) == replace(step[1], cascade_attn=False)
            and step[0].cascade_attn != step[1].cascade_attn
        ),
        settings=settings(max_examples=2000, database=None, phases=(Phase.generate,)),
        random=Random(0),
    )
    assert cascades(step[0])


def test_a_batch_file_names_cascade_only_when_it_is_on() -> None:
    plain, cascading = decodes(8), decodes(8, cascade_attn=True)
    assert "cascade_attn" not in plain.to_dict()
    assert cascading.to_dict()["cascade_attn"] is True
    assert RankBatch.from_dict(cascading.to_dict()) == cascading
    assert RankBatch.from_dict(plain.to_dict()) == plain
    # Reprs too: a batch without it reads as before the field existed.
    assert "cascade_attn" not in repr(plain)
    assert "cascade_attn=True" in repr(cascading)


def test_the_flag_is_the_callers_use_cascade_attn_and_refused_without_it() -> None:
    real = api_taking((*MODELLED_PARAMETERS, "use_cascade_attn"))
    assert real._arguments(decodes(8, cascade_attn=True))["use_cascade_attn"] is True
    assert real._arguments(decodes(8))["use_cascade_attn"] is False
    assert real.unsupported_input(decodes(8, cascade_attn=True)) is None
    # 0.11's modelled caller has no cascade attention: refused, not dropped.
    modelled = api_taking(MODELLED_PARAMETERS)
    assert modelled.unsupported_input(decodes(8, cascade_attn=True)) == "cascade_attn"


@dataclass(frozen=True)
class Key:
    num_tokens: int
    uniform: bool = False


class Dispatcher012:
    """0.12's dispatcher signature: FULL only without cascade attention
    (``if not use_cascade_attn:``), PIECEWISE for every batch, sizes 8 and 16."""

    cudagraph_mode = Mode.FULL
    sizes = (8, 16)

    def dispatch(
        self,
        num_tokens: int,
        uniform_decode: bool,
        has_lora: bool,
        use_cascade_attn: bool = False,
    ) -> tuple[Mode, Key]:
        padded = next((size for size in self.sizes if size >= num_tokens), None)
        if padded is None:
            return Mode.NONE, Key(num_tokens)
        if uniform_decode and not use_cascade_attn:
            return Mode.FULL, Key(padded, True)
        return Mode.PIECEWISE, Key(padded)


def test_the_oracle_asks_0_12s_dispatcher_to_leave_full_out_for_cascade() -> None:
    both = [decodes(9, cascade_attn=True), decodes(12, cascade_attn=True)]
    chosen = v1_choices(Dispatcher012(), both, None, 1)
    assert chosen is not None
    assert [(c.cg_mode, c.num_tokens) for c in chosen] == [
        (CudagraphMode.PIECEWISE, 16),
        (CudagraphMode.PIECEWISE, 16),
    ]
    without = v1_choices(Dispatcher012(), [decodes(9), decodes(12)], None, 1)
    assert without is not None
    assert {c.cg_mode for c in without} == {CudagraphMode.FULL}
    # One rank cascading: 0.12 agrees no mode, so the other rank's FULL
    # graph is no agreed choice to judge against; the step is not judged.
    one = [decodes(9), decodes(12, cascade_attn=True)]
    assert v1_choices(Dispatcher012(), one, None, 1) is None


# -- real releases ------------------------------------------------------------


@pytest.mark.release
@pytest.mark.parametrize("profile", ["caller", "contract"])
def test_a_check_of_0_12_reaches_the_dispatchers_cascade_branch(profile: str) -> None:
    """Without cascade attention neither profile took 0.12's
    ``if not use_cascade_attn:`` false branch (cudagraph_dispatcher.py
    168->179): vLLM's own execute_model reaches it, and the caller method's
    signature takes the flag."""
    from dpsim.coverage.measuring import measure
    from dpsim.coverage.targets import scopes_for

    target = load_target("0.12.0", runner="v1")
    measurement = measure(scopes_for(target))
    # 0.12.0 fails examined findings; the step scenario's reach is measured
    # on a property that holds there, so the whole budget runs.
    run_check(
        target,
        CheckOptions(
            profile=profile,
            scenarios=("step",),
            properties=("solo",),
            examples=100,
            shrink=False,
            coverage=measurement,
        ),
    )
    files = {
        file.display: file.to_json()
        for file in measurement.result(target.version).profile(profile)
    }
    dispatcher = next(data for name, data in files.items() if DISPATCHER_012 in name)
    assert list(CASCADE_BRANCH_012) not in [
        list(branch) for branch in dispatcher["missing_branches"]
    ]


#: Two ranks decoding 16 requests each, the second with a common prefix its
#: backend cascades: under FULL_DECODE_ONLY it has no graph to run.
CASCADE_STEP = cascade_step("caller")


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "first"),
    [
        # No synced mode (finding 8): the cascade rank runs eager at 16
        # while the other replays its FULL graph of 16.
        ("0.12.0", "no-hang"),
        # The synced mode makes both ranks eager.
        ("0.13.0", None),
        ("0.17.0", None),
        ("0.29.0", None),
    ],
)
def test_one_cascading_rank_under_full_decode_graphs(
    version: str, first: str | None
) -> None:
    target = load_target(version, runner="v1")
    verdicts = [
        verdict.property
        for verdict in judge(CASCADE_STEP, run_case(target, CASCADE_STEP))
    ]
    assert (verdicts[0] if verdicts else None) == first
    plain = replace(
        CASCADE_STEP,
        steps=((decodes(16), decodes(16)),),
    )
    assert not judge(plain, run_case(target, plain))
