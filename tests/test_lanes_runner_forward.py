"""The runner lane's stood-in forwards: EP collectives at the chosen shape,
the per-rank forward context, and gaps for what they were not written for."""

from __future__ import annotations

import enum
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dpsim.lanes.runner.forward import (
    HIDDEN_SIZE,
    FakeModel,
    ForwardContexts,
    full_descriptors,
    install_graphs,
)
from dpsim.lanes.runner.strict import ModelGap, collect_gaps
from dpsim.records.groups import EP_GROUP
from dpsim.records.trace import Outcome
from dpsim.sim import simulate


class Mode(enum.Enum):
    """Stands for a release's CUDAGraphMode: only the member names matter."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2


def _config(dp_size: int, rank: int) -> Any:
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            data_parallel_size=dp_size, data_parallel_rank=rank
        )
    )


def _eager_forward(contexts: ForwardContexts, counts: list[int], mode: Mode) -> Any:
    def program(rank: int) -> list[int]:
        model = FakeModel(contexts, vocab_size=3)
        num_tokens = counts[rank]
        with contexts.set_forward_context(
            None,
            _config(len(counts), rank),
            num_tokens=num_tokens,
            num_tokens_across_dp=torch.tensor(counts, dtype=torch.int32),
            cudagraph_runtime_mode=mode,
        ):
            hidden = model(positions=torch.zeros(num_tokens, dtype=torch.int64))
        return list(hidden.shape)

    return simulate(program, ranks=len(counts))


def _ep(result: Any, rank: int) -> list[tuple[str, Any]]:
    return [
        (c.signature.kind, c.signature.shape)
        for c in result.ranks[rank].collectives
        if c.group == EP_GROUP
    ]


def test_eager_forwards_of_different_sizes_exchange_their_counts() -> None:
    result = _eager_forward(ForwardContexts(), [3, 5], Mode.NONE)
    assert result.outcome == Outcome.OK
    assert result.returns() == [[3, HIDDEN_SIZE], [5, HIDDEN_SIZE]]
    assert _ep(result, 0) == _ep(result, 1)
    assert len(_ep(result, 0)) == 1


def test_piecewise_forwards_of_different_sizes_mismatch() -> None:
    result = _eager_forward(ForwardContexts(), [3, 5], Mode.PIECEWISE)
    assert result.outcome == Outcome.MISMATCH


def test_the_release_dp_metadata_check_runs_with_the_rank_and_its_count() -> None:
    seen: list[tuple[int, int, list[int]]] = []

    def make(parallel_config: Any, num_tokens: int, across: torch.Tensor) -> None:
        seen.append((parallel_config.data_parallel_rank, num_tokens, across.tolist()))

    result = _eager_forward(ForwardContexts(make), [2, 4], Mode.NONE)
    assert result.outcome == Outcome.OK
    assert seen == [(0, 2, [2, 4]), (1, 4, [2, 4])]


def test_the_forward_context_belongs_to_one_virtual_rank() -> None:
    # Rank 0 enters a context and waits in a collective; rank 1, which never
    # entered one, must not see rank 0's (vLLM's context is per process).
    contexts = ForwardContexts()
    seen: dict[int, Any] = {}

    def program(rank: int) -> None:
        from dpsim.scenarios.ranks import program_world

        world = program_world()
        if rank == 0:
            with contexts.set_forward_context(
                None, _config(1, 0), num_tokens=4, cudagraph_runtime_mode=Mode.FULL
            ):
                world.dist.barrier(group=world.group(EP_GROUP))
                seen[rank] = contexts.current()
        else:
            seen[rank] = contexts.current()
            world.dist.barrier(group=world.group(EP_GROUP))

    assert simulate(program, ranks=2).outcome == Outcome.OK
    assert seen[1] is None
    assert seen[0].num_tokens == 4 and seen[0].mode == "FULL"


def test_a_model_called_outside_a_forward_context_is_a_gap() -> None:
    model = FakeModel(ForwardContexts(), vocab_size=3)
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        model(positions=torch.zeros(2))
    assert gaps and "outside set_forward_context" in gaps[0]


def test_a_model_input_it_was_not_written_for_is_a_gap() -> None:
    model = FakeModel(ForwardContexts(), vocab_size=3, extra_inputs={"hidden_states"})
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        model(positions=torch.zeros(2), token_type_ids=torch.zeros(2))
    assert gaps and "token_type_ids" in gaps[0]


def test_dp_without_agreed_counts_is_a_gap_not_a_guess() -> None:
    contexts = ForwardContexts()
    entered = contexts.set_forward_context(None, _config(2, 0), num_tokens=4)
    with collect_gaps() as gaps, pytest.raises(ModelGap), entered:
        pass
    assert gaps and "num_tokens_across_dp" in gaps[0]


def test_an_unknown_model_attribute_is_a_gap_and_an_absent_one_is_not() -> None:
    model = FakeModel(ForwardContexts(), vocab_size=3)
    assert getattr(model, "get_mtp_target_hidden_states", None) is None
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        model.get_input_embeddings  # noqa: B018
    assert gaps == ["model.get_input_embeddings read at (no vLLM frame on the stack)"]
    assert model.compute_logits(torch.zeros(2, HIDDEN_SIZE)).shape == (2, 3)


def _descriptor(mode: Mode, num_tokens: int) -> Any:
    # Frozen and hashable, as vLLM's BatchExecutionDescriptor; no num_ubatches
    # field, as before 0.30.
    from dataclasses import make_dataclass

    cls = make_dataclass("Desc", ["cg_mode", "num_tokens"], frozen=True)
    return cls(mode, num_tokens)


def test_installed_graphs_replay_at_their_descriptors_shape() -> None:
    full_4, full_8 = _descriptor(Mode.FULL, 4), _descriptor(Mode.FULL, 8)
    piecewise = _descriptor(Mode.PIECEWISE, 8)
    manager = SimpleNamespace(
        _candidates={(4, 0): [full_4], (8, 0): [full_8, piecewise]}, graphs={}
    )
    forwards: list[int] = []
    install_graphs(manager, on_forward=forwards.append)
    assert full_descriptors(manager) == [full_4, full_8]
    assert set(manager.graphs) == {full_4, full_8}
    assert manager.hidden_states.shape == (8, HIDDEN_SIZE)

    def program(rank: int) -> None:
        manager.graphs[full_8].replay()

    result = simulate(program, ranks=2)
    assert result.outcome == Outcome.OK
    assert _ep(result, 0) == [("all_reduce", (8,))]
    assert forwards == [8, 8]
