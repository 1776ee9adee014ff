"""Cascade attention in the V1 contract profile: drawn on any rank's batch
where the caller method takes ``use_cascade_attn`` (0.12-0.33), and judged
as changing nothing where the method keeps the parameter but never reads it
(0.32-0.33)."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from v1cascade import (
    POLICY,
    Mode,
    api_taking,
    cascade_step,
    decodes,
)

from dpsim.properties import judge
from dpsim.properties.base import Evidence
from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode
from dpsim.scenarios import run_case
from dpsim.scenarios.expect_v1 import v1_choices
from dpsim.scenarios.generate_v1 import V1CallerModel, contract_batches
from dpsim.targets import load_target
from dpsim.targets.v1.api import V1API
from dpsim.targets.v1.caller import extract
from dpsim.targets.v1.modelled import PARAMETERS as MODELLED_PARAMETERS

TAKES = V1CallerModel(
    dummy_of_decode_length=True, lora_counts=True, takes_cascade_attn=True
)


@st.composite
def contract_steps(
    draw: st.DrawFn, model: V1CallerModel = TAKES, scenario: str = "step"
) -> list[RankBatch]:
    return contract_batches(model, POLICY, scenario)(draw, 4)


@settings(max_examples=60, deadline=None)
@given(step=contract_steps(replace(TAKES, takes_cascade_attn=False)))
def test_no_cascade_where_the_caller_method_takes_none(step: list[RankBatch]) -> None:
    # 0.11's modelled caller: a case carrying the flag would be refused.
    assert not any(batch.cascade_attn for batch in step)


#: Found, not shrunk: the first seeded draw meeting the condition shows the
#: contract draws it. No example database: a result depends on the seed alone.
REACH = settings(max_examples=2000, database=None, phases=(Phase.generate,))


def _found(predicate: Any, scenario: str = "step") -> list[RankBatch]:
    return find(
        contract_steps(TAKES, scenario), predicate, settings=REACH, random=Random(0)
    )


@pytest.mark.parametrize(
    "which",
    [
        # What the caller profile never draws it on: the signature allows
        # it on any batch.
        lambda batch: batch.kind == "idle",
        lambda batch: batch.need_eager,
        lambda batch: batch.num_reqs < 8,
        lambda batch: batch.allow_ubatching and batch.num_tokens > 0,
        lambda batch: batch.uniform_decode,
    ],
)
def test_the_contract_draws_cascade_on_any_batch(which: Any) -> None:
    step = _found(lambda step: any(b.cascade_attn and which(b) for b in step))
    assert any(batch.cascade_attn for batch in step)


def test_the_contract_draws_cascade_on_the_profile_scenario_too() -> None:
    step = _found(lambda step: any(b.cascade_attn for b in step), "profile")
    assert all(batch.need_eager for batch in step)


def test_ranks_with_the_same_batch_may_differ_in_cascade() -> None:
    step = _found(
        lambda step: (
            replace(step[0], cascade_attn=False) == replace(step[1], cascade_attn=False)
            and step[0].cascade_attn != step[1].cascade_attn
        )
    )
    assert step[0].cascade_attn != step[1].cascade_attn


def test_some_steps_keep_every_rank_free_of_cascade() -> None:
    """One cascading rank rules FULL out for every rank: half the steps draw
    none, so the contract's FULL paths stay within reach at many ranks."""

    @st.composite
    def wide(draw: st.DrawFn) -> list[RankBatch]:
        return contract_batches(TAKES, POLICY, "step")(draw, 16)

    step = find(
        wide(),
        lambda step: not any(b.cascade_attn for b in step) and step[0].num_tokens,
        settings=settings(REACH, max_examples=200),
        random=Random(0),
    )
    assert not any(batch.cascade_attn for batch in step)


# -- which parameters the caller method reads ---------------------------------

RUNNER_SOURCE = """
class GPUModelRunner:
    def _determine_batch_execution_and_padding(
        self, num_tokens, use_cascade_attn=False, force_eager=False
    ):
        {body}
"""


def _caller_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gpu_model_runner.py"
    path.write_text(textwrap.dedent(RUNNER_SOURCE).format(body=body))
    ast.parse(path.read_text())
    return path


@pytest.mark.parametrize(
    ("body", "ignored"),
    [
        # 0.32: "Deprecated and ignored. Kept for out-of-tree model runners."
        ("return force_eager, num_tokens", ("use_cascade_attn",)),
        # 0.12 reads it inside a lambda, 0.13+ in an expression.
        (
            "f = lambda n: (n, use_cascade_attn)\n        return f(num_tokens), force_eager",
            (),
        ),
        (
            "return num_tokens, use_cascade_attn or force_eager",
            (),
        ),
    ],
)
def test_a_parameter_the_method_never_reads_is_ignored(
    tmp_path: Path, body: str, ignored: tuple[str, ...]
) -> None:
    caller = extract(_caller_file(tmp_path, body), None, {})
    assert caller.parameters == ("num_tokens", "use_cascade_attn", "force_eager")
    assert caller.ignored == ignored


def test_an_ignored_cascade_flag_is_taken_but_not_read() -> None:
    parameters = (*MODELLED_PARAMETERS, "use_cascade_attn")
    kept = api_taking(parameters, ignored=("use_cascade_attn",))
    # Passed on as the signature allows (vLLM ignores it), not refused.
    assert kept.has("cascade_attn") and not kept.reads("cascade_attn")
    assert kept.unsupported_input(decodes(8, cascade_attn=True)) is None
    read = api_taking(parameters)
    assert read.has("cascade_attn") and read.reads("cascade_attn")
    assert not api_taking(MODELLED_PARAMETERS).reads("cascade_attn")


# -- the oracle ---------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    num_tokens: int


class Dispatcher:
    """A 0.17+-style dispatcher: FULL for uniform decodes unless left out,
    PIECEWISE otherwise, sizes 8 and 16."""

    cudagraph_mode = Mode.FULL
    sizes = (8, 16)

    def dispatch(
        self,
        num_tokens: int,
        uniform_decode: bool,
        has_lora: bool,
        invalid_modes: set[Mode] | None = None,
    ) -> tuple[Mode, Key]:
        padded = next((size for size in self.sizes if size >= num_tokens), None)
        if padded is None:
            return Mode.NONE, Key(num_tokens)
        if uniform_decode and Mode.FULL not in (invalid_modes or set()):
            return Mode.FULL, Key(padded)
        return Mode.PIECEWISE, Key(padded)


def test_the_oracle_ignores_a_flag_the_caller_method_never_reads() -> None:
    one = [decodes(9), decodes(12, cascade_attn=True)]
    read = v1_choices(Dispatcher(), one, None, 1)
    assert read is not None
    assert {c.cg_mode for c in read} == {CudagraphMode.PIECEWISE}
    ignored = v1_choices(Dispatcher(), one, None, 1, cascade_read=False)
    plain = v1_choices(Dispatcher(), [decodes(9), decodes(12)], None, 1)
    assert ignored == plain
    assert plain is not None and {c.cg_mode for c in plain} == {CudagraphMode.FULL}


# -- real releases ------------------------------------------------------------

#: Two ranks decoding 16 requests each, the second passing
#: ``use_cascade_attn=True`` (a call only the contract makes from 0.32).
CASCADE_STEP = cascade_step("contract")


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "reads", "mode"),
    [
        # FULL left out on the cascading rank, and FULL_DECODE_ONLY has no
        # PIECEWISE graphs: the least mode is eager on both ranks.
        ("0.17.0", True, CudagraphMode.NONE),
        ("0.29.0", True, CudagraphMode.NONE),
        ("0.32.0", False, CudagraphMode.FULL),
        ("0.33.0", False, CudagraphMode.FULL),
    ],
)
def test_the_flag_is_read_up_to_0_31_and_ignored_from_0_32(
    version: str, reads: bool, mode: CudagraphMode
) -> None:
    """0.32 keeps ``use_cascade_attn`` in the signature and replays FULL
    anyway. An oracle leaving FULL out there expects eager where vLLM rightly
    replays FULL, and then cannot see a rank fall to eager (``graph-choice``
    judges only choices below the oracle's)."""
    target = load_target(version, runner="v1")
    assert target.api.has("cascade_attn")
    assert isinstance(target.api, V1API)
    assert target.api.reads("cascade_attn") is reads
    result = run_case(target, CASCADE_STEP)
    evidence = Evidence(CASCADE_STEP, result)
    expected = [choice.cg_mode for choice in evidence.expected["step 0"]]
    ran = [descriptor.cg_mode for descriptor in evidence.complete_phases[0].descriptors]
    assert expected == ran == [mode, mode]
    assert not judge(CASCADE_STEP, result)
