"""The real V1 EagleProposer per virtual rank (dpsim.lanes.runner.v1.proposer).

Fast tests check the stand-ins for vLLM's triton kernels and the refusals;
release-marked ones run the release's real ``propose`` on a busy rank and
``dummy_run`` on an idle one, with the real ``coordinate_batch_across_dp``
between them, as the V1 model runner calls them.
"""

from __future__ import annotations

import functools
import inspect
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.forward import HIDDEN_SIZE, ForwardContexts
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import ModelGap, collect_gaps
from dpsim.lanes.runner.syncs import DRAFTER_FORWARD_EVENT, Phases
from dpsim.lanes.runner.v1 import proposer
from dpsim.lanes.runner.v1.proposer import build_v1_proposer
from dpsim.lanes.runner.v1.syncs import V1SyncRecorder
from dpsim.records.groups import EP_GROUP
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import SYNC_EVENT, SyncRecord
from dpsim.records.trace import Outcome, RankState, SimResult
from dpsim.sim import simulate
from dpsim.targets.spec import TargetSpec, TreeSpec

#: Releases whose drafter is the base-class layout (llm_base_proposer.py).
RELEASES = ("0.26.0", "0.29.0", "0.33.0")
#: Each layout's boundary releases: 0.12 (``_pad_batch_across_dp``, graph
#: sizes from ``pad_for_cudagraph``) and 0.17 (the drafter's own
#: dispatch-and-sync, its base class inside eagle.py).
OLDER = ("0.12.0", "0.17.0")
BASE_FILE = "v1/spec_decode/llm_base_proposer.py"
#: vLLM 26086's class: ``dummy_run`` running one forward where ``propose``
#: runs k (the loop bound made 1, as before the fix).
ONE_FORWARD_DUMMY = (
    "for fwd_idx in range(\n            1 if only_one_forward_pass else "
    "self.num_speculative_tokens\n        ):",
    "for fwd_idx in range(1):",
)
SIZES = (1, 2, 4, 8, 16, 24, 32)


# -- fast: the kernel stand-ins and the refusals ------------------------------


def test_next_tokens_are_each_requests_last_valid_one_or_its_backup() -> None:
    sampled = torch.tensor([[5, 6, -1], [-1, -1, -1], [7, 8, 9], [1, 2, 3]])
    discard = torch.tensor([False, False, False, True])
    backup = torch.tensor([40, 41, 42, 43], dtype=torch.int32)
    next_ids = torch.zeros(4, dtype=torch.int32)
    counts = torch.zeros(4, dtype=torch.int32)
    kernel = proposer._Kernel("k", proposer._prepare_next_token_padded)
    kernel[(4,)](sampled, discard, backup, next_ids, counts, 100, 3, 4, 3)
    assert next_ids.tolist() == [6, 41, 9, 43]
    assert counts.tolist() == [2, 0, 3, 0]


def test_indices_to_sample_skip_each_requests_rejected_tokens() -> None:
    # Three requests of 3, 3 and 1 tokens: 2, 2 and 0 drafts (cumulative).
    cu_drafts = torch.tensor([2, 4, 4], dtype=torch.int32)
    valid = torch.tensor([3, 1, 1], dtype=torch.int32)
    query_start = torch.tensor([0, 3, 6, 7], dtype=torch.int32)
    indices = torch.zeros(3, dtype=torch.int32)
    rejected = torch.zeros(3, dtype=torch.int32)
    proposer._prepare_inputs_padded(cu_drafts, valid, query_start, indices, rejected, 3)
    assert rejected.tolist() == [0, 2, 0]
    assert indices.tolist() == [2, 3, 6]
    # The 0.21-0.18 form: no rejected counts asked for.
    older = torch.zeros(3, dtype=torch.int32)
    proposer._prepare_inputs_padded(cu_drafts, valid, query_start, older, 3)
    assert older.tolist() == [2, 3, 6]


def test_a_draft_step_past_the_model_length_restarts_at_zero() -> None:
    positions = torch.tensor([3, 9])
    seq_lens = torch.tensor([4, 10], dtype=torch.int32)
    clamped = torch.zeros(2, dtype=torch.int64)
    slots = torch.zeros(2, dtype=torch.int64)
    proposer._step_update(
        positions, torch.zeros(2, 1), seq_lens, 16, 10, clamped, slots
    )
    assert clamped.tolist() == [4, 0]
    assert seq_lens.tolist() == [5, 1]


def test_a_kernel_launched_with_arguments_its_stand_in_does_not_take_is_a_gap() -> None:
    kernel = proposer._Kernel(
        "eagle_prepare_inputs_padded_kernel", proposer._step_update
    )
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        kernel[(1,)](torch.zeros(1), unknown=1)
    assert len(gaps) == 1
    assert gaps[0].startswith(
        "eagle_prepare_inputs_padded_kernel called with arguments its stand-in "
        "does not take"
    )


def test_the_block_size_helper_is_the_next_power_of_two() -> None:
    # triton.next_power_of_2, as eagle.py up to 0.19 sizes its kernels' blocks.
    sizes = [proposer._next_power_of_2(n) for n in (1, 2, 3, 5, 8, 9)]
    assert sizes == [1, 2, 4, 8, 8, 16]


def test_a_sync_from_a_config_no_rank_owns_is_a_gap() -> None:
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        proposer._route_sync(1, parallel_config=types.SimpleNamespace())
    assert gaps and "parallel_config no rank owns" in gaps[0]


def test_no_drafter_is_none_and_unknown_or_mismatched_ones_are_refused() -> None:
    sources: Any = None  # never read on these paths
    kit: Any = None
    policy = _policy(4)
    none = EngineOptions(speculator=None, num_speculative_tokens=0)
    assert build_v1_proposer(sources, none, policy, 0, 2, kit) is None
    with pytest.raises(UsageError, match="the V1 runner has no 'ar' drafter"):
        build_v1_proposer(
            sources,
            EngineOptions(speculator="ar", num_speculative_tokens=3),
            policy,
            0,
            2,
            kit,
        )
    with pytest.raises(UsageError, match=r"decode_query_len \(4\) must be 1 \+"):
        build_v1_proposer(
            sources,
            EngineOptions(speculator="eagle", num_speculative_tokens=2),
            policy,
            0,
            2,
            kit,
        )


def test_a_drafter_that_does_not_coordinate_across_dp_is_refused(
    tmp_path: Path,
) -> None:
    """Before 0.12 the drafter had neither caller of the sync (a file
    written here, not vLLM's): one line naming both."""
    eagle = tmp_path / "eagle.py"
    eagle.write_text("class EagleProposer:\n    def propose(self):\n        pass\n")
    sources: Any = types.SimpleNamespace(file_of=lambda module: None)
    with pytest.raises(TargetError, match="neither _determine_batch_execution_and_"):
        proposer._check_dp_caller(sources, eagle, "0.11.2")
    eagle.write_text("class EagleProposer:\n    def _pad_batch_across_dp(self):\n")
    proposer._check_dp_caller(sources, eagle, "0.12.0")  # no refusal


def test_the_draft_model_returns_a_pair_where_the_real_one_does() -> None:
    contexts = ForwardContexts()
    model = proposer._DraftModel(contexts, 8, extra_inputs=("hidden_states",))
    config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(data_parallel_size=1)
    )
    positions = torch.zeros(2, dtype=torch.int64)
    shapes: list[Any] = []

    def program(rank: int) -> None:
        for pair in (False, True):
            model.returns_tuple = pair
            with contexts.set_forward_context(None, config, num_tokens=2):
                out = model(positions=positions, hidden_states=torch.zeros(2, 4))
            shapes.append([tuple(t.shape) for t in out] if pair else tuple(out.shape))

    assert simulate(program, ranks=1).outcome == Outcome.OK
    assert shapes == [(2, HIDDEN_SIZE), [(2, HIDDEN_SIZE), (2, HIDDEN_SIZE)]]
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        model(positions=positions)  # outside any forward context
    assert len(gaps) == 1 and gaps[0].startswith("model called outside")


# -- release-marked: propose on a busy rank, dummy_run on an idle one ---------


@pytest.mark.release
@pytest.mark.parametrize("version", OLDER)
@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_older_layouts_draft_in_step_too(version: str, kind: str) -> None:
    """0.12's drafter syncs through _pad_batch_across_dp (a count-only
    caller, not recorded as a sync: the drafter picks its graph mode after
    it); 0.17's through its own _determine_batch_execution_and_padding."""
    k = 3
    result, gaps, drafts = _run(_release(version), kind, k)
    assert gaps == []
    assert result.outcome == Outcome.OK
    assert drafts[0] == [3, k]
    syncs = 0 if version == "0.12.0" else 2
    for rank in (0, 1):
        assert _counts(result, rank) == (syncs, k, k)


@pytest.mark.release
def test_an_idle_drafter_without_graphs_forwards_at_another_count_on_0_12() -> None:
    """30119's mechanism: 0.12's runner turns an idle rank's drafter graphs
    off under a FULL dummy run (dummy_run(use_cudagraphs=False)); 0.12's
    drafter then forwards eagerly at the agreed count (12) while the busy
    rank pads to its graph (16): the first drafter forward's collectives
    mismatch. 0.17's drafter syncs its graph mode too: both run eager."""
    broken, gaps, _ = _run(_release("0.12.0"), "eagle", 3, idle_cudagraphs=False)
    assert gaps == []
    assert broken.outcome in (Outcome.HANG, Outcome.MISMATCH)
    assert _counts(broken, 0)[1] == _counts(broken, 1)[1] == 1
    held, gaps, _ = _run(_release("0.17.0"), "eagle", 3, idle_cudagraphs=False)
    assert gaps == []
    assert held.outcome == Outcome.OK
    assert {s.descriptor.cg_mode.value for s in _syncs(held, 0)} == {"NONE"}


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_a_busy_ranks_propose_and_an_idle_ranks_dummy_run_draft_in_step(
    version: str, kind: str
) -> None:
    """k forwards on both ranks (1 first pass + k - 1 loop steps; dummy_run's
    k forwards, fixed since 26086), each with its EP collectives, and two
    drafter syncs each that agree."""
    k = 3
    result, gaps, drafts = _run(_release(version), kind, k)
    assert gaps == []
    assert result.outcome == Outcome.OK
    assert drafts[0] == [3, k]
    for rank in (0, 1):
        assert _counts(result, rank) == (2, k, k)
    busy, idle = (_syncs(result, rank) for rank in (0, 1))
    assert [s.phase for s in busy] == [s.phase for s in idle]
    assert [s.phase.split()[-1] for s in busy] == ["prefill", "decode"]
    assert [s.agreement for s in busy] == [s.agreement for s in idle]
    assert all(s.agreement is not None for s in busy)
    # The loop's sync agrees the busy rank's request count, padded.
    assert busy[1].inputs.num_tokens == 3
    assert idle[1].inputs.num_tokens == 1


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_one_draft_token_runs_the_first_pass_alone(version: str) -> None:
    result, gaps, drafts = _run(_release(version), "eagle", 1)
    assert gaps == []
    assert result.outcome == Outcome.OK
    assert drafts[0] == [3, 1]
    assert _counts(result, 0) == _counts(result, 1) == (1, 1, 1)


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_a_one_forward_dummy_run_leaves_the_busy_rank_waiting(
    version: str, tmp_path: Path
) -> None:
    """26086 planted back: the idle rank's dummy_run runs one forward while
    the busy rank's propose runs k, so the busy rank waits in a forward's
    collectives (or its loop's sync) the idle rank never joins."""
    sources = _planted(version, tmp_path, *ONE_FORWARD_DUMMY)
    result, gaps, _ = _run(sources, "eagle", 3)
    assert gaps == []
    assert result.outcome in (Outcome.HANG, Outcome.MISMATCH)
    assert result.ranks[0].state == RankState.WAITING
    assert _counts(result, 1)[1] == 1


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.33.0"])
def test_an_attribute_the_lane_never_set_is_a_gap(version: str, tmp_path: Path) -> None:
    marker = "        batch_size = common_attn_metadata.batch_size()\n"
    sources = _planted(
        version, tmp_path, marker, marker + "        _ = self.draft_schedule\n"
    )
    result, gaps, _ = _run(sources, "eagle", 2)
    assert len(gaps) == 1
    assert gaps[0].startswith(f"EagleProposer.draft_schedule read at {BASE_FILE}:")
    assert gaps[0].endswith(" in propose")
    assert result.outcome == Outcome.CRASH


@pytest.mark.release
@pytest.mark.parametrize("version", (*RELEASES, "0.19.1"))
def test_the_runners_prepare_calls_run_the_real_helpers(version: str) -> None:
    """prepare_next_token_ids_padded and prepare_inputs_padded, as the V1
    runner calls them before propose: the next tokens are each request's
    last accepted one, the indices to sample skip the rejected drafts."""
    sources = _release(version)
    options = EngineOptions(speculator="eagle", num_speculative_tokens=2)
    drafter = build_v1_proposer(sources, options, _policy(3), 0, 1, _kit(sources, 0, 1))
    requests = {
        name: types.SimpleNamespace(get_token_id=lambda i, base=base: base + i)
        for name, base in (("a", 100), ("b", 200))
    }
    batch = types.SimpleNamespace(
        num_reqs=2,
        req_ids=["a", "b"],
        num_tokens_no_spec=np.array([5, 7]),
        vocab_size=1000,
    )
    sampled = torch.tensor([[11, 12, -1], [-1, -1, -1]], dtype=torch.int32)
    next_ids, valid = drafter.prepare_next_token_ids_padded(
        sampled, requests, batch, torch.tensor([False, False])
    )
    assert next_ids.tolist() == [12, 206]
    assert valid.tolist() == [2, 0]
    metadata = _metadata(sources, 2, 3)
    spec = types.SimpleNamespace(cu_num_draft_tokens=torch.tensor([2, 4]))
    _, indices, rejected = drafter.prepare_inputs_padded(metadata, spec, valid)
    assert rejected.tolist() == [1, 3]
    assert indices.tolist() == [1, 2]


# -- helpers -----------------------------------------------------------------


@functools.cache
def _release(version: str) -> RunnerSources:
    return RunnerSources.for_release(version, "v1")


def _planted(version: str, tmp_path: Path, old: str, new: str) -> RunnerSources:
    """The release as a tree, ``old`` replaced by ``new`` once in the base file."""
    package = tmp_path / "vllm"
    shutil.copytree(_release(version).package_dir, package)
    path = package / BASE_FILE
    text = path.read_text()
    assert text.count(old) == 1, f"{BASE_FILE} no longer has {old!r} once"
    path.write_text(text.replace(old, new))
    return RunnerSources.for_spec(TargetSpec(TreeSpec(package), runner="v1"))


def _policy(decode_query_len: int) -> CapturePolicy:
    return CapturePolicy(
        capture_sizes=SIZES, decode_query_len=decode_query_len, max_num_seqs=8
    )


def _kit(sources: RunnerSources, rank: int, dp_size: int) -> Any:
    """A rank kit as the V1 model runner's gives the drafter: the rank's own
    parallel config, forward contexts and sync recorder (the release's real
    sync, a phase counter, the sync lane's V1 API)."""
    target = sources.target
    return types.SimpleNamespace(
        parallel_config=target.parallel_config(dp_size, rank, None),
        forward_contexts=ForwardContexts(),
        recorder=V1SyncRecorder(
            target.api, target.dp_utils.coordinate_batch_across_dp, Phases()
        ),
    )


def _metadata(sources: RunnerSources, num_reqs: int, per_request: int) -> Any:
    """The release's CommonAttentionMetadata of a uniform decode batch."""
    return proposer.common_attn_metadata(
        sources,
        np.full(num_reqs, per_request, dtype=np.int32),
        np.full(num_reqs, 20, dtype=np.int32),
    )


def _run(
    sources: RunnerSources, kind: str, k: int, *, idle_cudagraphs: bool = True
) -> tuple[SimResult, list[str], list[Any]]:
    """Rank 0 proposes for a decode batch of 3 requests (1 + k tokens each),
    rank 1 is idle and runs the drafter's dummy_run(1, use_cudagraphs=...),
    as the V1 runner's _dummy_run does; each rank's drafter is built as the
    runner builds it."""
    options = EngineOptions(speculator=kind, num_speculative_tokens=k)
    kits = [_kit(sources, rank, 2) for rank in range(2)]
    drafters = [
        build_v1_proposer(sources, options, _policy(1 + k), rank, 2, kits[rank])
        for rank in range(2)
    ]
    drafts: list[Any] = [None, None]

    def program(rank: int) -> None:
        drafter = drafters[rank]
        if rank == 1:
            drafter.dummy_run(1, use_cudagraphs=idle_cudagraphs)
            return
        metadata = _metadata(sources, 3, 1 + k)
        tokens = metadata.num_actual_tokens
        parameters = inspect.signature(drafter.propose).parameters
        extra: dict[str, Any] = {
            # 0.12-0.16 name the sample indices last_token_indices.
            "token_indices_to_sample"
            if "token_indices_to_sample" in parameters
            else "last_token_indices": None
        }
        if "num_speculative_tokens" in parameters:
            extra["num_speculative_tokens"] = k
        out = drafter.propose(
            **extra,
            target_token_ids=torch.zeros(tokens, dtype=torch.int32),
            target_positions=torch.arange(tokens),
            target_hidden_states=torch.zeros(tokens, HIDDEN_SIZE),
            next_token_ids=torch.zeros(3, dtype=torch.int32),
            common_attn_metadata=metadata,
            sampling_metadata=types.SimpleNamespace(all_greedy=True),
        )
        drafts[0] = list(out.shape)

    with collect_gaps() as gaps:
        result = simulate(program, ranks=2)
    return result, gaps, drafts


def _counts(result: SimResult, rank: int) -> tuple[int, int, int]:
    """A rank's syncs, drafter forwards and EP collectives."""
    trace = result.ranks[rank]
    kinds = [event.kind for event in trace.events]
    ep = sum(1 for record in trace.collectives if record.group == EP_GROUP)
    return kinds.count(SYNC_EVENT), kinds.count(DRAFTER_FORWARD_EVENT), ep


def _syncs(result: SimResult, rank: int) -> list[SyncRecord]:
    return [
        SyncRecord.from_json(event.payload)
        for event in result.ranks[rank].events
        if event.kind == SYNC_EVENT
    ]
