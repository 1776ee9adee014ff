"""A version's descriptor and agreement as dpsim's plain values."""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from standin_sync import sync_api

from dpsim.records.case import SyncInputs
from dpsim.records.policy import CudagraphMode
from dpsim.targets.adapters import agreement_of, describe


class _Mode(enum.Enum):
    NONE = 0
    FULL = 2
    SIDEWAYS = 7


@dataclass
class _OldDescriptor:
    """0.18-0.27 can hand back 0-d tensors where ints are meant."""

    cg_mode: _Mode
    num_tokens: Any
    num_reqs: Any
    uniform_token_count: Any = None


@dataclass
class _State:
    num_tokens_across_dp: torch.Tensor
    uniform_token_count: Any
    eager: Any


def test_counts_read_as_ints_whatever_the_release_hands_back() -> None:
    described = describe(
        _OldDescriptor(_Mode.FULL, torch.tensor(8), torch.tensor(3), torch.tensor(1))
    )
    assert (described.cg_mode, described.num_tokens, described.num_reqs) == (
        CudagraphMode.FULL,
        8,
        3,
    )
    assert described.uniform_token_count == 1
    assert described.num_active_loras == 0 and described.num_ubatches == 1
    assert {type(value) for value in described.__dict__.values()} <= {
        CudagraphMode,
        int,
        type(None),
    }
    for counts, written in (
        (torch.tensor([4, 4]), "[4, 4]"),
        (torch.tensor([True, True]), "[1, 1]"),
    ):
        agreed = agreement_of(_State(counts, torch.tensor(1), torch.tensor(False)))
        assert agreed is not None
        # JSON tells a bool from an int: counts must be ints, never bools.
        assert json.dumps(agreed.to_json()["num_tokens_across_dp"]) == written
        assert agreed.uniform_token_count == 1 and agreed.eager is False


def test_a_mode_dpsim_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="SIDEWAYS"):
        describe(_OldDescriptor(_Mode.SIDEWAYS, 1, 1))


@pytest.mark.parametrize(
    ("counts", "shape"),
    [(torch.tensor([[4], [4]]), "(2, 1)"), (torch.tensor(4), "()")],
    ids=["a table", "one value"],
)
def test_counts_that_are_not_one_row_are_refused_by_name(
    counts: torch.Tensor, shape: str
) -> None:
    with pytest.raises(
        TypeError,
        match=rf"^the agreed counts are not one row of per-rank counts: shape {re.escape(shape)}$",
    ):
        agreement_of(counts)


def test_an_input_this_sync_cannot_take_is_refused_by_name() -> None:
    def sync(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a refused input must not reach the sync")

    api = sync_api(
        (
            "cudagraph_manager",
            "num_reqs",
            "num_tokens",
            "uniform_token_count",
            "dp_size",
            "dp_rank",
        ),
        sync,
    )
    assert api.unsupported_input(SyncInputs(1, 1)) is None
    assert api.unsupported_input(SyncInputs(1, 1, cascade_attn=True)) == "cascade_attn"
    refused = SyncInputs(1, 1, max_query_len=1, cascade_attn=True)
    assert api.unsupported_input(refused) == "max_query_len"
    with pytest.raises(ValueError, match="takes no max_query_len"):
        api.call(None, refused, 2, 0)
