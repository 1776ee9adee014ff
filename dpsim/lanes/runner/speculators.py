"""The real V2 speculators per virtual rank, their forwards stood in for.

The model runner's ``sample_tokens`` and ``_dummy_run`` call
``speculator.propose(...)``; what a speculator does there decides whether DP
ranks stay in step: its prefill dispatch (reusing the target's agreement),
its early return when there is nothing more to draft, the decode dispatch
and the ``K - 1`` decode forwards of ``_multi_step_decode``, each of which
issues the MoE collectives that hang when ranks disagree (vLLM 26086, 35294,
40589). :func:`build_speculator` rebuilds the release's REAL speculator class
with :func:`~dpsim.lanes.runner.extract.real_class` and gives it per-rank CPU
buffers; these run for real:

* ``propose``, ``_prefill``, ``_run_model``, ``_multi_step_decode``,
  ``_generate_draft`` (0.34: ``_run_multi_step_decode``, which dispatches the
  decode, ``_prepare_decode_inputs`` and ``_decode``, some of them in the
  shared ``AutoRegressiveSpeculator`` base), the lifecycle hooks (MTP's
  among them), ``advance_draft_positions``;
* from ``DraftModelSpeculator``: ``_copy_request_inputs``, ``sample_draft``
  (greedy, on fake logits; 0.34 through the release's ``greedy_argmax``),
  ``_prepare_eplb_forward``, ``_build_uniform_batch_dp_sync`` (0.30+; 0.34
  also agrees the decode's query bound, 1), the draft attention metadata
  builders around a stood-in ``build_attn_metadata`` (0.34: the target's
  metadata reused, ``_build_drafter_attn_metadata``), ``observe_verification``
  (0.34 from ``prepare_propose``), and ``BaseSpeculator``'s request hooks
  (0.34, no-ops for these drafters);
* ``init_cudagraph_manager``, which builds the drafter's prefill and decode
  ``SpeculatorCudaGraphManager`` (the release's class over the release's real
  ``CudaGraphManager``) from the drafter's table of the policy, as the sync
  lane derives it (:func:`dpsim.scenarios.run.tables_for`); from 0.34 it
  reads the split tables the release's own ``VllmConfig`` code resolves
  (:mod:`dpsim.targets.split_sizes`) on a config holding the drafter's
  speculative config, so the decode manager gets the drafter's own request
  grid (``get_draft_decode_cudagraph_request_sizes``: every count up to
  ``max_num_seqs`` for EAGLE and MTP with k >= 2); their ``dispatch`` is
  real, their captured graphs are fakes whose replay forwards;
* ``dispatch_cg_and_sync_dp``: the release's real sync, wrapped by the sync
  recorder (:func:`dpsim.lanes.runner.syncs.recording_sync`), passed in as
  ``sync``. The classes are rebuilt once per release and shared by its
  ranks, so each rank's recorder is found by the drafter graph manager the
  real code passes first (each rank has its own), as the model runner does.

Stood in for: the three triton launchers (``prepare_prefill_inputs``,
``prepare_decode_inputs`` (0.34: its kernel, launched by the speculator),
``update_draft_inputs``: what CPU code reads
back of their results, in CPU torch, :func:`_prepare_prefill_inputs` and
siblings), the draft model
(:class:`~dpsim.lanes.runner.forward.FakeModel`: each forward issues the EP
collectives at the shape of its forward context and leaves a drafter-forward
event), ``set_forward_context`` (the model runner's: one context per virtual
rank, with vLLM's own ``DPMetadata`` count check), the block tables' slot
mappings and the attention backends' metadata (opaque to DP: nothing builds
any), ``build_slot_mappings_by_layer``. Not modelled, so a gap (refusal) when
reached: eagle3's ``combine_hidden_states``, probabilistic draft sampling
(``gumbel_sample``), PCP/DCP, multimodal drafters, EPLB, the fused
multi-step decode (its attention backends are not modelled: the lane runs
vLLM's fallback, one decode graph or eager forward per step), capture.
``@torch.inference_mode()`` is dropped: it is per-thread state in vLLM and
the lane's ranks share a thread, which the installed world keeps in inference
mode for the whole run (``dpsim.targets.runtime``).

Which speculators each release ships and the lane drives (``EngineOptions.
speculator``):

============  ==========================================  ======================
vLLM          ``"ar"`` (target-dependent autoregressive,   ``"mtp"``
              the EAGLE drafter)
============  ==========================================  ======================
0.26 - 0.31   ``spec_decode/autoregressive``               ``spec_decode/mtp``
              ``AutoRegressiveSpeculator``                 ``MTPSpeculator``
0.32 - 0.33   ``spec_decode/target_dependent_ar``          ``spec_decode/mtp``
              ``TargetDependentARSpeculator``              ``MTPSpeculator``
0.34          ``spec_decode/target_dependent_ar``          ``spec_decode/mtp``
              ``TargetDependentARSpeculator``, over        ``MTPSpeculator``
              ``spec_decode/autoregressive``'s
              ``AutoRegressiveSpeculator`` (with the
              graph manager)
============  ==========================================  ======================

Both kinds run on every release from 0.26.0 to 0.34.0, every cudagraph mode
(0.26-0.29's decode dispatch syncs afresh; from 0.30 it reuses the target's
agreement, with no collective; 0.26-0.28's decode-input kernels have no
``sample_src_positions``, so their stand-ins take those releases' arguments;
0.26-0.27 name the uniform-count helper ``get_uniform_token_count``).
``"ar"`` is the class EAGLE's ``EagleSpeculator`` derives from (it adds only
weight loading). Dynamic speculative decoding (a per-batch-size k) is not
modelled: vLLM turns it off under DP, since ranks would pick different k
(0.33+'s ``VllmConfig._maybe_disable_dynamic_sd_for_data_parallel``), so
each table has one decode query length. A
release or tree without them is refused in one line naming what is missing.
MTP's ``load_draft_model`` is not run (it loads weights): its
``share_mtp_topk_indices`` keeps the class default (False: a drafter without
``set_skip_topk``), so its hooks run their real, inert branch.
"""

from __future__ import annotations

import ast
import functools
import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsim.boundary import register_file
from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.extract import class_node, find_class, real_class
from dpsim.lanes.runner.forward import (
    HIDDEN_SIZE,
    FakeModel,
    ForwardContexts,
    install_graphs,
)
from dpsim.lanes.runner.model_runner import NoWatermarkSampler, RunnerKit, runner_kit
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import StrictObject, asked_at, gap, instance, standin
from dpsim.lanes.runner.syncs import record_drafter_forward
from dpsim.records.policy import CapturePolicy
from dpsim.scenarios.run import tables_for
from dpsim.targets.load import Target
from dpsim.targets.manager import _vllm_config as manager_vllm_config
from dpsim.targets.shim import is_stub, parse_source

#: The speculator kinds the lane drives (``EngineOptions.speculator``).
KINDS = ("ar", "mtp")
#: The draft model's vocabulary: small, the logits are never read.
VOCAB_SIZE = 8

_SPEC_DECODE = "vllm.v1.worker.gpu.spec_decode"
_BASE_MODULE = f"{_SPEC_DECODE}.speculator"
_MTP_MODULE = f"{_SPEC_DECODE}.mtp.speculator"
_BASE_CLASS = "DraftModelSpeculator"
_ABSTRACT_CLASS = "BaseSpeculator"
_MTP_CLASS = "MTPSpeculator"
_GRAPHS_CLASS = "SpeculatorCudaGraphManager"
#: 0.34+: the greedy draft sampler (its CPU path is ``argmax`` with NaNs
#: as -inf; the triton path serves CUDA logits only).
GREEDY_MODULE = "vllm.v1.worker.gpu.sample.greedy_argmax"
_GRAPHS_DESCRIPTOR = "SpeculatorBatchDescriptor"


@dataclass(frozen=True)
class _Layout:
    """Where one release keeps its target-dependent autoregressive speculator."""

    package: str
    class_name: str
    #: Where its ``SpeculatorCudaGraphManager`` lives.
    graphs_package: str
    #: 0.34+: the autoregressive speculators' shared base between
    #: ``DraftModelSpeculator`` and the class (package, class name), which
    #: holds the decode manager and the multi-step decode.
    shared: tuple[str, str] | None = None

    @property
    def module(self) -> str:
        return f"{self.package}.speculator"

    @property
    def graphs_module(self) -> str:
        return f"{self.graphs_package}.cudagraph_utils"

    @property
    def shared_module(self) -> str | None:
        return None if self.shared is None else f"{self.shared[0]}.speculator"

    @property
    def modules(self) -> tuple[str, ...]:
        shared = self.shared_module
        return (self.module, self.graphs_module, *(() if shared is None else (shared,)))


_AUTOREGRESSIVE = f"{_SPEC_DECODE}.autoregressive"
_TARGET_DEPENDENT = f"{_SPEC_DECODE}.target_dependent_ar"
#: Newest first: 0.32 renamed ``autoregressive`` to ``target_dependent_ar``;
#: 0.34 put a new ``autoregressive`` package under it, the shared base of
#: every autoregressive drafter, with the drafter's graph manager.
_LAYOUTS = (
    _Layout(
        _TARGET_DEPENDENT,
        "TargetDependentARSpeculator",
        _AUTOREGRESSIVE,
        shared=(_AUTOREGRESSIVE, "AutoRegressiveSpeculator"),
    ),
    _Layout(_TARGET_DEPENDENT, "TargetDependentARSpeculator", _TARGET_DEPENDENT),
    _Layout(_AUTOREGRESSIVE, "AutoRegressiveSpeculator", _AUTOREGRESSIVE),
)

#: ``DraftModelSpeculator``'s methods on the paths of ``propose`` and of the
#: model runner's calls, whichever the release defines (one its code asks
#: for but it lacks is a gap).
_BASE_METHODS = (
    "max_model_len",
    "_prepare_eplb_forward",
    "_copy_request_inputs",
    "_build_uniform_batch_dp_sync",
    "_build_attn_metadata",
    "_build_uniform_attn_metadata",
    "_build_draft_attn_metadata",
    "compute_draft_logits",
    "get_draft_top_tokens",
    "_greedy_sample_draft",
    "sample_draft",
    "_maybe_predict_acceptance",
    "observe_verification",
    "prepare_watermarking",
    # 0.34+: the draft prefill's metadata (the target's, when reusable) and
    # the model runner's per-step call before propose.
    "_build_drafter_attn_metadata",
    "prepare_propose",
)
#: ``BaseSpeculator``'s concrete methods the model runner calls (0.34+:
#: no-op defaults the lane's speculators inherit).
_ABSTRACT_METHODS = ("add_request", "on_requests_finished")
#: Required of ``DraftModelSpeculator`` in every release the lane drives.
_BASE_REQUIRED = ("_prepare_eplb_forward", "_copy_request_inputs", "sample_draft")
#: The autoregressive speculator's methods the lane runs, all required
#: (0.34 keeps some in the shared base; 0.34 renamed ``_generate_draft``
#: ``_decode``, one of which must be there).
_AR_REQUIRED = (
    "init_cudagraph_manager",
    "propose",
    "_run_model",
    "_prefill",
    "_multi_step_decode",
)
_AR_OPTIONAL = (
    "_generate_draft",  # through 0.33
    # 0.34+: the decode dispatch and its inputs, then one draft step.
    "_run_multi_step_decode",
    "_prepare_decode_inputs",
    "_decode",
)
_DRAFT_STEPS = ("_generate_draft", "_decode")
#: Its lifecycle hooks (MTP overrides them), whichever the release has.
_HOOKS = (
    "on_prefill_begin",
    "on_prefill_end",
    "on_multi_step_decode_begin",
    "on_multi_step_decode_end",
    "advance_draft_positions",
)
#: The methods whose ``self.X = ...`` assignments say which attributes the
#: release's real speculator object has (see :func:`_assigned`).
_BUILDERS = ("__init__", "set_attn", "load_model", "load_draft_model")
#: vLLM's per-thread state, dropped: the lane's ranks share a thread, and run
#: CPU tensors without autograd.
_DECORATORS: Mapping[str, None] = {"torch.inference_mode()": None}


#: The lane's sources (:mod:`.sources`), as this module's signatures name them.
Sources = RunnerSources


Sync = Callable[..., Any]


@dataclass(frozen=True)
class SpeculatorClasses:
    """One release's rebuilt speculator classes, shared by its ranks (a
    rebuild parses and compiles a file: tens of milliseconds)."""

    #: The real ``BaseSpeculator``: its literal settings, no methods.
    abstract: type
    #: The real ``DraftModelSpeculator`` (what the model runner's
    #: ``isinstance(self.speculator, DraftModelSpeculator)`` names).
    draft_model: type
    #: Per kind, the class a rank's speculator is made of: the real
    #: autoregressive (EAGLE) speculator, and MTP on top of it.
    kinds: Mapping[str, type]
    #: Per kind, the ``self`` attributes the release's real object of that
    #: kind has (those its builders, ``__init__``, ``set_attn``, ... set).
    attributes: Mapping[str, frozenset[str]]
    #: The speculators' ``set_forward_context``, which their model reads.
    contexts: ForwardContexts
    #: The drafter's ``SpeculatorCudaGraphManager`` over the release's manager.
    graphs: type


def build_speculator(
    sources: Sources,
    options: EngineOptions,
    policy: CapturePolicy,
    rank: int,
    dp_size: int,
    *,
    sync: Sync,
    target: Target | None = None,
) -> Any:
    """Rank ``rank``'s speculator for ``options.speculator``, or None without one.

    ``sync`` is what the speculator's ``dispatch_cg_and_sync_dp`` calls on
    this rank (its sync recorder); ``target`` the sync lane's loaded target of
    the same release, ``sources.target`` by default (its graph-mode enum,
    descriptors and manager class, which the drafter's managers share with
    the model runner's: enum members compare by identity). Buffers are per
    rank, CPU tensors sized as vLLM sizes them from ``options``; the
    drafter's graph managers are built by the real ``init_cudagraph_manager``
    from the policy's drafter table (:func:`dpsim.scenarios.run.tables_for`).
    """
    kind = options.speculator
    if kind is None:
        return None
    if kind not in KINDS:
        raise UsageError(
            f"runner lane: unknown speculator {kind!r} (known: {', '.join(KINDS)})"
        )
    k = options.num_speculative_tokens
    if policy.decode_query_len != 1 + k:
        raise UsageError(
            f"runner lane: the policy's decode_query_len ({policy.decode_query_len}) "
            f"must be 1 + num_speculative_tokens ({1 + k}), as vLLM derives it"
        )
    target = target or sources.target
    classes = speculator_classes(sources, target)
    made = classes.kinds.get(kind)
    if made is None:
        raise TargetError(
            f"runner lane: vLLM {_shown(sources.version)} has no MTP speculator the "
            "lane can drive: no v1/worker/gpu/spec_decode/mtp/speculator.py"
        )
    tables = tables_for(target, policy, dp_size)
    # The drafter's managers read the sync lane's view of a config, as the
    # sync lane's managers do; the speculator and its forward context also
    # read the model's length and this rank's place in the DP group.
    vllm_config = manager_vllm_config(
        tables.drafter_prefill,
        target.compilation.__dict__.get("CompilationConfig"),
        target.CUDAGraphMode[tables.drafter_prefill.cudagraph_mode],
        target.split_sizes,
    )
    vllm_config.model_config = standin(
        "ModelConfig", max_model_len=options.max_model_len
    )
    vllm_config.parallel_config = target.parallel_config(
        dp_size, rank, policy.microbatching
    )
    # One object, as in vLLM: the speculator's and its config's.
    speculative_config = _speculative_config(kind, k)
    vllm_config.speculative_config = speculative_config
    if target.split_sizes is not None:
        # 0.34+: the drafter's managers read the split tables VllmConfig
        # resolved at start-up, for the target's decode length and with this
        # drafter's own decode grid (get_draft_decode_cudagraph_request_sizes);
        # unresolved, they would hold no graph at all.
        vllm_config.scheduler_config.max_num_batched_tokens = (
            options.max_num_batched_tokens
        )
        target.split_sizes.resolve(vllm_config)
    values = _attributes(
        kind,
        options,
        rank=rank,
        dp_size=dp_size,
        vllm_config=vllm_config,
        model=FakeModel(
            classes.contexts,
            VOCAB_SIZE,
            extra_inputs=("hidden_states",),
            on_forward=record_drafter_forward,
        ),
        # vLLM caps capture sizes at max_num_batched_tokens; a case's policy
        # need not, so the buffers also hold the largest padded batch.
        tokens=max(
            options.max_num_batched_tokens,
            tables.target.effective_max_capture_size,
            tables.drafter_prefill.effective_max_capture_size,
        ),
    )
    allowed = classes.attributes[kind]
    speculator: Any = instance(
        made, **{name: value for name, value in values.items() if name in allowed}
    )
    speculator.init_cudagraph_manager(
        target.CUDAGraphMode[tables.drafter_prefill.cudagraph_mode]
    )
    for manager in (
        speculator.prefill_cudagraph_manager,
        speculator.decode_cudagraph_manager,
    ):
        # What capture leaves behind (capture itself runs the model on a GPU):
        # a graph per FULL descriptor, whose replay is a drafter forward.
        manager._graphs_captured = True
        install_graphs(manager, hidden_states=False, on_forward=record_drafter_forward)
        _SYNCS[manager] = sync
    return speculator


def draft_model_speculator_class(sources: Sources, target: Target) -> type:
    """The release's real ``DraftModelSpeculator``, rebuilt: what the model
    runner's ``isinstance(self.speculator, DraftModelSpeculator)`` must name."""
    return speculator_classes(sources, target).draft_model


#: Each rank's sync, by the drafter's graph managers (two per rank): the
#: rebuilt classes, and so their module globals, serve every rank of a release.
_SYNCS: weakref.WeakKeyDictionary[Any, Sync] = weakref.WeakKeyDictionary()


def _route_sync(manager: Any, *args: Any, **kwargs: Any) -> Any:
    """The speculator's ``dispatch_cg_and_sync_dp``: the calling rank's sync,
    found by the manager the real code passes first (its own)."""
    try:
        found = _SYNCS.get(manager)
    except TypeError:  # not a manager at all (None cannot be weakly referenced)
        found = None
    if found is None:
        raise gap(f"dispatch_cg_and_sync_dp with an unknown manager at {asked_at()}")
    return found(manager, *args, **kwargs)


@functools.lru_cache(maxsize=16)
def speculator_classes(sources: Sources, target: Target) -> SpeculatorClasses:
    """The release's speculator classes, rebuilt once per sources object (one
    per run or campaign) and shared by its ranks."""
    layout = _layout(sources)
    modules = [_BASE_MODULE, *layout.modules]
    modules += [_MTP_MODULE] if sources.has(_MTP_MODULE) else []
    paths = tuple((module, sources.path(module)) for module in modules)
    version = sources.version
    # What the drafter borrows from the model runner's release kit: its
    # forward contexts (one per rank, with vLLM's DPMetadata count check)
    # and the real helpers both call.
    kit = runner_kit(sources, target)
    path_of = dict(paths)
    modes = target.CUDAGraphMode
    base_path = path_of[_BASE_MODULE]
    abstract_tree = class_node(base_path, _ABSTRACT_CLASS, version=version)
    base_tree = class_node(base_path, _BASE_CLASS, version=version)
    ar_tree = class_node(path_of[layout.module], layout.class_name, version=version)
    _check_derives(base_tree, _ABSTRACT_CLASS, base_path, version)
    # vLLM's hierarchy as the files write it. BaseSpeculator keeps its
    # literal settings (num_query_per_req, ...: the model runner reads them
    # through the speculator) and its concrete no-op hooks; the rest of its
    # methods are abstract.
    abstract = real_class(
        base_path,
        _ABSTRACT_CLASS,
        _present(abstract_tree, _ABSTRACT_METHODS, ()),
        version=version,
        globals_={},
    )
    draft_model = real_class(
        base_path,
        _BASE_CLASS,
        _present(base_tree, _BASE_METHODS, _BASE_REQUIRED),
        version=version,
        globals_={
            "torch": torch,
            "np": np,
            "replace": replace,
            "partial": functools.partial,
            "CUDAGraphMode": modes,
            "build_attn_metadata": _launcher(
                "build_attn_metadata", _build_attn_metadata
            ),
            # Watermarking is off: the runner's sampler is no instance of it.
            "GPUWatermarkSampler": NoWatermarkSampler,
            **_greedy_argmax(sources),
        },
        bases=(abstract,),
        decorators=_DECORATORS,
    )
    contexts = kit.forward_contexts
    graphs = _graphs_class(path_of[layout.graphs_module], version, target)
    # 0.29 gave the decode-input kernels a sample_src_positions buffer; each
    # release's launchers get the stand-in of their own parameter list.
    with_src = "sample_src_positions" in _parameters(
        path_of[layout.module], "update_draft_inputs"
    )
    ar_globals = {
        "torch": torch,
        "CUDAGraphMode": modes,
        "BatchDescriptor": _borrowed(kit, "BatchDescriptor", version),
        "set_forward_context": contexts.set_forward_context,
        "dispatch_cg_and_sync_dp": _route_sync,
        **_uniform_counts(kit, version),
        "build_slot_mappings_by_layer": _launcher(
            "build_slot_mappings_by_layer", _build_slot_mappings_by_layer
        ),
        "prepare_prefill_inputs": _launcher(
            "prepare_prefill_inputs", _prepare_prefill_inputs
        ),
        "prepare_decode_inputs": _launcher(
            "prepare_decode_inputs",
            _prepare_decode_inputs if with_src else _prepare_decode_inputs_028,
        ),
        "update_draft_inputs": _launcher(
            "update_draft_inputs",
            _update_draft_inputs if with_src else _update_draft_inputs_028,
        ),
        # 0.34: the decode-input kernel, launched from the speculator's own
        # _prepare_decode_inputs.
        "_prepare_decode_inputs_kernel": _Kernel(
            "_prepare_decode_inputs_kernel", _prepare_decode_inputs_kernel
        ),
        _GRAPHS_CLASS: graphs,
    }
    ar_base = draft_model
    ar_trees = [abstract_tree, base_tree]
    required = set(_AR_REQUIRED)
    defined = _defined(ar_tree)
    if layout.shared is not None:
        shared_module, shared_class = layout.shared
        shared_path = path_of[layout.shared_module or shared_module]
        shared_tree = class_node(shared_path, shared_class, version=version)
        _check_derives(shared_tree, _BASE_CLASS, shared_path, version)
        _check_derives(ar_tree, shared_class, path_of[layout.module], version)
        ar_base = real_class(
            shared_path,
            shared_class,
            _present(shared_tree, _AR_REQUIRED + _AR_OPTIONAL + _HOOKS, ()),
            version=version,
            globals_=ar_globals,
            bases=(draft_model,),
            decorators=_DECORATORS,
        )
        ar_trees.append(shared_tree)
        required -= _defined(shared_tree)
        defined |= _defined(shared_tree)
    else:
        _check_derives(ar_tree, _BASE_CLASS, path_of[layout.module], version)
    if not defined & set(_DRAFT_STEPS):
        raise TargetError(
            f"runner lane: vLLM {_shown(version)}'s autoregressive speculator "
            f"has neither {' nor '.join(_DRAFT_STEPS)}, the draft step the lane runs"
        )
    autoregressive = real_class(
        path_of[layout.module],
        layout.class_name,
        _present(
            ar_tree,
            _AR_REQUIRED + _AR_OPTIONAL + _HOOKS,
            [name for name in _AR_REQUIRED if name in required],
        ),
        version=version,
        globals_=ar_globals,
        bases=(ar_base,),
        decorators=_DECORATORS,
    )
    ar_trees.append(ar_tree)
    kinds = {"ar": autoregressive}
    attributes = {"ar": frozenset(_assigned(ar_trees))}
    if _MTP_MODULE in path_of:
        mtp_path = path_of[_MTP_MODULE]
        mtp_tree = class_node(mtp_path, _MTP_CLASS, version=version)
        _check_derives(
            mtp_tree, layout.class_name, mtp_path, version, refusing="an MTP speculator"
        )
        kinds["mtp"] = real_class(
            mtp_path,
            _MTP_CLASS,
            _present(mtp_tree, _HOOKS, ()),
            version=version,
            globals_={},
            bases=(autoregressive,),
            decorators=_DECORATORS,
        )
        attributes["mtp"] = frozenset(_assigned((*ar_trees, mtp_tree)))
    return SpeculatorClasses(
        abstract=abstract,
        draft_model=draft_model,
        kinds=kinds,
        attributes=attributes,
        contexts=contexts,
        graphs=graphs,
    )


def real_classes(sources: Sources, target: Target | None = None) -> tuple[type, ...]:
    """The release's speculator classes rebuilt from its files (each one's
    real methods: ``cls.DPSIM_ORIGIN.codes()``), for line coverage; what
    they are given instead of vLLM's is :data:`STOOD_IN`."""
    classes = speculator_classes(sources, target or sources.target)
    # 0.34+: the shared autoregressive base between DraftModelSpeculator and
    # the kinds, rebuilt from its own file.
    shared = [
        base
        for base in classes.kinds["ar"].__mro__[1:]
        if "DPSIM_ORIGIN" in base.__dict__
        and base not in (classes.draft_model, classes.abstract)
    ]
    return (
        classes.draft_model,
        *classes.kinds.values(),
        classes.graphs,
        classes.abstract,
        *shared,
    )


#: What the speculators' real methods are given in place of vLLM's, and why
#: (for ``dpsim targets --lane runner``).
STOOD_IN: dict[str, str] = {
    "prepare_prefill_inputs, prepare_decode_inputs, update_draft_inputs": (
        "triton kernels; what CPU code reads back of their results (last-token "
        "indices, each step's draft column)"
    ),
    "model": "the draft model; EP collectives at the chosen shape, a "
    "drafter-forward event each (forward.FakeModel)",
    "prefill/decode_cudagraph_manager.graphs": "captured graphs; replay is a "
    "drafter forward (forward.FakeGraph); the managers themselves are real",
    "set_forward_context": "per-thread forward context; per virtual rank, the "
    "model runner's (forward.ForwardContexts)",
    "block_tables, build_slot_mappings_by_layer, build_attn_metadata": (
        "KV slots and attention metadata, read only by attention kernels; none built"
    ),
    "input_buffers": "GPU input buffers; CPU tensors of the real shapes",
    "load_model, set_attn, capture": "weights, attention backends, CUDA graph "
    "capture; not run (their attributes set as they set them)",
}


# -- reading the release ------------------------------------------------------


def _shown(version: str | None) -> str:
    return version or "(this tree)"


def _layout(sources: Sources) -> _Layout:
    for layout in _LAYOUTS:
        if all(sources.has(module) for module in layout.modules):
            return layout
    raise TargetError(
        f"runner lane: vLLM {_shown(sources.version)} has no target-dependent "
        "autoregressive speculator the lane can drive (neither "
        "spec_decode/target_dependent_ar/speculator.py nor "
        "spec_decode/autoregressive/speculator.py)"
    )


def _present(
    node: ast.ClassDef, wanted: Iterable[str], required: Iterable[str]
) -> list[str]:
    """The ``wanted`` methods the class defines, ``required`` always (a
    missing required one is :func:`real_class`'s one-line refusal)."""
    defined = _defined(node)
    needed = set(required)
    return [name for name in wanted if name in defined or name in needed]


def _defined(node: ast.ClassDef) -> set[str]:
    """The methods (and properties) the class statement defines itself and
    implements (an ``@abstractmethod`` is a subclass's to implement)."""
    return {
        part.name
        for part in node.body
        if isinstance(part, ast.FunctionDef | ast.AsyncFunctionDef)
        and not any(
            ast.unparse(decorator) in ("abstractmethod", "abc.abstractmethod")
            for decorator in part.decorator_list
        )
    }


def _assigned(
    classes: Iterable[ast.ClassDef], builders: Iterable[str] = _BUILDERS
) -> set[str]:
    """The attributes the classes' ``builders`` (``__init__``, ``set_attn``,
    ...) give ``self``: what the release's real object holds. The lane
    sets only those of its values, so a release that dropped an attribute
    its code still read would be refused (a gap), not answered."""
    wanted = frozenset(builders)
    names: set[str] = set()
    for node in classes:
        for part in node.body:
            if not (isinstance(part, ast.FunctionDef) and part.name in wanted):
                continue
            for statement in ast.walk(part):
                targets: list[ast.expr] = []
                if isinstance(statement, ast.Assign):
                    targets = list(statement.targets)
                elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
                    targets = [statement.target]
                names.update(
                    leaf.attr
                    for target in targets
                    for leaf in ast.walk(target)
                    if isinstance(leaf, ast.Attribute)
                    and isinstance(leaf.value, ast.Name)
                    and leaf.value.id == "self"
                )
    return names


def _check_derives(
    node: ast.ClassDef,
    base: str,
    path: Path,
    version: str | None,
    *,
    refusing: str = "a speculator",
) -> None:
    """Refuse a release whose class does not derive from ``base`` as the
    lane rebuilds it (vLLM's hierarchy, whose methods the class inherits)."""
    bases = [ast.unparse(part) for part in node.bases]
    if base not in bases:
        raise TargetError(
            f"runner lane: vLLM {_shown(version)} has no {refusing} the lane "
            f"can drive: {path.name}'s {node.name} derives from "
            f"{', '.join(bases) or 'nothing'}, not {base}"
        )


def _greedy_argmax(sources: Sources) -> dict[str, Any]:
    """The release's ``greedy_argmax`` (0.34+; before, ``sample_draft``
    takes ``logits.argmax`` inline), as a global of the draft sampler."""
    if not sources.has(GREEDY_MODULE):
        return {}
    found = sources.load_module(GREEDY_MODULE, lenient=True).__dict__.get(
        "greedy_argmax"
    )
    if found is None or is_stub(found):
        raise TargetError(
            f"runner lane: vLLM {_shown(sources.version)}'s "
            "v1/worker/gpu/sample/greedy_argmax.py gives no greedy_argmax the "
            "lane can run"
        )
    return {"greedy_argmax": found}


def _uniform_counts(kit: RunnerKit, version: str | None) -> dict[str, Any]:
    """The release's uniform-token-count helper under the name(s) it has
    (``get_uniform_decode_token_count`` from 0.28, ``get_uniform_token_count``
    before)."""
    names = ("get_uniform_decode_token_count", "get_uniform_token_count")
    found = {name: kit.globals_[name] for name in names if name in kit.globals_}
    if not found:
        _borrowed(kit, names[0], version)  # its one-line refusal
    return found


def _borrowed(kit: RunnerKit, name: str, version: str | None) -> Any:
    """A real vLLM helper the model runner's kit loaded (both call it)."""
    value = kit.globals_.get(name)
    if value is None:
        raise TargetError(
            f"runner lane: vLLM {_shown(version)} gives no {name} the speculators "
            "can run"
        )
    return value


def _graphs_class(path: Path, version: str | None, target: Target) -> type:
    """The release's ``SpeculatorCudaGraphManager`` over the sync lane's real
    ``CudaGraphManager`` of the same release, so descriptors, modes and
    dispatch are the very ones the model runner's manager uses. Its capture
    is not kept (it runs the model on a GPU)."""
    namespace: dict[str, Any] = {
        "CUDAGraphMode": target.CUDAGraphMode,
        "replace": replace,
    }
    descriptor = _top_level_class(
        path,
        _GRAPHS_DESCRIPTOR,
        {
            "dataclass": dataclass,
            "BatchExecutionDescriptor": target.BatchExecutionDescriptor,
        },
    )
    if descriptor is not None:
        namespace[_GRAPHS_DESCRIPTOR] = descriptor
    node = class_node(path, _GRAPHS_CLASS, version=version)
    _check_derives(node, "CudaGraphManager", path, version)
    # Before 0.32 the class adds only capture (not kept): what runs is the base's.
    return real_class(
        path,
        _GRAPHS_CLASS,
        _present(node, ("specialize_spec_tokens",), ()),
        version=version,
        globals_=namespace,
        bases=(target.manager_class,),
    )


def _top_level_class(path: Path, name: str, namespace: dict[str, Any]) -> type | None:
    """Execute the file's class statement ``name`` alone (decorators and
    annotations as written: a dataclass needs them) in ``namespace``,
    compiled with the file's real name and lines; None when it has none."""
    node = find_class(path, name)
    if node is None:
        return None
    module = ast.Module(body=[node], type_ignores=[])
    register_file(path)
    exec(compile(module, str(path), "exec", dont_inherit=True), namespace)
    made = namespace[name]
    assert isinstance(made, type)
    return made


# -- a rank's state -----------------------------------------------------------


def _attributes(
    kind: str,
    options: EngineOptions,
    *,
    rank: int,
    dp_size: int,
    vllm_config: Any,
    model: Any,
    tokens: int,
) -> dict[str, Any]:
    """Every attribute a release's speculator builders may give ``self``,
    with the lane's values (CPU tensors sized as vLLM sizes them). Features
    the lane does not model are off, as they are by default: multimodal
    inputs, PCP/DCP, EPLB, adaptive verification, watermarking,
    probabilistic drafting, the fused decode."""
    k = options.num_speculative_tokens
    reqs = options.max_num_seqs
    draft_tokens = torch.zeros(reqs, k, dtype=torch.int64)
    return {
        "vllm_config": vllm_config,
        "device": torch.device("cpu"),
        "speculative_config": vllm_config.speculative_config,
        "method": _METHODS[kind],
        "num_speculative_steps": k,
        "max_num_reqs": reqs,
        "max_num_tokens": options.max_num_batched_tokens,
        "max_model_len": options.max_model_len,
        # 0.34+: the length limit draft steps read on the device.
        "max_model_len_gpu": torch.tensor(options.max_model_len, dtype=torch.int32),
        # 0.34+: the draft prefill reuses the target's attention metadata
        # (the class default; only a microbatched target turns it off).
        "can_reuse_target_attn_metadata": True,
        "draft_max_seq_len": options.max_model_len,
        "hidden_size": HIDDEN_SIZE,
        "vocab_size": VOCAB_SIZE,
        "dtype": torch.float32,
        "use_fp64_gumbel": False,
        "use_local_argmax_reduction": False,
        "dp_size": dp_size,
        "dp_rank": rank,
        "dcp_size": 1,
        "eplb_state": None,
        "input_buffers": standin(
            "InputBuffers",
            input_ids=torch.zeros(tokens, dtype=torch.int32),
            positions=torch.zeros(tokens, dtype=torch.int64),
            query_start_loc=torch.zeros(reqs + 1, dtype=torch.int32),
            seq_lens=torch.zeros(reqs, dtype=torch.int32),
        ),
        "idx_mapping": torch.zeros(reqs, dtype=torch.int64),
        "temperature": torch.zeros(reqs, dtype=torch.float32),
        "seeds": torch.zeros(reqs, dtype=torch.int64),
        "draft_tokens": draft_tokens,
        "arange_np": np.arange(reqs + 1, dtype=np.int32),
        "arange": torch.arange(reqs + 1, dtype=torch.int32),
        "draft_is_prefilling": torch.zeros(reqs, dtype=torch.bool),
        "draft_token_confidence_probs": torch.zeros(reqs, k, dtype=torch.float32),
        "enable_adaptive_verification": False,
        "use_acceptance_estimator": False,
        "acceptance_estimator": None,
        "draft_logits": None,
        "draft_watermarker": None,
        "supports_mm_inputs": False,
        "pcp_manager": None,
        "supports_decode_metadata_update": False,
        "use_fused_multi_step_decode": False,
        "hidden_states": torch.zeros(tokens, HIDDEN_SIZE),
        "current_draft_step": torch.tensor(0, dtype=torch.int64),
        "last_token_indices": torch.zeros(reqs, dtype=torch.int64),
        "sample_src_positions": torch.zeros(reqs, dtype=torch.int64),
        "inputs_embeds": None,
        "prefill_cudagraph_manager": None,
        "decode_cudagraph_manager": None,
        "model": model,
        "draft_attn_layer_names": frozenset(),
        "kv_cache_config": standin("KVCacheConfig"),
        "attn_groups": [],
        "block_tables": standin(
            "BlockTables",
            compute_slot_mappings=_launcher(
                "BlockTables.compute_slot_mappings", _compute_slot_mappings
            ),
            input_block_tables=[torch.zeros(reqs, 1, dtype=torch.int32)],
            slot_mappings=torch.zeros(1, tokens, dtype=torch.int64),
            cp_size=1,
            cp_rank=0,
            cp_interleave=1,
        ),
        # MTP's load_draft_model sets it from the draft model's hooks; the
        # lane's drafter has none (no shared top-k indices).
        "share_mtp_topk_indices": False,
    }


#: ``speculative_config.method`` of each kind (only eagle3 changes a branch).
_METHODS = {"ar": "eagle", "mtp": "mtp"}


def _speculative_config(kind: str, k: int) -> StrictObject:
    """The deployment's ``SpeculativeConfig`` as the speculator and the
    capture-size resolution ask it: EAGLE or single-module MTP drafting k
    tokens, no dynamic speculative decoding (vLLM turns it off under DP),
    no adaptive verification."""
    return standin(
        "SpeculativeConfig",
        method=_METHODS[kind],
        num_speculative_tokens=k,
        enable_adaptive_verification=False,
        uses_dynamic_speculative_decoding=lambda: False,
        use_multi_module_mtp=lambda: False,
        use_gemma4_mtp=lambda: False,
    )


# -- stand-ins for triton launchers and GPU-side helpers ----------------------


def _launcher(name: str, implementation: Callable[..., Any]) -> Callable[..., Any]:
    """``implementation`` as the stand-in for vLLM's ``name``: a call it was not
    written for (other arguments: vLLM changed the call) is a gap, not a
    ``TypeError`` inside vLLM's code that would read as a crash of vLLM's."""

    @functools.wraps(implementation)
    def launch(*args: Any, **kwargs: Any) -> Any:
        try:
            return implementation(*args, **kwargs)
        except TypeError as error:
            trace = error.__traceback__
            if trace is None or trace.tb_next is not None:
                raise  # raised inside the stand-in, not by the call
            # The call itself did not bind (no frame of the stand-in ran);
            # the signature is read only then, not on every launch.
            try:
                inspect.signature(implementation).bind(*args, **kwargs)
            except TypeError as unbound:
                error = unbound
            raise gap(
                f"{name} called with arguments its stand-in does not take ({error}) "
                f"at {asked_at()}"
            ) from None

    return launch


class _Kernel:
    """A triton kernel the real code launches itself (``kernel[grid](...)``):
    the grid is taken, and the launch is ``implementation``'s, as for
    :func:`_launcher`."""

    def __init__(self, name: str, implementation: Callable[..., Any]) -> None:
        self._launch = _launcher(name, implementation)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._launch


def _prepare_decode_inputs_kernel(
    draft_tokens: torch.Tensor,
    draft_tokens_stride: int,
    target_seq_lens: torch.Tensor,
    num_rejected: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    sample_src_positions: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    *,
    BLOCK_SIZE: int,
    ADVANCE_DRAFT_POSITIONS: bool,
) -> None:
    """0.34's decode-input kernel (its ``prepare_decode_inputs`` launcher
    before): as :func:`_prepare_decode_inputs`, it writes only what the
    stood-in model, attention and probabilistic sampling read."""


def _prepare_prefill_inputs(
    last_token_indices: torch.Tensor,
    current_draft_step: torch.Tensor,
    input_buffers: Any,
    input_batch: Any,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    last_sampled: torch.Tensor,
    next_prefill_tokens: torch.Tensor,
    max_num_reqs: int,
) -> torch.Tensor:
    """The triton kernel, as far as CPU code reads its results: each request's
    last accepted token (which ``_prefill`` indexes with) and the draft step
    reset. The draft's token ids, positions, query starts and sequence
    lengths it also writes are read only by the model and the attention
    kernels, both stood in for."""
    n = input_batch.num_reqs
    ends = input_batch.query_start_loc[1 : n + 1]
    last_token_indices[:n] = ends - 1 - num_rejected[:n]
    last_token_indices[n:] = 0
    current_draft_step.fill_(0)
    return last_token_indices


def _prepare_decode_inputs(
    draft_tokens: torch.Tensor,
    target_seq_lens: torch.Tensor,
    num_rejected: torch.Tensor,
    input_buffers: Any,
    sample_src_positions: torch.Tensor,
    max_model_len: int,
    max_num_reqs: int,
    advance_draft_positions: bool = True,
) -> None:
    """The triton kernel: it writes the decode steps' token ids, positions,
    query starts, sequence lengths and sampling keys, which only the model,
    the attention kernels and probabilistic sampling read (all stood in for
    or off), so nothing is written here."""


def _update_draft_inputs(
    draft_tokens: torch.Tensor,
    current_draft_step: torch.Tensor,
    hidden_states: torch.Tensor,
    output_draft_tokens: torch.Tensor,
    next_input_hidden_states: torch.Tensor,
    input_buffers: Any,
    sample_src_positions: torch.Tensor,
    num_reqs: int,
    max_model_len: int,
    num_speculative_steps: int,
    advance_draft_positions: bool = True,
) -> None:
    """The triton kernel, as far as CPU code reads its results: the step's
    draft token, in its own column of the drafts ``propose`` returns. (The
    next step's inputs it also writes are read only by the stood-in model.)"""
    _write_draft_step(draft_tokens, current_draft_step, output_draft_tokens, num_reqs)


def _write_draft_step(
    draft_tokens: torch.Tensor,
    current_draft_step: torch.Tensor,
    output_draft_tokens: torch.Tensor,
    num_reqs: int,
) -> None:
    """The step's draft tokens into their column of the drafts."""
    step = int(current_draft_step)
    output_draft_tokens[:num_reqs, step] = draft_tokens[:num_reqs]


def _prepare_decode_inputs_028(
    draft_tokens: torch.Tensor,
    target_seq_lens: torch.Tensor,
    num_rejected: torch.Tensor,
    input_buffers: Any,
    max_model_len: int,
    max_num_reqs: int,
    advance_draft_positions: bool = True,
) -> None:
    """0.26-0.28's form of the kernel (no ``sample_src_positions``; 0.29
    added it): as :func:`_prepare_decode_inputs`, nothing CPU code reads back."""


def _update_draft_inputs_028(
    draft_tokens: torch.Tensor,
    current_draft_step: torch.Tensor,
    hidden_states: torch.Tensor,
    output_draft_tokens: torch.Tensor,
    next_input_hidden_states: torch.Tensor,
    input_buffers: Any,
    num_reqs: int,
    max_model_len: int,
    num_speculative_steps: int,
    advance_draft_positions: bool = True,
) -> None:
    """0.26-0.28's form of the kernel (no ``sample_src_positions``): the same
    draft-token write as :func:`_update_draft_inputs`."""
    _write_draft_step(draft_tokens, current_draft_step, output_draft_tokens, num_reqs)


def _parameters(path: Path, function: str) -> tuple[str, ...]:
    """The parameter names of the file's top-level ``function`` (none when
    it has none: the launcher then meets its call as a gap)."""
    _, tree = parse_source(path)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return tuple(argument.arg for argument in node.args.args)
    return ()


def _compute_slot_mappings(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    num_tokens: int,
) -> torch.Tensor:
    """KV slots (a triton kernel over the block tables): opaque to DP."""
    return torch.zeros(1, num_tokens, dtype=torch.int64)


def _build_slot_mappings_by_layer(
    slot_mappings: torch.Tensor, kv_cache_config: Any
) -> dict[str, torch.Tensor]:
    """Per-layer KV slots, read only by attention backends: none are modelled."""
    return {}


def _build_attn_metadata(**arguments: Any) -> dict[str, Any]:
    """The attention backends' metadata, which only attention kernels read:
    none is built (the real code around the call runs)."""
    return {}
