"""The real V1 ``GPUModelRunner`` of a release, per virtual rank, on CPU.

:func:`build_v1_model_runner` rebuilds ``GPUModelRunner`` from the release's
``v1/worker/gpu_model_runner.py`` (:func:`~dpsim.lanes.runner.extract.real_class`)
keeping the methods on the DP path (:data:`RUN_FOR_REAL`): ``execute_model``
(its 0-token early return and the external-launcher ``_dummy_run(1)``),
``_dummy_run``, ``sample_tokens`` with its drafter fit check
(``_input_fits_in_drafter``) and ``propose_draft_token_ids``,
``_determine_batch_execution_and_padding`` (the release's real
``coordinate_batch_across_dp`` and real ``CudagraphDispatcher``, as the sync
lane's V1 target loads them), ``_model_forward``, ``eplb_step``,
``take_draft_token_ids``, and the small helpers they call. One instance per
rank, made without ``__init__`` (which builds GPU state), holding what those
methods read.

Real vLLM besides: ``ModelRunnerOutput`` / ``EMPTY_MODEL_RUNNER_OUTPUT`` /
``DraftTokenIds`` (``v1/outputs.py``), ``maybe_create_ubatch_slices``
(``ubatch_utils.py``), ``cdiv``, the forward context's ``DPMetadata.make``
(its count check, through :class:`~dpsim.lanes.runner.forward.ForwardContexts`).

Stood in for (strict: anything else asked is a gap that refuses the run), see
:data:`STOOD_IN` and :mod:`.standins`: the request bookkeeping (``_update_states``: a
:class:`PersistentBatch` keeping the request order and the per-request token
counts the DP path reads; V1's ``InputBatch`` holds pinned and GPU buffers),
``_prepare_inputs``, slot mappings and attention metadata (empty, the real
shapes' maximum sequence length kept: the drafter fit check reads it),
``_preprocess``, the sampler and ``_bookkeeping_sync`` (one token per request
that samples; the modelled scheduler decides acceptance), KV/EC connectors
(none), LoRA (refused), EPLB (off: ``eplb_step`` returns at once, no
collective), the model (:class:`~dpsim.lanes.runner.forward.FakeModel`:
forwards issue the EP collectives at the shape and graph mode the forward
context says, one replay for a FULL graph), async output copies.

Dropped: ``@torch.inference_mode()``. It switches a thread-local torch flag,
and virtual ranks share one thread: one rank leaving the mode would switch it
off under another. The installed world holds the mode on for the whole run
instead (``dpsim.targets.runtime``), so every rank runs in it as vLLM's
decorated methods do.

Not modelled (refused in one line): microbatching, LoRA, encoder-decoder
models, pipeline parallelism (the pipeline group is the shim's one stage).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import functools
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.extract import class_methods, class_node, real_class, supply
from dpsim.lanes.runner.forward import FakeModel, ForwardContexts
from dpsim.lanes.runner.model_runner import (
    VOCAB_SIZE,
    _assigned,
    _ignore,
    _real,
)
from dpsim.lanes.runner.scheduler import scheduler_types
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import instance, standin
from dpsim.lanes.runner.syncs import Phases
from dpsim.lanes.runner.v1.standins import (
    AsyncV1Output,
    CopiedBuffer,
    NeverInstance,
    NoCudagraphStat,
    PersistentBatch,
    V1ForwardContexts,
    V1RunnerStandIns,
    execute_model_state,
    to_tensor,
)
from dpsim.lanes.runner.v1.syncs import V1SyncRecorder, bind, router
from dpsim.records.policy import CapturePolicy
from dpsim.targets.spec import V1_ENTRY
from dpsim.targets.standins import get_pp_group, get_single_rank_group
from dpsim.targets.v1.api import V1API

MODEL_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
OUTPUTS_MODULE = "vllm.v1.outputs"
UBATCH_MODULE = "vllm.v1.worker.ubatch_utils"
MATH_MODULE = "vllm.utils.math_utils"
SPEC_METADATA_MODULE = "vllm.v1.spec_decode.metadata"
#: The files this module reads (in :data:`~dpsim.lanes.runner.sources.V1_RUNNER_LANE_MODULES`).
MODULES = (
    MODEL_RUNNER_MODULE,
    OUTPUTS_MODULE,
    UBATCH_MODULE,
    MATH_MODULE,
    SPEC_METADATA_MODULE,
)

CALLER = "_determine_batch_execution_and_padding"
#: GPUModelRunner methods run for real: the first ones must be there; the
#: others are kept where the release has them.
REQUIRED = ("execute_model", "sample_tokens", "_dummy_run", CALLER)
RUN_FOR_REAL = (
    *REQUIRED,
    "_is_uniform_decode",
    "_allow_microbatching",
    "_model_forward",
    "_input_fits_in_drafter",
    "take_draft_token_ids",
    "eplb_step",
    "synchronize_input_prep",
    "_prepare_padding_mask",
    "_get_cumsum_and_arange",
    "maybe_randomize_inputs",
    "_pad_for_sequence_parallelism",
    # 0.29-0.32: None while routed experts are not captured (off).
    "get_routed_experts",
    # Speculative decoding: the drafter's inputs and its call.
    "propose_draft_token_ids",
    "_calc_spec_decode_metadata",
    "_get_positions",
    "get_model",
)
#: What the runner's real methods are given in place of vLLM's, and why.
STOOD_IN: dict[str, str] = {
    "GPUModelRunner._update_states": "InputBatch's pinned/GPU buffers; a persistent batch of the request order and token counts",
    "GPUModelRunner._prepare_inputs": "H2D copies; the logits rows of the real batch",
    "GPUModelRunner._get_slot_mappings, _build_attention_metadata": "attention backends; no layers, the batch's max sequence length kept",
    "GPUModelRunner._preprocess": "input buffers; zero token ids and positions of the padded shape",
    "GPUModelRunner._sample, _bookkeeping_sync": "GPU sampling; one token per request that samples",
    "GPUModelRunner._copy_draft_token_ids_to_cpu, _get_draft_token_ids_cpu, _copy_valid_sampled_token_count": "CUDA streams and events; copies done at once",
    "speculative_config": "EAGLE/MTP drafting with the padded drafter batch; the drafter is the real EagleProposer (v1/proposer.py)",
    "GPUModelRunner.maybe_get_kv_connector_output, finalize_kv_connector, clear_kv_connector_metadata": "no KV connector",
    "GPUModelRunner.maybe_dummy_run_with_lora": "LoRA mixin; LoRA is not modelled",
    "model": "the model forward; EP collectives at the chosen shape and mode (forward.FakeModel)",
    "set_forward_context": "per-thread forward context; per virtual rank, coordinating afresh under DP without agreed counts (standins.V1ForwardContexts)",
    "AsyncGPUModelRunnerOutput": "CUDA stream and event; output ready at once",
}
#: Attributes the real V1 runner lacks too (``getattr`` probes take their default).
ABSENT: frozenset[str] = frozenset()
#: Features some releases' runners have, all off here: set only where the
#: release's runner assigns them (so a release without one still lacks it).
OFF_IN_SOME_RELEASES: dict[str, Any] = {
    "cascade_attn_enabled": False,
    "routed_experts_initialized": False,
    # 0.29+: XD-RoPE models' position rows; a plain decoder has none.
    "uses_xdrope_dim": 0,
    # Up to 0.26: KV-scale calibration (off by default) runs eagerly once.
    "calculate_kv_scales": False,
    # Up to 0.18: the async output's copy stream (no CUDA stream here).
    "async_output_copy_stream": None,
}
#: Classes vLLM's runner tests its model or drafter against that the lane's
#: never are (the EAGLE drafter's class is supplied when a drafter is built).
NEVER_INSTANCES = (
    "CUDAGraphWrapper",
    "UBatchWrapper",
    "BreakableCUDAGraphWrapper",
    "EagleProposer",
    "DFlashProposer",
    "DraftModelProposer",
    "ExtractHiddenStatesProposer",
    "Gemma4Proposer",
    "NgramProposer",
    "NgramProposerGPU",
    "SuffixDecodingProposer",
    "MedusaProposer",
)
#: Stood-in methods whose result tuple's length differs across releases,
#: read off the release's own return annotation (``tuple[...]``).
VARYING_RESULTS = ("_prepare_inputs", "_bookkeeping_sync")
#: The distributed executor backend: the engine core's own (not torchrun's
#: ``external_launcher``, which runs without the DP engine loop).
EXECUTOR_BACKEND = "mp"


@dataclasses.dataclass(frozen=True)
class V1RunnerKit:
    """What one release lends its rebuilt V1 runners, built once per sources."""

    version: str | None
    runner_class: type
    forward_contexts: ForwardContexts
    model_runner_output: type
    empty_output: Any
    draft_token_ids: type
    #: The release's helper modules (lenient loads), by module name.
    modules: dict[str, ModuleType]
    #: The sync lane's V1 API of the release (reads descriptors, agreements).
    api: V1API
    #: The release's ``coordinate_batch_across_dp`` as the sync lane loaded it.
    real_sync: Any
    #: The attributes the release's ``GPUModelRunner`` methods assign on self.
    assigned: frozenset[str]
    #: How many values each of :data:`VARYING_RESULTS` returns in this release.
    result_sizes: dict[str, int]
    #: Whether the release's ``_update_states`` takes unproposed placeholder
    #: drafts out of the scheduler output under async scheduling (0.12-0.13).
    trims_unproposed_drafts: bool
    #: The runner attributes the release makes CPU/GPU buffers
    #: (``self._make_buffer``: read as ``.np``/``.gpu``); others are tensors.
    buffers: frozenset[str]


@functools.lru_cache(maxsize=16)
def v1_runner_kit(sources: RunnerSources) -> V1RunnerKit:
    """The release's V1 runner pieces, made once per sources object."""
    target = sources.target
    if target.runner != "v1":
        raise TargetError(
            f"runner lane: {sources.label}'s target is the "
            f"{target.runner.upper()} runner's, not V1's"
        )
    api = target.api
    assert isinstance(api, V1API)
    modules = {name: sources.load_module(name, lenient=True) for name in MODULES[1:]}
    version = sources.version
    outputs = modules[OUTPUTS_MODULE]
    forward_context = target.forward_context  # type: ignore[attr-defined]
    dp_metadata = forward_context.__dict__.get("DPMetadata")
    real_sync = target.dp_utils.__dict__[V1_ENTRY]
    contexts = V1ForwardContexts(
        None if dp_metadata is None or _stub(dp_metadata) else dp_metadata.make,
        router(real_sync),
    )
    model_runner_output = _real(outputs, "ModelRunnerOutput", version)
    globals_: dict[str, Any] = {
        "np": np,
        "torch": torch,
        "contextmanager": contextlib.contextmanager,
        "functools": functools,
        "CUDAGraphMode": target.CUDAGraphMode,
        "BatchDescriptor": target.BatchExecutionDescriptor,
        "SchedulerOutput": scheduler_types(sources).SchedulerOutput,
        "ModelRunnerOutput": model_runner_output,
        "EMPTY_MODEL_RUNNER_OUTPUT": _real(
            outputs, "EMPTY_MODEL_RUNNER_OUTPUT", version
        ),
        "DraftTokenIds": _real(outputs, "DraftTokenIds", version),
        V1_ENTRY: contexts.coordinate,
        "set_forward_context": contexts.set_forward_context,
        "get_pp_group": get_pp_group,
        "get_tp_group": get_single_rank_group,
        "has_kv_transfer_group": lambda: False,
        "has_ec_transfer": lambda: False,
        "record_function_or_nullcontext": lambda name: contextlib.nullcontext(),
        "logger": standin("logger", debug=_ignore, info=_ignore, debug_once=_ignore),
        "envs": standin("vllm.envs", VLLM_RANDOMIZE_DP_DUMMY_INPUTS=False),
        # DCP is off (one rank): no dummy context, nothing to prepare.
        "get_dcp_dummy_context_len": lambda *args: 0,
        "prepare_dcp_dummy_context_metadata": _ignore,
        "async_tensor_h2d": to_tensor,
        # A NamedTuple in vLLM, built positionally and unpacked likewise.
        "ExecuteModelState": execute_model_state,
        "AsyncGPUModelRunnerOutput": AsyncV1Output,
        "CUDAGraphStat": NoCudagraphStat,
        # Up to 0.14: a multimodal encoder-only model skips dummy runs; a
        # plain decoder is not one.
        "supports_mm_encoder_only": lambda model: False,
        # 0.12-0.13 copy the scheduler output before changing it.
        "deepcopy": copy.deepcopy,
        "copy": copy.copy,
        # 0.33 replaces fields of it (n-gram GPU drafting only).
        "replace": dataclasses.replace,
        # Wrappers and drafters the lane's model and drafter are not.
        **dict.fromkeys(NEVER_INSTANCES, NeverInstance),
    }
    for module, name in (
        (modules[UBATCH_MODULE], "maybe_create_ubatch_slices"),
        (modules[MATH_MODULE], "cdiv"),
        (modules[SPEC_METADATA_MODULE], "SpecDecodeMetadata"),
    ):
        value = module.__dict__.get(name)
        if value is not None and not _stub(value):
            globals_[name] = value
    path = sources.path(MODEL_RUNNER_MODULE)
    text = path.read_text()
    have = set(class_methods(path, "GPUModelRunner", version=version))
    runner_class = real_class(
        path,
        "GPUModelRunner",
        [name for name in RUN_FOR_REAL if name in REQUIRED or name in have],
        version=version,
        globals_=globals_,
        bases=(V1RunnerStandIns,),
        decorators={
            "torch.inference_mode()": None,
            "torch.inference_mode": None,
        },
        absent=ABSENT,
    )
    return V1RunnerKit(
        version=version,
        runner_class=_recording_class(runner_class),
        forward_contexts=contexts,
        model_runner_output=model_runner_output,
        empty_output=globals_["EMPTY_MODEL_RUNNER_OUTPUT"],
        draft_token_ids=globals_["DraftTokenIds"],
        modules=modules,
        api=api,
        real_sync=real_sync,
        assigned=_assigned(path, "GPUModelRunner"),
        result_sizes=_result_sizes(path, version),
        buffers=frozenset(_MAKE_BUFFER.findall(text)),
        trims_unproposed_drafts=_TRIMS_DRAFTS in text,
    )


#: The statement by which 0.12-0.13's ``_update_states`` drops unproposed drafts.
_TRIMS_DRAFTS = "scheduler_output.total_num_scheduled_tokens -= num_spec_tokens"
#: ``self.X = self._make_buffer(`` in the runner's ``__init__``.
_MAKE_BUFFER = re.compile(r"self\.(\w+) = self\._make_buffer\(")


def _result_sizes(path: Path, version: str | None) -> dict[str, int]:
    """How many values the release's own methods of :data:`VARYING_RESULTS`
    return (their ``tuple[...]`` annotation), which the stand-ins match."""
    found = class_node(path, "GPUModelRunner", version=version)
    sizes: dict[str, int] = {}
    for node in found.body:
        if isinstance(node, ast.FunctionDef) and node.name in VARYING_RESULTS:
            returns = node.returns
            if isinstance(returns, ast.Subscript) and isinstance(
                returns.slice, ast.Tuple
            ):
                sizes[node.name] = len(returns.slice.elts)
    missing = [name for name in VARYING_RESULTS if name not in sizes]
    if missing:
        raise TargetError(
            f"runner lane: vLLM {version or '(this tree)'}'s GPUModelRunner."
            f"{missing[0]} has no tuple[...] return annotation the lane's stand-in "
            "can match"
        )
    return sizes


def _stub(value: Any) -> bool:
    from dpsim.targets.shim import is_stub

    return bool(is_stub(value))


def _recording_class(runner_class: type) -> type:
    """The rebuilt runner with its caller method recorded per call."""

    class GPUModelRunner(runner_class):
        __qualname__ = runner_class.__qualname__

        def _determine_batch_execution_and_padding(
            self, *args: Any, **kwargs: Any
        ) -> Any:
            method = super()._determine_batch_execution_and_padding
            bound = inspect.signature(method).bind(*args, **kwargs)
            bound.apply_defaults()
            parallel = self.parallel_config
            return self._dpsim_syncs.caller(
                method,
                bound.arguments,
                decode_query_len=self.uniform_decode_query_len,
                num_ubatches=int(parallel.num_ubatches),
                caller_frame=sys._getframe(1),
            )

    return GPUModelRunner


# -- building ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class V1RankKit:
    """One rank's share of the V1 lane, made before its drafter and runner
    (a drafter builder, :mod:`.proposer`'s, is given it): the release's kit, the rank's
    sync recorder and its parallel config (the runner's and the drafter's
    ``coordinate_batch_across_dp`` calls are routed to ``recorder`` by this
    very object: pass it as the drafter's ``parallel_config``)."""

    kit: V1RunnerKit
    recorder: V1SyncRecorder
    parallel_config: Any
    rank: int
    dp_size: int

    @property
    def forward_contexts(self) -> ForwardContexts:
        return self.kit.forward_contexts


def v1_rank_kit(
    sources: RunnerSources, rank: int, dp_size: int, phases: Phases | None = None
) -> V1RankKit:
    """Rank ``rank``'s kit: a fresh recorder (numbering its forward steps by
    ``phases``, new when None) bound to a fresh parallel config."""
    kit = v1_runner_kit(sources)
    recorder = V1SyncRecorder(kit.api, kit.real_sync, phases or Phases())
    parallel_config = sources.target.parallel_config(dp_size, rank, None)
    parallel_config.distributed_executor_backend = EXECUTOR_BACKEND  # type: ignore[attr-defined]
    parallel_config.enable_eplb = False  # type: ignore[attr-defined]
    parallel_config.cp_kv_cache_interleave_size = 1  # type: ignore[attr-defined]
    bind(parallel_config, recorder)
    return V1RankKit(kit, recorder, parallel_config, rank, dp_size)


def build_v1_model_runner(
    sources: RunnerSources,
    options: EngineOptions,
    policy: CapturePolicy,
    rank_kit: V1RankKit,
    drafter: Any = None,
) -> Any:
    """The rank's real V1 ``GPUModelRunner`` (``rank_kit`` says which rank
    of how many, and records its syncs); ``drafter`` is its proposer or None."""
    if policy.microbatching is not None:
        raise TargetError("runner lane: microbatching is not modelled")
    if policy.lora_capture_cases is not None:
        raise TargetError("runner lane: LoRA is not modelled")
    if getattr(policy, "encoder_decoder", False):
        raise TargetError("runner lane: encoder-decoder models are not modelled")
    for what, policy_value, engine_value in (
        ("decode_query_len", policy.decode_query_len, options.decode_query_len),
        ("max_num_seqs", policy.max_num_seqs, options.max_num_seqs),
    ):
        if policy_value != engine_value:
            raise UsageError(
                f"runner lane: the capture policy's {what} ({policy_value}) is not "
                f"the engine's ({engine_value})"
            )
    kit = rank_kit.kit
    dispatcher = sources.target.build_manager(policy.manager_config(rank_kit.dp_size))
    parallel_config = rank_kit.parallel_config
    k = options.num_speculative_tokens
    max_num_tokens = options.max_num_batched_tokens
    positions = torch.zeros(max_num_tokens, dtype=torch.int64)
    compilation_config = standin(
        "CompilationConfig",
        cudagraph_mode=dispatcher.compilation_config.cudagraph_mode,
        cudagraph_specialize_lora=False,
        pass_config=standin("PassConfig", enable_sp=False),
    )
    model_config = standin(
        "ModelConfig",
        is_encoder_decoder=False,
        multimodal_config=None,
        enable_return_routed_experts=False,
    )
    vllm_config = standin(
        "VllmConfig",
        parallel_config=parallel_config,
        compilation_config=compilation_config,
        model_config=model_config,
        observability_config=standin("ObservabilityConfig", cudagraph_metrics=False),
    )
    per_release = {
        name: value
        for name, value in OFF_IN_SOME_RELEASES.items()
        if name in kit.assigned
    }
    speculative = _speculative(sources, options, kit, drafter)
    per_release.update(
        (name, value)
        for name, value in speculative.items()
        if name in kit.assigned and name not in _SPECULATIVE_ALWAYS
    )
    return instance(
        kit.runner_class,
        **per_release,
        _dpsim_syncs=rank_kit.recorder,
        _dpsim_kit=kit,
        _dpsim_positions=positions,
        _dpsim_step=None,
        vllm_config=vllm_config,
        parallel_config=parallel_config,
        compilation_config=compilation_config,
        model_config=model_config,
        scheduler_config=standin(
            "SchedulerConfig",
            max_num_seqs=options.max_num_seqs,
            max_num_batched_tokens=max_num_tokens,
        ),
        cache_config=standin(
            "CacheConfig", kv_sharing_fast_prefill=False, mamba_cache_mode="none"
        ),
        speculative_config=speculative["speculative_config"],
        drafter=drafter,
        _dpsim_common_metadata=speculative["common_metadata"],
        lora_config=None,
        device=torch.device("cpu"),
        max_model_len=options.max_model_len,
        max_num_tokens=max_num_tokens,
        max_num_reqs=options.max_num_seqs,
        uniform_decode_query_len=options.decode_query_len,
        num_spec_tokens=k,
        cudagraph_dispatcher=dispatcher,
        model=FakeModel(kit.forward_contexts, VOCAB_SIZE),
        requests={},
        input_batch=PersistentBatch(VOCAB_SIZE),
        execute_model_state=None,
        kv_connector_output=None,
        kv_cache_config=standin("KVCacheConfig", kv_cache_groups=[]),
        attn_groups=[],
        eplb_state=None,
        eep_eplb_suppressed=False,
        use_async_scheduling=options.async_scheduling,
        use_aux_hidden_state_outputs=False,
        broadcast_pp_output=False,
        is_pooling_model=False,
        supports_mm_inputs=False,
        enable_prompt_embeds=False,
        uses_mrope=False,
        intermediate_tensors=None,
        prepare_inputs_event=None,
        dcp_world_size=1,
        check_ep_fault=False,
        num_prompt_logprobs={},
        _draft_token_ids=None,
        _draft_token_req_ids=None,
        arange_np=np.arange(max(options.max_num_seqs, max_num_tokens) + 1),
        **_host_buffers(kit, positions, options.max_num_seqs, max_num_tokens),
    )


#: What :func:`_speculative` gives every release's runner (the rest only
#: where the release assigns it).
_SPECULATIVE_ALWAYS = frozenset({"speculative_config", "common_metadata"})


def _speculative(
    sources: RunnerSources, options: EngineOptions, kit: V1RunnerKit, drafter: Any
) -> dict[str, Any]:
    """The runner's speculative-decoding settings for ``drafter`` (the real
    ``EagleProposer`` of :mod:`.proposer`, or None): its config, the drafter fit check's limit,
    the async valid-count event, the scratch arrays, and the release's
    ``CommonAttentionMetadata`` class the drafter reads."""
    if drafter is None:
        return {"speculative_config": None, "common_metadata": None}
    from dpsim.lanes.runner.v1.proposer import (
        common_attn_metadata_class,
        v1_proposer_class,
    )

    target = sources.target
    supply(kit.runner_class, EagleProposer=v1_proposer_class(sources, target))
    method = options.speculator
    config = standin(
        "SpeculativeConfig",
        method=method,
        num_speculative_tokens=options.num_speculative_tokens,
        # EAGLE and MTP drafters are "eagle" drafters to the runner.
        use_eagle=lambda: True,
        use_dflash=lambda: False,
        uses_draft_model=lambda: False,
        uses_extract_hidden_states=lambda: False,
        use_ngram_gpu=lambda: False,
        disable_padded_drafter_batch=False,
        enforce_eager=False,
        # The drafter is the target model's own: the same length limit.
        draft_model_config=standin(
            "ModelConfig (the drafter's)", max_model_len=options.max_model_len
        ),
    )
    event = (
        standin("torch.Event", record=_ignore, synchronize=_ignore)
        if options.async_scheduling
        else None
    )
    scratch = max(options.max_num_batched_tokens, options.max_num_seqs) + 1
    return {
        "speculative_config": config,
        "common_metadata": common_attn_metadata_class(sources, target),
        "effective_drafter_max_model_len": options.max_model_len,
        "valid_sampled_token_count_event": event,
        "_arange_scratch": np.empty(scratch, dtype=np.int64),
    }


def _host_buffers(
    kit: V1RunnerKit, positions: torch.Tensor, max_num_reqs: int, max_num_tokens: int
) -> dict[str, Any]:
    """The input buffers ``_dummy_run`` and the real steps fill (zeros of
    their real sizes), each a buffer or a tensor as the release makes it."""
    values = {
        "is_padding": torch.zeros(max_num_tokens, dtype=torch.bool),
        "input_ids": torch.zeros(max_num_tokens, dtype=torch.int32),
        "positions": positions,
        "seq_lens": torch.zeros(max_num_reqs, dtype=torch.int32),
        "optimistic_seq_lens_cpu": torch.zeros(max_num_reqs, dtype=torch.int32),
        "query_pos": torch.zeros(max_num_tokens, dtype=torch.int64),
        "query_start_loc": torch.zeros(max_num_reqs + 1, dtype=torch.int32),
        "discard_request_mask": torch.zeros(max_num_reqs, dtype=torch.bool),
    }
    return {
        name: CopiedBuffer(value) if name in kit.buffers else value
        for name, value in values.items()
    }
