"""The rebuilt GPUModelRunner: its stand-ins alone (fast), then on releases:
refusals, dummy-run shapes, FULL graphs, a speculator, and line coverage."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from test_lanes_runner_worker import OPTIONS, PIECEWISE, RELEASES, Steps, _busy

from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.case import RunnerCase
from dpsim.lanes.runner.model_runner import (
    AsyncOutput,
    RequestStates,
    _RunnerStandIns,
    _RunnerStandInsBefore028,
    _Sampler,
    draft_tokens_handler,
    runner_kit,
)
from dpsim.lanes.runner.run import _real_sync, run_runner_case
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.speculators import build_speculator
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import ModelGap, collect_gaps, instance, standin
from dpsim.lanes.runner.syncs import DRAFTER_FORWARD_EVENT, Phases, recording_sync
from dpsim.lanes.runner.where import LineCoverage
from dpsim.lanes.runner.worker import build_worker, real_classes
from dpsim.properties import RUNNER_LANE_PROPERTIES, judge
from dpsim.records.groups import DP_CPU_GROUP, EP_GROUP
from dpsim.records.policy import (
    CapturePolicy,
    CudagraphMode,
    Microbatching,
    vllm_default_sizes,
)
from dpsim.records.sync import SYNC_EVENT
from dpsim.records.trace import Outcome, SimResult
from dpsim.sim import simulate

# -- the stand-ins alone ------------------------------------------------------------


def test_request_states_hand_out_the_lowest_free_slot() -> None:
    states = RequestStates(max_num_reqs=3, num_speculative_steps=0)
    states.add_request("a", 4, [1] * 4, 0)
    states.add_request("b", 2, [1] * 2, 1)
    assert states.remove_request("a") == 0
    states.add_request("c", 1, [1], 0)
    assert states.req_id_to_index == {"b": 1, "c": 0}
    assert states.prefill_len.np.tolist() == [1, 2, 0]
    assert states.num_computed_prefill_tokens.tolist() == [0, 1, 0]
    assert states.remove_request("gone") is None


def test_request_states_refuse_what_they_do_not_model() -> None:
    states = RequestStates(max_num_reqs=2, num_speculative_steps=0)
    with collect_gaps() as gaps:
        with pytest.raises(ModelGap):
            states.add_request("a", 1, [1], 0, mm_features=[])
        with pytest.raises(ModelGap):
            states.staged_writes  # noqa: B018
    assert gaps[0] == "RequestState.add_request with ['mm_features'] (not modelled)"
    assert gaps[1].startswith("RequestState.staged_writes read at")


def test_the_sampler_samples_one_token_per_request_and_knows_nothing_else() -> None:
    sampler = _Sampler(max_num_reqs=4)
    out = sampler(torch.zeros(3, 8), standin("InputBatch", num_reqs=3))
    assert out.sampled_token_ids.shape == (3, 1)
    assert out.num_sampled.tolist() == [1, 1, 1]
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        sampler.logprobs_mode  # noqa: B018
    assert len(gaps) == 1


def test_an_async_output_is_ready_with_each_requests_sampled_tokens() -> None:
    output = standin("ModelRunnerOutput", sampled_token_ids=None)
    sampled = standin("SamplerOutput", sampled_token_ids=torch.tensor([[5, 6], [7, 8]]))
    ready = AsyncOutput(output, sampled, torch.tensor([2, 1]))
    assert ready.get_output() is output
    assert output.sampled_token_ids == [[5, 6], [7]]


def _batch(*req_ids: str) -> Any:
    return standin(
        "InputBatch", req_ids=list(req_ids), has_structured_output_reqs=False
    )


@pytest.mark.release
def test_through_033_the_handler_hands_the_last_batchs_draft_widths() -> None:
    """0.33's real DraftTokensHandler, without structured outputs: -1
    placeholders of the last sampling step's width, for that step's requests."""
    handler = draft_tokens_handler(runner_kit(*_sources_and_target("0.33.0")))
    handler.set_draft_tokens(_batch("a", "b"), torch.tensor([[3, 4], [5, 6]]))
    handler.set_draft_tokens(_batch("b"), torch.tensor([[7]]))
    handed = handler.get_draft_tokens()
    assert (handed.req_ids, handed.draft_token_ids) == (["b"], [[-1]])


@pytest.mark.release
def test_from_034_the_handler_keeps_each_live_requests_latest_drafts() -> None:
    """0.34's: every live request's latest width, a request not in the last
    batch included, until the runner removes it (``discard``)."""
    handler = draft_tokens_handler(runner_kit(*_sources_and_target("0.34.0")))
    handler.begin_step(
        standin("SchedulerOutput", pending_structured_output_tokens=False)
    )
    handler.set_draft_tokens(_batch("a", "b"), torch.tensor([[3, 4], [5, 6]]))
    handler.set_draft_tokens(_batch("b"), torch.tensor([[7]]))
    handed = handler.get_draft_tokens()
    assert (handed.req_ids, handed.draft_token_ids) == (["a", "b"], [[-1, -1], [-1]])
    handler.discard("a")
    assert handler.get_draft_tokens().req_ids == ["b"]


def _sources_and_target(version: str) -> tuple[RunnerSources, Any]:
    sources = RunnerSources.for_release(version)
    return sources, sources.target


def test_a_dummy_run_with_lora_is_a_gap() -> None:
    runner = _RunnerStandIns()
    entered = runner.maybe_dummy_run_with_lora(object())
    with collect_gaps() as gaps, pytest.raises(ModelGap), entered:
        pass
    assert gaps == ["maybe_dummy_run_with_lora with a LoRA config (not modelled)"]


def test_a_step_with_fewer_tokens_than_logits_rows_is_a_gap() -> None:
    """1 token scheduled with 2 drafts: vLLM's scheduler never does this, so
    the stood-in prepare_inputs refuses rather than build logits indices
    before the request's first row (sample then read index -2)."""
    output = standin("SchedulerOutput", scheduled_spec_decode_tokens={"a": [-1, -1]})
    state = standin(
        "BatchReqState",
        num_tokens=1,
        req_ids=["a"],
        num_scheduled_tokens=np.array([1], dtype=np.int32),
    )
    desc = standin("BatchExecutionDescriptor", num_tokens=1, num_reqs=None)
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        _RunnerStandIns().prepare_inputs(output, state, desc)
    assert gaps == [
        "GPUModelRunner.prepare_inputs: request a has fewer tokens scheduled "
        "than drafts + 1 (the modelled scheduler disagrees with vLLM's)"
    ]


def test_before_0_28_prepare_inputs_gathers_in_the_releases_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner without gather_batch_req_state (0.26-0.27): the stood-in
    prepare_inputs(scheduler_output, batch_desc) gathers the request state in
    the order the release's own sort gives (here a hand-written one), and
    the gathered state answers only its fields (a later release's is absent;
    anything else is a gap)."""
    seen: list[Any] = []
    monkeypatch.setattr(
        _RunnerStandIns,
        "prepare_inputs",
        lambda self, output, state, desc: seen.append(state),
    )
    runner_class = type(
        "GPUModelRunner",
        (_RunnerStandInsBefore028,),
        {"_dpsim_sort_batch_req_ids": staticmethod(lambda n, q: sorted(n, key=n.get))},
    )
    states = RequestStates(max_num_reqs=3, num_speculative_steps=0)
    states.add_request("long", 5, [1] * 5, 0)
    states.add_request("short", 2, [1] * 2, 2)
    runner = instance(runner_class, req_states=states, decode_query_len=1)
    output = standin(
        "SchedulerOutput",
        num_scheduled_tokens={"long": 5, "short": 1},
        total_num_scheduled_tokens=6,
    )
    runner.prepare_inputs(output, standin("BatchExecutionDescriptor"))
    (state,) = seen
    assert state.req_ids == ["short", "long"]
    assert state.num_scheduled_tokens.tolist() == [1, 5]
    assert state.idx_mapping_np.tolist() == [1, 0]
    assert state.is_prefilling_np.tolist() == [False, True]
    assert (state.num_tokens, state.has_prefill) == (6, True)
    assert not hasattr(state, "decode_graph_eligible")
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        state.max_query_len  # noqa: B018
    assert gaps[0].startswith("gathered request state.max_query_len read at")


# -- on releases ----------------------------------------------------------------


def _sync(sources: RunnerSources) -> Any:
    target = sources.target
    return recording_sync(target, _real_sync(target), Phases())


@pytest.mark.release
@pytest.mark.parametrize(
    ("policy", "options", "refusal"),
    [
        (
            CapturePolicy(capture_sizes=(1, 2), max_num_seqs=8, decode_query_len=2),
            OPTIONS,
            (
                UsageError,
                "the capture policy's decode_query_len (2) is not the engine's (1)",
            ),
        ),
        (
            CapturePolicy(capture_sizes=(1, 2), max_num_seqs=4),
            OPTIONS,
            (
                UsageError,
                "the capture policy's max_num_seqs (4) is not the engine's (8)",
            ),
        ),
        (
            CapturePolicy(
                capture_sizes=(2, 4), max_num_seqs=8, microbatching=Microbatching(2)
            ),
            OPTIONS,
            (TargetError, "microbatching (vLLM's UBatchRunner) is not modelled"),
        ),
        (
            CapturePolicy(
                capture_sizes=(1, 2), max_num_seqs=8, lora_capture_cases=(0, 1)
            ),
            OPTIONS,
            (TargetError, "LoRA is not modelled"),
        ),
    ],
)
def test_what_the_runner_does_not_model_is_refused_in_one_line(
    policy: CapturePolicy, options: EngineOptions, refusal: tuple[type, str]
) -> None:
    sources = RunnerSources.for_release("0.33.0")
    kind, text = refusal
    with pytest.raises(kind) as raised:
        build_worker(
            sources, options, policy, 0, 2, speculator=None, sync=_sync(sources)
        )
    assert str(raised.value) == f"runner lane: {text}"


def _pair(
    sources: RunnerSources,
    policy: CapturePolicy,
    options: EngineOptions,
    busy: Any,
    idle_steps: int,
) -> SimResult:
    steps = Steps(sources, options.num_speculative_tokens)
    workers = []
    for rank in range(2):
        sync = _sync(sources)
        speculator = build_speculator(sources, options, policy, rank, 2, sync=sync)
        workers.append(
            build_worker(
                sources, options, policy, rank, 2, speculator=speculator, sync=sync
            )
        )

    def program(rank: int) -> Any:
        if rank == 0:
            return busy(workers[0], steps)
        for _ in range(idle_steps):
            workers[1].execute_dummy_batch()
        return None

    with collect_gaps() as gaps:
        result = simulate(program, ranks=2)
    assert gaps == []
    return result


def _groups(result: SimResult, rank: int) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for c in result.ranks[rank].collectives:
        found.setdefault(c.group, []).append((c.signature.kind, c.signature.shape))
    return found


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_under_full_graphs_the_idle_rank_replays_the_busy_ranks_graph(
    version: str,
) -> None:
    sources = RunnerSources.for_release(version)
    full = CapturePolicy(
        capture_sizes=(1, 2, 4, 8), cudagraph_mode=CudagraphMode.FULL, max_num_seqs=8
    )

    def decodes(worker: Any, steps: Steps) -> None:
        worker.execute_model(steps.prefill(["a", "b", "c"], 1))
        worker.sample_tokens(None)

    result = _pair(sources, full, OPTIONS, decodes, 1)
    assert result.outcome == Outcome.OK
    assert _groups(result, 0) == _groups(result, 1)
    # Three one-token requests pad to the captured 4: one graph replay.
    assert _groups(result, 1)[EP_GROUP] == [("all_reduce", (4,))]


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("kind", ["ar", "mtp"])
def test_with_a_speculator_the_idle_rank_drafts_as_the_busy_one(
    version: str, kind: str
) -> None:
    k = 2
    sources = RunnerSources.for_release(version)
    options = EngineOptions(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        speculator=kind,
        num_speculative_tokens=k,
    )
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
        max_num_seqs=8,
        decode_query_len=1 + k,
    )
    result = _pair(sources, policy, options, _busy, 3)
    assert result.outcome == Outcome.OK
    assert _groups(result, 0)[DP_CPU_GROUP] == _groups(result, 1)[DP_CPU_GROUP]
    assert _groups(result, 0)[EP_GROUP] == _groups(result, 1)[EP_GROUP]
    forwards = [
        Counter(e.kind for e in result.ranks[rank].events)[DRAFTER_FORWARD_EVENT]
        for rank in range(2)
    ]
    assert forwards[0] == forwards[1] > 0
    # The idle rank's dummy batch is a uniform decode of 1 + k tokens (the
    # _dummy_run hack for the worker's 1-token request).
    dummy = next(
        e.payload["inputs"]
        for e in result.ranks[1].events
        if e.kind == SYNC_EVENT and e.payload["phase"] == "iter 1 model"
    )
    assert dummy["num_tokens"] == 1 + k
    assert dummy["uniform_token_count"] == 1 + k


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_the_key_functions_run_mostly_for_real(version: str) -> None:
    sources = RunnerSources.for_release(version)
    codes = [
        code
        for cls in real_classes(sources)
        for code in cls.DPSIM_ORIGIN.codes()  # type: ignore[attr-defined]
    ]
    with LineCoverage(codes) as coverage:
        result = _pair(sources, PIECEWISE, OPTIONS, _busy, 3)
    assert result.outcome == Outcome.OK
    ran = {
        function.name: len(function.executed) / len(function.executable)
        for function in coverage.functions()
    }
    for name in (
        "GPUModelRunner.execute_model",
        "GPUModelRunner._dummy_run",
        "GPUModelRunner.sample_tokens",
        "Worker.execute_model",
        "Worker.execute_dummy_batch",
    ):
        # The rest is PP, LoRA, PCP/DCP, multimodal, pooling: not modelled.
        assert ran[name] > 0.3, (name, ran[name])


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_what_the_lane_finds_under_full_and_piecewise_beyond_the_decode_graphs(
    release: Any, version: str
) -> None:
    """Finding 13 (docs/findings.md) under the default mode (examined on the code, not confirmed on GPUs): vLLM's default
    FULL_AND_PIECEWISE with a drafter. Rank 1 decodes max_num_seqs (3)
    requests of 1 + k (2) tokens; FULL decode graphs hold 2 requests at most
    (7 rounds up to 8 tokens, past the largest size: 0.29-0.33 round each
    size up to the decode length, 0.34 counts each size's requests the same
    way), so the 6 tokens run the PIECEWISE 7t graph (num_reqs None), and
    the idle rank's dummy is built as ONE request of 7 tokens: its drafter
    prefill fails the reuse assertion. With 6 among the capture sizes the
    same engines run clean."""
    options = EngineOptions(
        max_num_seqs=3,
        max_num_batched_tokens=8,
        max_model_len=16,
        speculator="ar",
        num_speculative_tokens=1,
    )
    busy = RankStream(tuple(RequestScript(f"r1-{i}", 0, 1, 2) for i in range(3)))
    verdicts: dict[tuple[int, ...], list[Any]] = {}
    for sizes in ((1, 2, 4, 7), (1, 2, 4, 6, 8)):
        policy = CapturePolicy(
            capture_sizes=sizes,
            cudagraph_mode="FULL_AND_PIECEWISE",
            max_num_seqs=3,
            decode_query_len=2,
        )
        case = RunnerCase(policy, options, (RankStream(), busy))
        run = run_runner_case(release(version), case)
        verdicts[sizes] = judge(case, run.result, RUNNER_LANE_PROPERTIES.values())
    found = verdicts[(1, 2, 4, 7)]
    assert found[0].property == "no-error" and found[0].ranks == (0,)
    assert found[0].phase == "iter 2 drafter prefill"
    assert "reusing a DP sync taken over a different batch" in found[0].message
    assert verdicts[(1, 2, 4, 6, 8)] == []


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_an_idle_drafter_fails_under_vllms_own_default_capture_sizes(
    release: Any, version: str
) -> None:
    """Finding 13 (docs/findings.md) with the capture sizes vLLM's config derives when none are given
    (config/vllm.py, 0.29-0.34: the 1/2/4/8-step/16-step grid up to
    min(max_num_seqs x 3 x 2, 512), plus uniform decode sizes 3n for its
    request-count grid, up to 512), max_num_seqs 256, MTP k=2: the largest
    FULL decode graph is 504 tokens (168 requests; 512 rounds to 513). A
    rank decoding 170 requests (510 tokens) runs PIECEWISE 512 and its idle
    peer's drafter prefill fails the reuse assertion; 168 requests hold."""
    decode = {3 * n for n in (1, 2, 4, *range(8, 171, 8))}
    sizes = tuple(sorted(set(vllm_default_sizes(512)) | decode))
    options = EngineOptions(
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=16,
        speculator="mtp",
        num_speculative_tokens=2,
    )
    policy = CapturePolicy(
        capture_sizes=sizes,
        cudagraph_mode="FULL_AND_PIECEWISE",
        max_num_seqs=256,
        decode_query_len=3,
    )
    messages: dict[int, list[str]] = {}
    for count in (168, 170):
        busy = RankStream(
            tuple(RequestScript(f"r1-{i}", 0, 1, 2) for i in range(count))
        )
        case = RunnerCase(policy, options, (RankStream(), busy))
        run = run_runner_case(release(version), case)
        verdicts = judge(case, run.result, RUNNER_LANE_PROPERTIES.values())
        messages[count] = [verdict.message for verdict in verdicts]
    assert messages[168] == []
    assert messages[170][0] == (
        "rank 0 raised AssertionError: reusing a DP sync taken over a different batch"
    )
