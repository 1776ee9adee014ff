"""The V1 runner's stand-ins and sync routing, without a release."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dpsim.lanes.runner.strict import ModelGap, collect_gaps
from dpsim.lanes.runner.v1.standins import (
    PersistentBatch,
    V1ForwardContexts,
    _trim_unproposed_drafts,
)
from dpsim.lanes.runner.v1.syncs import _inputs, bind, router


def test_the_persistent_batch_refuses_what_it_was_not_written_for() -> None:
    batch = PersistentBatch(vocab_size=8)
    assert batch.num_reqs == 0
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        _ = batch.token_ids_cpu
    assert len(gaps) == 1
    assert gaps[0].startswith("InputBatch.token_ids_cpu read at ")


def _arguments(counts: list[int], **more: Any) -> dict[str, Any]:
    return {
        "num_tokens": sum(counts),
        "num_reqs": len(counts),
        "num_scheduled_tokens_np": np.array(counts, dtype=np.int32),
        "max_num_scheduled_tokens": max(counts),
        "allow_microbatching": True,
        "force_eager": False,
        "force_uniform_decode": None,
        "num_encoder_reqs": 0,
        **more,
    }


def test_caller_arguments_map_to_the_sync_lanes_v1_inputs() -> None:
    decode = _inputs(_arguments([3, 3]), 3, dummy=False)
    assert (decode.kind, decode.uniform_token_count, decode.uniform_decode) == (
        "decode",
        3,
        False,
    )
    mixed = _inputs(_arguments([5, 1]), 3, dummy=False)
    assert (mixed.kind, mixed.uniform_token_count, mixed.max_query_len) == (
        "batch",
        None,
        5,
    )
    dummy = _inputs(
        _arguments([3], force_uniform_decode=True, force_eager=True), 3, dummy=True
    )
    assert (dummy.kind, dummy.uniform_decode, dummy.need_eager) == ("dummy", True, True)


def _sync(
    num_tokens_unpadded: int,
    allow_microbatching: bool,
    parallel_config: Any,
    num_tokens_padded: int | None = None,
    uniform_decode: bool | None = None,
    cudagraph_mode: int = 0,
) -> tuple[bool, torch.Tensor, int]:
    """A stand-in of V1's sync with 0.20+'s signature: every rank agrees 5."""
    return False, torch.tensor([5, 5], dtype=torch.int32), 0


class _Config:
    """A rank's parallel config (hashed by identity, as vLLM's is here)."""

    def __init__(self, rank: int) -> None:
        self.data_parallel_size = 2
        self.data_parallel_rank = rank


def test_a_sync_reaches_the_recorder_of_the_parallel_config_passed() -> None:
    seen: list[Any] = []
    config = _Config(1)
    recorder = SimpleNamespace(coordinate=lambda *a, **k: seen.append(k) or "done")
    bind(config, recorder)  # type: ignore[arg-type]
    routed = router(_sync)
    assert (
        routed(num_tokens_unpadded=3, allow_microbatching=False, parallel_config=config)
        == "done"
    )
    assert seen == [
        {
            "num_tokens_unpadded": 3,
            "allow_microbatching": False,
            "parallel_config": config,
        }
    ]
    stranger = _Config(0)
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        routed(3, False, stranger)
    assert gaps and "parallel_config no rank of the lane owns" in gaps[0]


def test_a_forward_context_without_agreed_counts_coordinates_afresh() -> None:
    calls: list[dict[str, Any]] = []

    def coordinate(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return _sync(**kwargs)

    contexts = V1ForwardContexts(None, coordinate)
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(data_parallel_size=2, data_parallel_rank=0)
    )
    with contexts.set_forward_context(None, config, num_tokens=5):
        context = contexts.current()
    assert context is not None and context.num_tokens_across_dp == (5, 5)
    assert calls == [
        {
            "num_tokens_unpadded": 5,
            "parallel_config": config.parallel_config,
            "allow_microbatching": False,
        }
    ]
    # Given the agreed counts, it does not coordinate again.
    with contexts.set_forward_context(
        None, config, num_tokens=5, num_tokens_across_dp=torch.tensor([5, 2])
    ):
        pass
    assert len(calls) == 1


def test_unproposed_placeholder_drafts_are_taken_out_as_0_12_does() -> None:
    output = SimpleNamespace(
        scheduled_cached_reqs=SimpleNamespace(req_ids=["a", "b", "c"]),
        scheduled_spec_decode_tokens={"a": [-1, -1], "b": [-1, -1]},
        num_scheduled_tokens={"a": 3, "b": 3, "c": 1},
        total_num_scheduled_tokens=7,
    )
    # "b" is not in the persistent batch (re-added this step): kept as is.
    _trim_unproposed_drafts(output, {"a", "c"})
    assert output.num_scheduled_tokens == {"a": 1, "b": 3, "c": 1}
    assert output.total_num_scheduled_tokens == 5
    assert output.scheduled_spec_decode_tokens == {"b": [-1, -1]}
