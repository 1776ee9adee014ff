"""dpsim.report: a counterexample's table says a rank's encoder requests and an
encoder-decoder policy, and only when there are some."""

from __future__ import annotations

from dataclasses import replace

from dpsim.records.case import RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.report import _inputs_cell, describe_policy

PREFILL = RankBatch(num_reqs=2, num_tokens=40, kind="prefill")


def test_the_passed_in_cell_shows_encoder_requests_when_there_are_some() -> None:
    assert _inputs_cell(PREFILL) == "prefill 2r/40t"
    assert _inputs_cell(replace(PREFILL, num_encoder_reqs=2)) == "prefill 2r/40t enc=2"


def test_the_policy_line_says_an_encoder_decoder_model() -> None:
    policy = CapturePolicy(capture_sizes=(1, 2))
    assert "encoder-decoder" not in describe_policy(policy)
    assert describe_policy(replace(policy, encoder_decoder=True)).endswith(
        ", encoder-decoder model"
    )
