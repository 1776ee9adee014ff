"""The real V2 ``GPUModelRunner`` of a release, per virtual rank, on CPU.

:func:`build_model_runner` rebuilds ``GPUModelRunner`` from the release's
``v1/worker/gpu/model_runner.py`` (:func:`~dpsim.lanes.runner.extract.real_class`)
keeping the methods on the DP path that run on CPU (:data:`RUN_FOR_REAL`:
``execute_model``, ``sample_tokens``, ``_dummy_run``, the request
bookkeeping, ``gather_batch_req_state``, ``sample``, ...), and makes one
instance per rank without ``__init__`` (which builds GPU state), holding the
attributes those methods read. What it holds:

* real vLLM: the release's ``ModelCudaGraphManager`` built from the case's
  capture policy as the sync lane builds managers (fake captured graphs,
  :mod:`.forward`); ``dispatch_cg_and_sync_dp`` (the sync lane's loaded
  function, wrapped by the caller's recorder, passed in as ``sync``);
  ``InputBatch`` / ``InputBuffers`` on CPU, ``SchedulerOutput`` (the modelled
  scheduler's classes), ``ModelRunnerOutput``, the ``BatchReqState`` /
  ``ExecuteModelState`` records and ``sort_batch_req_ids``,
  ``get_uniform_decode_token_count``, ``get_drafter_hidden_states``,
  ``BatchDescriptor`` and ``DPMetadata.make`` (the forward context's count
  check), ``step_eplb_after`` with the real ``EPLBController`` (EPLB off, so
  its ``step`` returns at once: no collective), the no-op KV and EC
  connectors, the ``DraftTokensHandler`` that hands the engine each step's
  drafts (0.34: every live request's latest, until the request is removed);
* stood in for (GPU, triton or model work, strict: anything else they are
  asked is a gap): ``prepare_inputs`` (a real ``InputBatch`` shaped as the
  real method shapes it, without its H2D copies and triton kernels; before
  0.28, which has no ``gather_batch_req_state``, it first gathers the
  request state as 0.26-0.27's own ``prepare_inputs`` does, in the order of
  the release's ``sort_batch_req_ids``), the
  request state (:class:`RequestStates`: CPU arrays the bookkeeping methods
  read and write), block tables, model state, sampler, prompt logprobs,
  LoRA state, step timing, the model
  (:class:`~dpsim.lanes.runner.forward.FakeModel`), ``post_update``,
  ``build_slot_mappings_by_layer``, ``use_workspace_lane``, ``AsyncOutput``;
* dropped: ``@torch.inference_mode()``. It switches a thread-local torch
  flag, and virtual ranks share one thread: one rank leaving the mode would
  switch it off under another (RUNNER_LANE.md). The installed world holds
  the mode on for the whole run instead (``dpsim.targets.runtime``).

``set_forward_context`` is :class:`~dpsim.lanes.runner.forward.ForwardContexts`
(one context per virtual rank, as vLLM has one per worker process).
Not modelled (refused with a one-line :class:`~dpsim.errors.TargetError`):
microbatching (``UBatchRunner``), pipeline parallelism, LoRA,
encoder-decoder models.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import numpy as np
import torch

from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.extract import real_class
from dpsim.lanes.runner.forward import (
    FakeModel,
    ForwardContexts,
    install_graphs,
)
from dpsim.lanes.runner.scheduler import scheduler_types
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import StrictObject, gap, instance, standin
from dpsim.records.policy import CapturePolicy
from dpsim.targets.load import Target
from dpsim.targets.shim import LENIENT, ModuleLoader, is_stub, parse_source
from dpsim.targets.standins import STAND_INS

MODEL_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
INPUT_BATCH_MODULE = "vllm.v1.worker.gpu.input_batch"
EPLB_MODULE = "vllm.v1.worker.gpu.eplb_utils"
KV_CONNECTOR_MODULE = "vllm.v1.worker.gpu.kv_connector"
EC_CONNECTOR_MODULE = "vllm.v1.worker.gpu.ec_connector"
OUTPUTS_MODULE = "vllm.v1.outputs"
WORKER_UTILS_MODULE = "vllm.v1.worker.utils"
SPEC_UTILS_MODULE = "vllm.v1.worker.gpu.spec_decode.utils"
FORWARD_CONTEXT_MODULE = "vllm.forward_context"
PCP_MODULE = "vllm.v1.worker.gpu.pcp_manager"
CP_UTILS_MODULE = "vllm.v1.worker.gpu.cp_utils"
#: The PCP module's helpers the runner calls through ``pcp.``; with no PCP
#: manager each hands back its input or the block tables' answer.
PCP_HELPERS = ("maybe_get_pcp_dummy_slot_mappings", "maybe_restore_pcp_for_sampling")
#: The files this module reads (for :data:`.sources.RUNNER_LANE_MODULES`).
MODULES = (
    MODEL_RUNNER_MODULE,
    INPUT_BATCH_MODULE,
    EPLB_MODULE,
    KV_CONNECTOR_MODULE,
    EC_CONNECTOR_MODULE,
    OUTPUTS_MODULE,
    WORKER_UTILS_MODULE,
    SPEC_UTILS_MODULE,
    FORWARD_CONTEXT_MODULE,
    PCP_MODULE,
    CP_UTILS_MODULE,
)
#: Modules of :data:`MODULES` a release may lack (0.26-0.27 have no EC
#: connector, releases before 0.26 no PCP manager): their runners name
#: nothing from them, and what a kept method does name is a gap.
OPTIONAL_MODULES = frozenset({EC_CONNECTOR_MODULE, PCP_MODULE})

#: GPUModelRunner methods run for real: every one the file has is kept; the
#: first three must be there.
REQUIRED = ("execute_model", "sample_tokens", "_dummy_run")
RUN_FOR_REAL = (
    *REQUIRED,
    # 0.28+; before, prepare_inputs gathers (_RunnerStandInsBefore028).
    "gather_batch_req_state",
    "take_draft_token_ids",
    "update_pp_decode_requests",
    "finish_requests",
    "_remove_request",
    "free_states",
    "add_requests",
    "update_requests",
    "_merge_ec_connector_no_forward",
    "prepare_attn",
    "prepare_dummy_attn",
    "sample",
    "postprocess_sampled",
    "dp_size",
    "dp_rank",
)
#: What the runner's real methods are given in place of vLLM's, and why
#: (for ``dpsim targets --lane runner``).
STOOD_IN: dict[str, str] = {
    "GPUModelRunner.prepare_inputs": "H2D copies and triton kernels; a real CPU InputBatch of its shapes",
    "GPUModelRunner.maybe_dummy_run_with_lora": "LoRA mixin; LoRA is not modelled",
    "req_states": "RequestState's GPU/UVA buffers; CPU arrays",
    "block_tables": "GPU block tables; zero tables and slot mappings of the real shapes",
    "model_state": "attention metadata builders; no layers",
    "sampler": "GPU sampling; one token per request",
    "prompt_logprobs_worker, lora_state, step_timing": "no prompt logprobs, LoRA or timing",
    "draft_tokens_handler.copy_stream, copy_event": "structured outputs' async D2H copy of drafts; not modelled (a gap)",
    "model": "the model forward; EP collectives at the chosen shape (forward.FakeModel)",
    "cudagraph_manager.graphs": "captured graphs; replay issues the EP collectives (forward.FakeGraph)",
    "set_forward_context": "per-thread forward context; per virtual rank (forward.ForwardContexts)",
    "post_update, build_slot_mappings_by_layer, use_workspace_lane": "triton / GPU buffers",
    "AsyncOutput": "CUDA stream and event; output ready at once",
}
#: Attributes the V2 runner does not have, which vLLM probes with getattr:
#: the worker's execute_dummy_batch reads ``uniform_decode_query_len`` (a V1
#: runner attribute) with a default of 1 (through 0.33; 0.34 passes the
#: runner's ``decode_query_len``).
ABSENT = frozenset({"uniform_decode_query_len"})
#: Features some releases' runners have, all off here: set only where the
#: release's runner assigns them (so a release without one still lacks it).
OFF_IN_SOME_RELEASES: dict[str, Any] = {
    "routed_experts_capturer": None,
    # 0.28: a decoder (the lane's MoE model), not an encoder-only model.
    "is_encoder_only": False,
    # Decode context parallelism is off (dcp_size 1): rank 0 of 1.
    "dcp_rank": 0,
    "cp_interleave": 1,
}
#: A stood-in batch-size-independent vocabulary: the logits' width.
VOCAB_SIZE = 8


#: The lane's sources (:mod:`.sources`), as this module's signatures name them.
Sources = RunnerSources


# -- the release's helper modules -------------------------------------------------


@functools.lru_cache(maxsize=16)
def _modules(paths: tuple[tuple[str, Path], ...]) -> dict[str, ModuleType]:
    """The helper modules, executed statement by statement under the targets'
    shim (what a statement needs that is missing leaves its names inert
    stubs: only names checked real by :func:`_real` are used)."""
    overrides = dict(paths)
    package_dir = overrides[MODEL_RUNNER_MODULE].parents[3]
    loader = ModuleLoader(
        package_dir,
        overrides=overrides,
        stand_ins=STAND_INS,
        lenient=LENIENT | frozenset(overrides),
    )
    return {name: loader.module(name) for name in overrides}


def _real(module: ModuleType, name: str, version: str | None) -> Any:
    """``module.name`` if the release defines it for real; else a one-line refusal."""
    value = module.__dict__.get(name)
    if value is None or is_stub(value):
        raise TargetError(
            f"runner lane: vLLM {version or '(this tree)'}'s "
            f"{module.__name__.replace('.', '/')}.py gives no {name} the lane can run"
        )
    return value


@dataclasses.dataclass(frozen=True)
class RunnerKit:
    """Everything one release lends its rebuilt runners, built once."""

    version: str | None
    runner_class: type
    globals_: dict[str, Any]
    InputBatch: type
    InputBuffers: type
    forward_contexts: ForwardContexts
    kv_connector: Any
    #: None where the release has no EC connector module.
    ec_connector: Any
    eplb_class: type
    model_runner_output: type
    draft_token_ids: type
    #: The release's real ``DraftTokensHandler`` (its CPU-side bookkeeping),
    #: and the attributes its ``__init__`` gives an instance.
    draft_tokens_handler: type
    draft_tokens_handler_fields: tuple[str, ...]
    #: The attributes the release's ``GPUModelRunner`` methods assign on self.
    assigned: frozenset[str]
    #: The release's helper modules (lenient loads), by module name.
    modules: dict[str, ModuleType]


def _methods_of(path: Path, class_name: str) -> set[str]:
    _, tree = parse_source(path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return set()


def _assigned(path: Path, class_name: str) -> frozenset[str]:
    _, tree = parse_source(path)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names.update(_self_stores(node))
    return frozenset(names)


def _self_stores(node: ast.AST) -> Iterator[str]:
    """The attributes assigned on ``self`` anywhere inside ``node``, in order."""
    for item in ast.walk(node):
        if (
            isinstance(item, ast.Attribute)
            and isinstance(item.ctx, ast.Store)
            and isinstance(item.value, ast.Name)
            and item.value.id == "self"
        ):
            yield item.attr


@functools.lru_cache(maxsize=16)
def runner_kit(sources: Sources, target: Target) -> RunnerKit:
    """The release's runner pieces, made once per sources object (a run's
    parts share one; a campaign runs thousands of cases on it)."""
    missing = [
        module
        for module in MODULES
        if module not in OPTIONAL_MODULES and not sources.has(module)
    ]
    if missing:
        raise TargetError(
            f"runner lane: vLLM {sources.version or '(this tree)'} has no "
            f"{missing[0].replace('.', '/')}.py (the V2 model runner needs it)"
        )
    return _kit(
        tuple(
            (module, sources.path(module)) for module in MODULES if sources.has(module)
        ),
        sources.version,
        target,
        # The modelled scheduler's classes: the runner's must be the same.
        scheduler_types(sources).SchedulerOutput,
    )


@functools.lru_cache(maxsize=16)
def _kit(
    paths: tuple[tuple[str, Path], ...],
    version: str | None,
    target: Target,
    scheduler_output: type,
) -> RunnerKit:
    modules = _modules(paths)
    path_of = dict(paths)
    runner_module = modules[MODEL_RUNNER_MODULE]
    batch_module = modules[INPUT_BATCH_MODULE]
    outputs = modules[OUTPUTS_MODULE]
    forward_context = modules[FORWARD_CONTEXT_MODULE]
    # make_dummy names its requests with uuids: deterministic names instead.
    batch_module.__dict__["random_uuid"] = lambda: "dummy"
    dp_metadata = forward_context.__dict__.get("DPMetadata")
    contexts = ForwardContexts(
        None if dp_metadata is None or is_stub(dp_metadata) else dp_metadata.make
    )
    model_runner_output = _real(outputs, "ModelRunnerOutput", version)
    globals_: dict[str, Any] = {
        "np": np,
        "torch": torch,
        "CUDAGraphMode": target.CUDAGraphMode,
        "SchedulerOutput": scheduler_output,
        "ModelRunnerOutput": model_runner_output,
        "InputBatch": _real(batch_module, "InputBatch", version),
        "set_forward_context": contexts.set_forward_context,
        "dispatch_cg_and_sync_dp": _route_sync,
        # Stand-ins for GPU work (see the module docstring).
        "use_workspace_lane": _workspace_lane,
        "build_slot_mappings_by_layer": _slot_mappings_by_layer,
        "post_update": _post_update,
        "AsyncOutput": AsyncOutput,
        # Watermarking is off: no sampler is an instance of this class.
        "GPUWatermarkSampler": NoWatermarkSampler,
    }
    # Real helpers, where the release defines them; a release whose kept
    # methods read one it lacks meets an unsupplied name (a gap) instead.
    for module, name in (
        (runner_module, "BatchReqState"),
        (runner_module, "ExecuteModelState"),
        (runner_module, "sort_batch_req_ids"),
        (modules[WORKER_UTILS_MODULE], "get_uniform_decode_token_count"),
        # Its name and home before 0.28 (no has_prefill argument).
        (target.cudagraph_utils, "get_uniform_token_count"),
        (modules[SPEC_UTILS_MODULE], "get_drafter_hidden_states"),
        (forward_context, "BatchDescriptor"),
        # 0.30 calls it whatever the DCP size (it returns None without DCP).
        (modules[CP_UTILS_MODULE], "maybe_prepare_dcp_local_seq_lens"),
        (modules[EPLB_MODULE], "step_eplb_after"),
    ):
        value = module.__dict__.get(name)
        if value is not None and not is_stub(value):
            globals_[name] = value
    pcp = modules[PCP_MODULE].__dict__ if PCP_MODULE in modules else {}
    globals_["pcp"] = standin(
        "pcp_manager module",
        **{
            name: pcp[name]
            for name in PCP_HELPERS
            if name in pcp and not is_stub(pcp[name])
        },
    )
    path = path_of[MODEL_RUNNER_MODULE]
    have = _methods_of(path, "GPUModelRunner")
    methods = [name for name in RUN_FOR_REAL if name in REQUIRED or name in have]
    runner_class = real_class(
        path,
        "GPUModelRunner",
        methods,
        version=version,
        globals_=globals_,
        bases=(
            _RunnerStandIns
            if "gather_batch_req_state" in have
            else _RunnerStandInsBefore028,
        ),
        class_attributes=(
            {}
            if "gather_batch_req_state" in have
            else {
                "_dpsim_sort_batch_req_ids": staticmethod(
                    _real(runner_module, "sort_batch_req_ids", version)
                )
            }
        ),
        # Per-thread torch state in vLLM; see the module docstring.
        decorators={"torch.inference_mode()": None},
        absent=ABSENT,
    )
    return RunnerKit(
        version=version,
        runner_class=runner_class,
        globals_=globals_,
        InputBatch=globals_["InputBatch"],
        InputBuffers=_real(batch_module, "InputBuffers", version),
        forward_contexts=contexts,
        kv_connector=_connector(
            path_of[KV_CONNECTOR_MODULE], "KVConnector", version, outputs
        ),
        ec_connector=(
            _connector(path_of[EC_CONNECTOR_MODULE], "ECConnector", version, outputs)
            if EC_CONNECTOR_MODULE in path_of
            else None
        ),
        eplb_class=real_class(
            path_of[EPLB_MODULE],
            "EPLBController",
            sorted(
                {"suppress", "step", "prepare_forward"}
                & _methods_of(path_of[EPLB_MODULE], "EPLBController")
            ),
            version=version,
            globals_={"contextmanager": contextlib.contextmanager},
        ),
        model_runner_output=model_runner_output,
        draft_token_ids=_real(outputs, "DraftTokenIds", version),
        draft_tokens_handler=_draft_tokens_handler_class(
            path_of[SPEC_UTILS_MODULE],
            version,
            _real(outputs, "DraftTokenIds", version),
        ),
        draft_tokens_handler_fields=_init_fields(
            path_of[SPEC_UTILS_MODULE], DRAFT_TOKENS_HANDLER
        ),
        assigned=_assigned(path, "GPUModelRunner"),
        modules=modules,
    )


DRAFT_TOKENS_HANDLER = "DraftTokensHandler"
#: Its methods on the DP path: the drafts of each sampling step, handed to
#: the engine (``take_draft_token_ids``); 0.34 keeps each live request's
#: latest drafts until it is removed (``begin_step``, ``discard``).
_DRAFT_TOKENS_HANDLER_METHODS = (
    "begin_step",
    "set_draft_tokens",
    "discard",
    "get_draft_tokens",
)
#: What its ``__init__`` sets, as it sets it on a CPU run. The copy stream
#: and event serve only structured outputs' drafts (not modelled: no batch
#: has structured-output requests), so asking them anything is a gap.
_DRAFT_TOKENS_HANDLER_STATE: dict[str, Callable[[], Any]] = {
    "device": lambda: "cpu",
    "copy_stream": lambda: standin("DraftTokensHandler.copy_stream"),
    "copy_event": lambda: standin("DraftTokensHandler.copy_event"),
    # Through 0.33: the last step's requests and drafts.
    "req_ids": list,
    "draft_tokens_np": lambda: None,
    "num_draft_tokens": lambda: 0,
    # 0.34+: each live request's latest drafts (or their width).
    "_copy_pending": lambda: False,
    "_draft_tokens_by_req": dict,
    "_deferred_req_ids": lambda: None,
}


def _draft_tokens_handler_class(
    path: Path, version: str | None, draft_token_ids: type
) -> type:
    """The release's ``DraftTokensHandler`` with its DP-path methods."""
    have = _methods_of(path, DRAFT_TOKENS_HANDLER)
    return real_class(
        path,
        DRAFT_TOKENS_HANDLER,
        [name for name in _DRAFT_TOKENS_HANDLER_METHODS if name in have],
        version=version,
        # torch only for the structured-output copy, which is a gap here.
        globals_={"DraftTokenIds": draft_token_ids, "torch": standin("torch")},
    )


def _init_fields(path: Path, class_name: str) -> tuple[str, ...]:
    """The attributes ``class_name.__init__`` in ``path`` assigns on self."""
    _, tree = parse_source(path)
    names: list[str] = []
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                names.extend(_self_stores(item))
    return tuple(dict.fromkeys(names))


def draft_tokens_handler(kit: RunnerKit) -> Any:
    """A rank's real ``DraftTokensHandler``, its state as ``__init__`` sets it;
    a release whose ``__init__`` sets something the lane does not know is
    refused."""
    unknown = [
        name
        for name in kit.draft_tokens_handler_fields
        if name not in _DRAFT_TOKENS_HANDLER_STATE
    ]
    if unknown:
        raise TargetError(
            f"runner lane: vLLM {kit.version or '(this tree)'}'s DraftTokensHandler "
            f"sets {unknown[0]} in __init__, which the lane does not model"
        )
    return instance(
        kit.draft_tokens_handler,
        **{
            name: _DRAFT_TOKENS_HANDLER_STATE[name]()
            for name in kit.draft_tokens_handler_fields
        },
    )


def _connector(path: Path, name: str, version: str | None, outputs: ModuleType) -> Any:
    """The release's no-op connector base class (every method a no-op or
    the empty output), rebuilt with the methods it has."""
    methods = sorted(_methods_of(path, name))
    cls = real_class(
        path,
        name,
        methods,
        version=version,
        globals_={
            "EMPTY_MODEL_RUNNER_OUTPUT": _real(
                outputs, "EMPTY_MODEL_RUNNER_OUTPUT", version
            ),
            "contextlib": contextlib,
            "contextmanager": contextlib.contextmanager,
        },
    )
    return instance(cls)


# -- stand-ins for GPU work -------------------------------------------------------


@contextlib.contextmanager
def _workspace_lane(lane: int) -> Iterator[None]:
    """``use_workspace_lane``: selects a GPU scratch buffer; nothing on CPU."""
    yield


def _slot_mappings_by_layer(slot_mappings: Any, kv_cache_config: Any) -> dict[str, Any]:
    """Per-layer views of the slot mappings: the fake model has no layers."""
    return {}


def _post_update(*args: Any) -> None:
    """The triton kernel that writes sampled tokens and computed-token counts
    into GPU request state: the modelled scheduler tells the runner each
    request's computed tokens on its next step instead."""


class NoWatermarkSampler:
    """Nothing is an instance: the lane runs without watermarking."""


class AsyncOutput(StrictObject):
    """``AsyncOutput`` without its CUDA stream and event: the output is
    there at once (``get_output``), its sampled tokens as lists."""

    OWNER = "AsyncOutput"

    def __init__(
        self,
        model_runner_output: Any,
        sampler_output: Any,
        num_sampled_tokens: torch.Tensor,
        main_stream: Any = None,
        copy_stream: Any = None,
        check_ep_fault: bool = False,
        pending_aux_output: Any = None,
        routed_experts: Any = None,
    ) -> None:
        sampled = sampler_output.sampled_token_ids
        counts = num_sampled_tokens.tolist()
        model_runner_output.sampled_token_ids = [
            row[:count] for row, count in zip(sampled.tolist(), counts, strict=True)
        ]
        self.model_runner_output = model_runner_output

    def get_output(self) -> Any:
        return self.model_runner_output


class RequestStates(StrictObject):
    """The runner's ``RequestState`` (``states.py``): per request slot, CPU
    arrays for what the DP path reads (prefill length, computed tokens,
    sampled and draft tokens). Its GPU mirrors (``.gpu``) are the same CPU
    arrays; the staged-write machinery is not modelled (writes land at once)."""

    OWNER = "RequestState"

    def __init__(self, max_num_reqs: int, num_speculative_steps: int) -> None:
        self.req_id_to_index: dict[str, int] = {}
        self._free = list(range(max_num_reqs))
        self.num_computed_tokens_np = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_prefill_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.prefill_len = _Buffer(np.zeros(max_num_reqs, dtype=np.int32))
        self.prompt_len = _Buffer(np.zeros(max_num_reqs, dtype=np.int32))
        self.num_computed_tokens = _Buffer(torch.zeros(max_num_reqs, dtype=torch.int32))
        self.all_token_ids = _Buffer(torch.zeros(max_num_reqs, 1, dtype=torch.int32))
        self.total_len = _Buffer(torch.zeros(max_num_reqs, dtype=torch.int32))
        self.last_sampled_tokens = torch.zeros(max_num_reqs, 1, dtype=torch.int64)
        self.next_prefill_tokens = torch.zeros(max_num_reqs, dtype=torch.int32)
        self.draft_tokens = torch.zeros(
            max_num_reqs, max(num_speculative_steps, 1), dtype=torch.int64
        )

    def add_request(
        self,
        req_id: str,
        prompt_len: int,
        all_token_ids: list[int],
        num_computed_tokens: int,
        max_tokens: int | None = None,
        **other: Any,
    ) -> None:
        if other:
            raise gap(f"RequestState.add_request with {sorted(other)} (not modelled)")
        index = self._free.pop(0)
        self.req_id_to_index[req_id] = index
        self.prompt_len.np[index] = prompt_len
        self.prefill_len.np[index] = len(all_token_ids)
        self.num_computed_tokens_np[index] = num_computed_tokens
        self.num_computed_prefill_tokens[index] = min(
            num_computed_tokens, len(all_token_ids)
        )

    def remove_request(self, req_id: str) -> int | None:
        index = self.req_id_to_index.pop(req_id, None)
        if index is not None:
            self._free.append(index)
            self._free.sort()
        return index

    def apply_staged_writes(self) -> None:
        """Writes land at once here."""


class _Buffer(StrictObject):
    """A UVA/staged buffer: its CPU array (``np``) and "GPU" tensor (``gpu``)."""

    OWNER = "buffer"

    def __init__(self, value: Any) -> None:
        if isinstance(value, np.ndarray):
            self.np = value
            self.gpu = torch.from_numpy(value)
        else:
            self.gpu = value
            self.np = value.numpy()


class NoLoRADummyRuns(StrictObject):
    """Both runners' stood-in LoRA mixin: the lane refuses LoRA policies, so a
    dummy run's LoRA context does nothing (and a LoRA config is a gap)."""

    @contextlib.contextmanager
    def maybe_dummy_run_with_lora(
        self, lora_config: Any, *args: Any, **kwargs: Any
    ) -> Iterator[None]:
        """The LoRA mixin's dummy-run context: LoRA is off (refused), so nothing."""
        if lora_config is not None:
            raise gap("maybe_dummy_run_with_lora with a LoRA config (not modelled)")
        yield


class _RunnerStandIns(NoLoRADummyRuns):
    """The base of the rebuilt runner: the methods that are GPU work."""

    OWNER = "GPUModelRunner"

    def prepare_inputs(
        self,
        scheduler_output: Any,
        batch_req_state: Any,
        batch_desc: Any,
        num_active_loras: int = 0,
    ) -> Any:
        """A real ``InputBatch`` on CPU with the real method's shapes (its
        padding, request counts, logits rows), without its H2D copies and
        triton kernels (token ids and positions stay zero)."""
        runner: Any = self
        num_tokens = int(batch_req_state.num_tokens)
        padded = max(num_tokens, batch_desc.num_tokens)
        req_ids = list(batch_req_state.req_ids)
        num_reqs = len(req_ids)
        reqs_padded = batch_desc.num_reqs or num_reqs
        scheduled = batch_req_state.num_scheduled_tokens
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        drafts = (
            np.array([len(spec_tokens.get(r, ())) for r in req_ids], dtype=np.int32)
            if spec_tokens
            else None
        )
        num_logits = 1 + (
            drafts if drafts is not None else np.zeros(num_reqs, np.int32)
        )
        short = [
            r for r, n, q in zip(req_ids, num_logits, scheduled, strict=True) if q < n
        ]
        if short:
            # vLLM's scheduler never schedules fewer tokens than a request's
            # logits rows (0.33's prepare_inputs asserts it); if the modelled
            # one did, sampling would read another request's rows.
            raise gap(
                f"GPUModelRunner.prepare_inputs: request {short[0]} has fewer "
                "tokens scheduled than drafts + 1 (the modelled scheduler "
                "disagrees with vLLM's)"
            )
        cu_num_logits_np = np.concatenate(([0], np.cumsum(num_logits))).astype(np.int32)
        query_start = np.full(reqs_padded + 1, num_tokens, dtype=np.int32)
        query_start[0] = 0
        query_start[1 : num_reqs + 1] = np.cumsum(scheduled)
        ends = query_start[1 : num_reqs + 1]
        logits_indices = np.concatenate(
            [np.arange(end - n, end) for end, n in zip(ends, num_logits, strict=True)]
        )
        batch = runner.InputBatch.make_dummy(num_reqs, num_tokens, runner.input_buffers)
        buffers = runner.input_buffers
        idx_mapping_np = batch_req_state.idx_mapping_np
        computed = runner.req_states.num_computed_tokens_np[idx_mapping_np]
        seq_lens = np.zeros(reqs_padded, dtype=np.int32)
        seq_lens[:num_reqs] = computed + scheduled
        values = {
            "req_ids": req_ids,
            "num_reqs_after_padding": reqs_padded,
            "idx_mapping": torch.from_numpy(idx_mapping_np.astype(np.int64)),
            "idx_mapping_np": idx_mapping_np,
            "num_scheduled_tokens": scheduled,
            "num_tokens": num_tokens,
            "num_tokens_after_padding": padded,
            "num_draft_tokens": int(drafts.sum()) if drafts is not None else 0,
            "num_draft_tokens_per_req": drafts,
            "query_start_loc": torch.from_numpy(query_start),
            "query_start_loc_np": query_start,
            "seq_lens": torch.from_numpy(seq_lens),
            "seq_lens_cpu_upper_bound": torch.from_numpy(seq_lens.copy()),
            "num_computed_tokens_np": computed,
            "prefill_len_np": batch_req_state.prefill_len_np,
            "num_computed_prefill_tokens_np": batch_req_state.num_computed_prefill_tokens_np,
            "is_prefilling_np": batch_req_state.is_prefilling_np,
            "has_prefill": batch_req_state.has_prefill,
            "input_ids": buffers.input_ids[:padded],
            "positions": buffers.positions[:padded],
            "is_padding": buffers.is_padding[:padded],
            "logits_indices": torch.from_numpy(logits_indices.astype(np.int64)),
            "cu_num_logits": torch.from_numpy(cu_num_logits_np),
            "cu_num_logits_np": cu_num_logits_np,
        }
        for name in (
            "decode_graph_eligible",
            "prefill_runs_as_decode_np",
            "max_seq_len_np",
        ):
            if hasattr(batch_req_state, name):
                values[name] = getattr(batch_req_state, name)
        names = {field.name for field in dataclasses.fields(batch)}
        return dataclasses.replace(
            batch, **{name: value for name, value in values.items() if name in names}
        )


class _RunnerStandInsBefore028(_RunnerStandIns):
    """The stood-in ``prepare_inputs`` of a runner before 0.28, which has no
    ``gather_batch_req_state``: its ``prepare_inputs(scheduler_output,
    batch_desc)`` gathers the batch's request state itself (0.27's
    ``model_runner.py`` ``prepare_inputs``: the release's own
    ``sort_batch_req_ids``, then each request's state row, prefill length and
    computed prefill tokens), as 0.28's real ``gather_batch_req_state`` does
    before the same shapes are made (:meth:`_RunnerStandIns.prepare_inputs`)."""

    def prepare_inputs(  # type: ignore[override]
        self, scheduler_output: Any, batch_desc: Any
    ) -> Any:
        runner: Any = self
        per_request = scheduler_output.num_scheduled_tokens
        req_ids = runner._dpsim_sort_batch_req_ids(per_request, runner.decode_query_len)
        states = runner.req_states
        idx_mapping_np = np.fromiter(
            map(states.req_id_to_index.__getitem__, req_ids),
            dtype=np.intp,
            count=len(req_ids),
        )
        prefill_len_np = states.prefill_len.np[idx_mapping_np]
        computed_prefill_np = states.num_computed_prefill_tokens[idx_mapping_np]
        is_prefilling_np = computed_prefill_np < prefill_len_np
        gathered = standin(
            "gathered request state",
            # Later releases' fields, which the shared shaping probes for.
            absent=(
                "decode_graph_eligible",
                "prefill_runs_as_decode_np",
                "max_seq_len_np",
            ),
            req_ids=req_ids,
            num_tokens=scheduler_output.total_num_scheduled_tokens,
            num_scheduled_tokens=np.fromiter(
                map(per_request.__getitem__, req_ids),
                dtype=np.int32,
                count=len(req_ids),
            ),
            idx_mapping_np=idx_mapping_np,
            prefill_len_np=prefill_len_np,
            num_computed_prefill_tokens_np=computed_prefill_np,
            is_prefilling_np=is_prefilling_np,
            has_prefill=bool(is_prefilling_np.any()),
        )
        return super().prepare_inputs(scheduler_output, gathered, batch_desc)


# -- building ---------------------------------------------------------------------


Sync = Callable[..., Any]


def build_model_runner(
    sources: Sources,
    options: EngineOptions,
    policy: CapturePolicy,
    rank: int,
    dp_size: int,
    speculator: Any,
    *,
    sync: Sync,
) -> Any:
    """Rank ``rank``'s real ``GPUModelRunner`` of ``dp_size`` ranks.

    ``sync`` is what the runner's ``dispatch_cg_and_sync_dp`` calls for this
    rank (the release's function, wrapped by the lane's sync recorder);
    ``speculator`` is the rank's speculator or None. ``sources.target`` is
    the sync lane's loaded target of the same release: its manager class,
    graph-mode enum and parallel config.
    """
    target = sources.target
    if policy.microbatching is not None:
        raise TargetError(
            "runner lane: microbatching (vLLM's UBatchRunner) is not modelled"
        )
    if policy.lora_capture_cases is not None:
        raise TargetError("runner lane: LoRA is not modelled")
    if getattr(policy, "encoder_decoder", False):
        raise TargetError("runner lane: encoder-decoder models are not modelled")
    kit = runner_kit(sources, target)
    k = options.num_speculative_tokens
    decode_query_len = options.decode_query_len
    for what, policy_value, engine_value in (
        ("decode_query_len", policy.decode_query_len, decode_query_len),
        ("max_num_seqs", policy.max_num_seqs, options.max_num_seqs),
    ):
        if policy_value != engine_value:
            # One deployment: the runner builds its table from the engine's.
            raise UsageError(
                f"runner lane: the capture policy's {what} ({policy_value}) is not "
                f"the engine's ({engine_value})"
            )
    manager = target.build_manager(
        policy.manager_config(dp_size), target.cudagraph_utils.ModelCudaGraphManager
    )
    install_graphs(manager)
    _bind(kit, manager, sync, _draft_model_speculator(sources, speculator))
    parallel_config = target.parallel_config(dp_size, rank, None)
    max_num_reqs = options.max_num_seqs
    max_num_tokens = options.max_num_batched_tokens
    vllm_config = standin("VllmConfig", parallel_config=parallel_config)
    model = FakeModel(kit.forward_contexts, VOCAB_SIZE)
    req_states = RequestStates(max_num_reqs, k)
    sampler = _Sampler(max_num_reqs)
    eplb: Any = instance(
        kit.eplb_class,
        parallel_config=standin("ParallelConfig", enable_eplb=False),
        device="cpu",
        state=None,
        suppressed=False,
        _has_registered_models=False,
    )
    per_release: dict[str, Any] = {
        name: value
        for name, value in OFF_IN_SOME_RELEASES.items()
        if name in kit.assigned
    }
    if kit.ec_connector is not None:
        per_release["ec_connector"] = kit.ec_connector
    if not hasattr(kit.runner_class, "dp_size"):
        # Attributes set in __init__ before 0.33 (properties since).
        per_release.update(dp_size=dp_size, dp_rank=rank)
    return instance(
        kit.runner_class,
        **per_release,
        InputBatch=kit.InputBatch,
        vllm_config=vllm_config,
        parallel_config=parallel_config,
        model_config=standin("ModelConfig"),
        observability_config=standin("ObservabilityConfig", cudagraph_metrics=False),
        lora_config=None,
        device="cpu",
        dtype=torch.float32,
        vocab_size=VOCAB_SIZE,
        max_model_len=options.max_model_len,
        max_num_tokens=max_num_tokens,
        max_num_reqs=max_num_reqs,
        decode_query_len=decode_query_len,
        num_speculative_steps=k,
        is_encoder_decoder=False,
        is_pooling_model=False,
        use_pp=False,
        is_first_pp_rank=True,
        is_last_pp_rank=True,
        pp_handler=None,
        intermediate_tensors=None,
        ubatch_runner=None,
        check_ep_fault=False,
        dcp_size=1,
        pcp_manager=None,
        supports_mm_inputs=False,
        uses_inputs_embeds=False,
        encoder_cache=None,
        kv_connector=kit.kv_connector,
        aux_output_connector=None,
        pooling_runner=None,
        adaptive_verification=None,
        use_aux_hidden_state_outputs=False,
        batch_sharder=None,
        rejection_sampler=None,
        kv_block_zeroer=None,
        kv_cache_config=standin("KVCacheConfig"),
        attn_groups=[],
        execute_model_state=None,
        main_stream=None,
        output_copy_stream=None,
        _draft_workspace_lane=0,
        cudagraph_manager=manager,
        model=model,
        speculator=speculator,
        req_states=req_states,
        input_buffers=kit.InputBuffers(max_num_reqs, max_num_tokens, "cpu"),
        sampler=sampler,
        eplb=eplb,
        block_tables=_block_tables(max_num_reqs, max_num_tokens),
        model_state=_model_state(model),
        lora_state=standin("LoraState", add_request=_ignore, remove_request=_ignore),
        prompt_logprobs_worker=standin(
            "PromptLogprobsWorker",
            add_request=_ignore,
            remove_request=_ignore,
            compute_prompt_logprobs=lambda *args: {},
            compute_prompt_token_id_logprobs=lambda *args: {},
        ),
        step_timing=standin(
            "StepTimingCollector",
            record_batch=_ignore,
            forward_start=_ignore,
            forward_end=_ignore,
            drafter_start=_ignore,
            drafter_end=_ignore,
        ),
        draft_tokens_handler=draft_tokens_handler(kit),
    )


#: Each rank's sync, by its graph manager (one per rank): the rebuilt class
#: is shared by every rank of a release, its module globals too.
_SYNCS: weakref.WeakKeyDictionary[Any, Sync] = weakref.WeakKeyDictionary()


def _route_sync(manager: Any, *args: Any, **kwargs: Any) -> Any:
    """The runner's ``dispatch_cg_and_sync_dp``: the calling rank's ``sync``,
    found by the manager the real code passes first (its own)."""
    return _SYNCS[manager](manager, *args, **kwargs)


def _draft_model_speculator(sources: Sources, speculator: Any) -> type | None:
    """The class 0.33's ``sample_tokens`` tests the speculator against:
    the speculators module's rebuilt ``DraftModelSpeculator``."""
    if speculator is None:
        return None
    from dpsim.lanes.runner.speculators import draft_model_speculator_class

    return draft_model_speculator_class(sources, sources.target)


def _bind(
    kit: RunnerKit, manager: Any, sync: Sync, speculator_class: type | None
) -> None:
    _SYNCS[manager] = sync
    if speculator_class is not None:
        # The rebuilt methods' namespace (real_class copies globals_ into it).
        namespace = inspect.unwrap(
            cast(Any, kit.runner_class).sample_tokens
        ).__globals__
        namespace["DraftModelSpeculator"] = speculator_class


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


class _Sampler(StrictObject):
    """The sampler: per-request parameters are ignored, and it samples one
    token per request (token id 0), as a step without drafts does; drafts
    are rejected (the modelled scheduler decides acceptance itself)."""

    OWNER = "Sampler"

    def __init__(self, max_num_reqs: int) -> None:
        self.sampling_states = standin(
            "SamplingStates",
            temperature=standin("buffer", gpu=torch.zeros(max_num_reqs)),
            seeds=standin("buffer", gpu=torch.zeros(max_num_reqs, dtype=torch.int64)),
        )
        self.penalties_state = standin("PenaltiesState", output_bin_counts=None)

    def __call__(self, logits: torch.Tensor, input_batch: Any) -> StrictObject:
        num_reqs = input_batch.num_reqs
        return standin(
            "SamplerOutput",
            sampled_token_ids=torch.zeros(num_reqs, 1, dtype=torch.int64),
            num_sampled=torch.ones(num_reqs, dtype=torch.int32),
            num_rejected=torch.zeros(num_reqs, dtype=torch.int32),
        )

    def add_request(self, *args: Any) -> None:
        """Sampling parameters do not change what DP does."""

    def apply_staged_writes(self) -> None:
        """Nothing staged."""


def _block_tables(max_num_reqs: int, max_num_tokens: int) -> StrictObject:
    """Block tables: block ids are accepted and dropped; the tables and slot
    mappings handed to attention are zeros of the real shapes."""

    def tables(num_reqs: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(num_reqs, 1, dtype=torch.int32),)

    return standin(
        "BlockTables",
        append_block_ids=_ignore,
        apply_staged_writes=_ignore,
        gather_block_tables=lambda idx_mapping, num_reqs_padded, **kw: tables(
            num_reqs_padded
        ),
        compute_slot_mappings=lambda idx_mapping, qsl, positions, num_tokens_padded: (
            torch.zeros(1, num_tokens_padded, dtype=torch.int64)
        ),
        get_dummy_block_tables=tables,
        get_dummy_slot_mappings=lambda num_tokens: torch.zeros(
            1, num_tokens, dtype=torch.int64
        ),
    )


def _model_state(model: Any) -> StrictObject:
    """The model state (attention metadata builders, model-specific inputs):
    no layers, so empty metadata and no extra inputs; the sampled logits
    are the model's (0.34's ``compute_sample_logits``, as the default
    ``ModelState`` computes them)."""
    return standin(
        "ModelState",
        compute_sample_logits=model.compute_logits,
        add_request=_ignore,
        remove_request=_ignore,
        apply_staged_writes=_ignore,
        preprocess_state=_ignore,
        postprocess_state=_ignore,
        prepare_attn=lambda *args, **kwargs: {},
        prepare_inputs=lambda input_batch, req_states: {},
        num_new_sampled_tokens_per_step=1,
        supports_mm_inputs=False,
    )
