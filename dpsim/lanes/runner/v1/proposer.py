"""The real V1 EAGLE proposer (EAGLE and MTP) per virtual rank, its forwards stood in for.

vLLM's V1 model runner drafts with ``self.drafter``, an ``EagleProposer``
(``vllm/v1/spec_decode/eagle.py``; almost all of it is the base class
``SpecDecodeBaseProposer``, in ``eagle.py`` for 0.15-0.20 and in
``spec_decode/llm_base_proposer.py`` from 0.21).
What it does decides whether DP ranks stay in step: ``propose`` runs the
first-pass forward and ``k - 1`` loop forwards, ``dummy_run`` (idle ranks,
profile and capture runs) runs as many forwards as ``propose`` would (vLLM
26086 was ``dummy_run`` issuing one where ``propose`` issued ``k``), and
each forward's MoE collectives hang when ranks disagree. Both coordinate
across DP: in the drafter's own ``_determine_batch_execution_and_padding``
(0.17+: dispatch, sync count and graph mode, dispatch again), or in 0.12-0.16
in ``_pad_batch_across_dp`` (the count alone; the drafter picks its graph
size after, locally, from ``pad_for_cudagraph`` or its dispatcher: where
30119 lived). Both call the release's real ``coordinate_batch_across_dp``.

:func:`build_v1_proposer` rebuilds the release's REAL class chain with
:func:`~dpsim.lanes.runner.extract.real_class` (``EagleProposer`` over the
real ``SpecDecodeBaseProposer`` where the release has one) and gives it
per-rank CPU buffers. These run for real: ``propose``, ``dummy_run``,
``_determine_batch_execution_and_padding``, ``set_inputs_first_pass``,
``build_model_inputs_first_pass``, ``model_returns_tuple``, the position and
slot-mapping helpers, greedy draft sampling (``_greedy_sample``,
``_sample_draft_tokens``: argmax over the stood-in model's zero logits),
``_pad_batch_across_dp`` and ``_get_attention_metadata_builder`` (0.12-0.16),
``prepare_inputs``, ``prepare_inputs_padded``, ``prepare_next_token_ids_cpu``,
``prepare_next_token_ids_padded``, ``initialize_cudagraph_keys`` over the
release's real ``CudagraphDispatcher`` (built from the policy's table as the
sync lane's V1 target builds the model runner's:
:func:`dpsim.targets.v1.dispatcher.build_dispatcher`), and the release's
``CommonAttentionMetadata`` dataclass (its class statement, executed alone).

``coordinate_batch_across_dp`` and ``set_forward_context`` are the running
rank's, from the model runner's rank kit (``runner_kit``: the rank's V1 sync
recorder, whose ``coordinate`` is the release's real sync, and the forward
contexts): the rebuilt classes are shared by a release's ranks, so their
globals route each call by the rank's ``parallel_config`` (each rank has its
own). Each call of the drafter's ``_determine_batch_execution_and_padding``
is recorded as one drafter-phase sync (:func:`_recording`, through the
rank's recorder), numbered on the rank's phase counter after the model
runner's sync of the same step. 0.12-0.16's ``_pad_batch_across_dp`` is not
recorded: a sync record says what the rank runs, which that drafter decides
only after the call; its forwards (and their collectives) are judged all
the same (``drafter-forwards``, ``no-hang``).

Stood in for: the draft model (:class:`~dpsim.lanes.runner.forward.FakeModel`:
each forward issues the EP collectives at its forward context's shape and
leaves a drafter-forward event; it returns the tuple ``model_returns_tuple``
says the real model returns), the triton kernels (what CPU code reads back of
their results, in CPU torch: :func:`_prepare_inputs_padded`,
:func:`_prepare_next_token_padded`, :func:`_step_update`), KV slots and the
attention metadata builders (one attention group whose metadata is opaque:
read only by attention kernels), ``CpuGpuBuffer`` (its numpy side is the tensor). Not modelled, so a gap
(refusal) when reached: parallel drafting and draft models (the
``copy_and_expand`` kernels), eagle3/dflash hidden-state combining,
probabilistic draft sampling, multimodal and M-RoPE drafters, tree drafting,
EPLB. ``@torch.inference_mode()`` is dropped: per-thread state in vLLM, and
the lane's ranks share a thread, which the installed world keeps in
inference mode for the whole run (``dpsim.targets.runtime``).

EAGLE and MTP share the class; what differs is ``speculative_config.method``
(vLLM normalises ``deepseek_mtp`` and kin to ``"mtp"`` in every release the
lane reads) and so ``model_returns_tuple``: the lane's MTP draft model is
DeepSeek's (``DeepSeekMTPModel``, the DP+EP MTP deployment).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import numpy as np
import torch
from typing_extensions import deprecated

from dpsim.boundary import register_file
from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.extract import class_node, find_class, real_class
from dpsim.lanes.runner.forward import HIDDEN_SIZE, FakeModel, ForwardContexts
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.speculators import (
    VOCAB_SIZE,
    _assigned,
    _launcher,
    _present,
    _shown,
)
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import asked_at, gap, instance, standin
from dpsim.lanes.runner.syncs import _under_dummy_run, record_drafter_forward
from dpsim.records.case import RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.targets.shim import parse_source
from dpsim.targets.v1.api import V1Result
from dpsim.targets.v1.dispatcher import build_dispatcher
from dpsim.targets.v1.load import V1Target

#: The drafter kinds (``EngineOptions.speculator`` of a V1 case).
KINDS = ("eagle", "mtp")
#: ``speculative_config.method`` of each kind, as vLLM normalises it.
_METHODS = {"eagle": "eagle", "mtp": "mtp"}
#: The draft model architecture each kind's ``model_returns_tuple`` reads.
_ARCHITECTURES = {"eagle": ["LlamaForCausalLMEagle"], "mtp": ["DeepSeekMTPModel"]}

EAGLE_MODULE = "vllm.v1.spec_decode.eagle"
BASE_MODULE = "vllm.v1.spec_decode.llm_base_proposer"
UTILS_MODULE = "vllm.v1.spec_decode.utils"
#: Where ``CommonAttentionMetadata`` lives, newest first.
ATTENTION_MODULES = ("vllm.v1.attention.backend", "vllm.v1.attention.backends.utils")
#: The modules the proposer reads (the V1 runner lane's module list holds them).
PROPOSER_MODULES = (EAGLE_MODULE, BASE_MODULE, UTILS_MODULE, *ATTENTION_MODULES)

_EAGLE_CLASS = "EagleProposer"
_BASE_CLASS = "SpecDecodeBaseProposer"
_METADATA_CLASS = "CommonAttentionMetadata"

#: The proposer's methods on the paths of ``propose``, ``dummy_run`` and the
#: model runner's calls, whichever the release defines.
_METHODS_KEPT = (
    "_get_positions",
    "_set_positions",
    "_get_slot_mapping",
    "initialize_cudagraph_keys",
    "_greedy_sample",
    "_sample_from_logits",
    "_sample_draft_tokens",
    "take_last_draft_probs",
    "propose",
    "_update_positions_dependent_metadata",
    "set_inputs_first_pass",
    "build_model_inputs_first_pass",
    "build_per_group_and_layer_attn_metadata",
    "model_returns_tuple",
    "prepare_next_token_ids_cpu",
    "prepare_next_token_ids_padded",
    "prepare_inputs_padded",
    "prepare_inputs",
    "dummy_run",
    "_determine_batch_execution_and_padding",
    "_pad_batch_across_dp",
    "_get_attention_metadata_builder",
    "set_eplb_state",
)
#: Required in every release the lane drives (and one of the two callers of
#: the sync: :func:`_check_dp_caller`).
_REQUIRED = ("propose", "dummy_run", "prepare_inputs")
#: The drafter's caller of the sync: its own dispatch-and-sync (0.17+), or
#: the count-only padding of 0.12-0.16.
_DETERMINE = "_determine_batch_execution_and_padding"
_PAD = "_pad_batch_across_dp"
#: The methods whose ``self.X = ...`` assignments say which attributes the
#: release's real proposer holds.
_BUILDERS = (
    "__init__",
    "load_model",
    "initialize_attn_backend",
    "_init_parallel_drafting_params",
)
_DECORATORS: dict[str, None] = {"torch.inference_mode()": None}


class _Recorder(Protocol):
    """The rank's V1 sync recorder (:class:`~dpsim.lanes.runner.v1.syncs.V1SyncRecorder`)."""

    def coordinate(self, *args: Any, **kwargs: Any) -> Any: ...

    def record(
        self,
        call: Callable[[], Any],
        inputs: RankBatch,
        *,
        caller_frame: FrameType,
        result_of: Callable[[Any], V1Result],
    ) -> Any: ...


class V1RankKit(Protocol):
    """What the drafter takes from the V1 model runner's rank kit
    (:class:`~dpsim.lanes.runner.v1.model_runner.V1RankKit`)."""

    @property
    def parallel_config(self) -> Any: ...  # this rank's own object

    @property
    def forward_contexts(self) -> ForwardContexts: ...

    @property
    def recorder(self) -> _Recorder: ...


@dataclass(frozen=True)
class ProposerClasses:
    """One release's rebuilt proposer classes, shared by its ranks."""

    #: The real ``EagleProposer`` (over the real base class where there is one).
    proposer: type
    #: The ``self`` attributes the release's real proposer has.
    attributes: frozenset[str]
    #: The release's ``CommonAttentionMetadata`` dataclass.
    common_attn_metadata: type
    #: Every rebuilt class (for line coverage and ``targets``).
    rebuilt: tuple[type, ...]


def build_v1_proposer(
    sources: RunnerSources,
    options: EngineOptions,
    policy: CapturePolicy,
    rank: int,
    dp_size: int,
    runner_kit: V1RankKit,
) -> Any:
    """Rank ``rank``'s drafter for ``options.speculator``, or None without one.

    Buffers are per rank, CPU tensors sized as vLLM sizes them from
    ``options`` (and the policy's largest capture size); the drafter's
    dispatcher is the release's real one over the model runner's table (the
    drafter shares the runner's ``VllmConfig``), its keys set by the real
    ``initialize_cudagraph_keys`` with the policy's mode, as the model
    runner's ``_check_and_update_cudagraph_mode`` does.
    """
    kind = options.speculator
    if kind is None:
        return None
    if kind not in KINDS:
        raise UsageError(
            f"runner lane: the V1 runner has no {kind!r} drafter (known: "
            f"{', '.join(KINDS)})"
        )
    k = options.num_speculative_tokens
    if policy.decode_query_len != 1 + k:
        raise UsageError(
            f"runner lane: the policy's decode_query_len ({policy.decode_query_len}) "
            f"must be 1 + num_speculative_tokens ({1 + k}), as vLLM derives it"
        )
    target = sources.target
    if not isinstance(target, V1Target):
        raise TargetError(
            f"runner lane: {sources.label}'s target is the "
            f"{target.runner.upper()} runner's; the V1 drafter needs V1's"
        )
    classes = proposer_classes(sources, target)
    table = policy.manager_config(dp_size)
    dispatcher = build_dispatcher(
        target.manager_class,
        target.CUDAGraphMode,
        table,
        target.compilation.__dict__.get("CompilationConfig"),
        target.spec_rounding,
        initialize=False,
    )
    parallel_config = runner_kit.parallel_config
    _RANKS[parallel_config] = runner_kit
    shared = dispatcher.vllm_config  # the model runner's config, as the lane views it
    padding = getattr(shared, "pad_for_cudagraph", None)  # up to 0.16
    vllm_config = standin(
        "VllmConfig (the drafter's)",
        **({} if padding is None else {"pad_for_cudagraph": padding}),
        parallel_config=parallel_config,
        compilation_config=shared.compilation_config,
        model_config=standin(
            "ModelConfig", max_model_len=options.max_model_len, uses_mrope=False
        ),
    )
    tokens = max(options.max_num_batched_tokens, table.effective_max_capture_size)
    model = _DraftModel(
        runner_kit.forward_contexts,
        VOCAB_SIZE,
        extra_inputs=("hidden_states",),
        on_forward=record_drafter_forward,
    )
    modes = target.CUDAGraphMode
    values = _attributes(
        kind,
        options,
        # 0.12-0.14's __init__: graphs iff the mode has PIECEWISE ones (dpsim
        # models vLLM's default compilation, VLLM_COMPILE; no enforce_eager).
        use_cuda_graph=modes[table.cudagraph_mode].has_mode(modes.PIECEWISE),
        rank=rank,
        vllm_config=vllm_config,
        dispatcher=dispatcher,
        model=model,
        tokens=tokens,
    )
    proposer: Any = instance(
        classes.proposer,
        **{name: value for name, value in values.items() if name in classes.attributes},
    )
    # The real model's return form, as the real code asks it (0.15+); 0.12-0.14
    # unpack a tuple inline unless the method is "mtp".
    model.returns_tuple = (
        bool(proposer.model_returns_tuple())
        if hasattr(type(proposer), "model_returns_tuple")
        else kind != "mtp"
    )
    if hasattr(type(proposer), "initialize_cudagraph_keys"):  # 0.15+: a dispatcher
        proposer.initialize_cudagraph_keys(target.CUDAGraphMode[table.cudagraph_mode])
    return proposer


def v1_proposer_class(sources: RunnerSources, target: Any) -> type:
    """The release's rebuilt ``EagleProposer``: what the model runner's
    ``isinstance(self.drafter, EagleProposer | ...)`` must name."""
    return proposer_classes(sources, target).proposer


def common_attn_metadata_class(sources: RunnerSources, target: Any) -> type:
    """The release's real ``CommonAttentionMetadata`` dataclass."""
    return proposer_classes(sources, target).common_attn_metadata


def common_attn_metadata(
    sources: RunnerSources,
    num_scheduled_tokens: np.ndarray,
    seq_lens: np.ndarray,
    *,
    num_tokens: int | None = None,
) -> Any:
    """The release's ``CommonAttentionMetadata`` of a batch, holding what the
    drafter's paths read (query starts, sequence lengths and their host
    copies, counts, an all-zero block table and slot mapping: KV slots are
    read only by attention kernels). ``num_tokens`` is the padded token
    count the slot mapping covers (the batch's own by default). Fields the
    release's class lacks are left out; those it requires beyond these are
    its own ``TypeError``."""
    made = common_attn_metadata_class(sources, sources.target)
    counts = torch.as_tensor(np.asarray(num_scheduled_tokens), dtype=torch.int32)
    lengths = torch.as_tensor(np.asarray(seq_lens), dtype=torch.int32)
    num_reqs = int(counts.shape[0])
    starts = torch.zeros(num_reqs + 1, dtype=torch.int32)
    torch.cumsum(counts, dim=0, out=starts[1:])
    total = int(starts[-1])
    values = {
        "query_start_loc": starts,
        "query_start_loc_cpu": starts.clone(),
        "seq_lens": lengths.clone(),
        "seq_lens_cpu_upper_bound": lengths.clone(),
        "seq_lens_cpu": lengths.clone(),
        "num_computed_tokens_cpu": lengths - counts,
        "num_reqs": num_reqs,
        "num_actual_tokens": total,
        "max_query_len": int(counts.max()) if num_reqs else 0,
        "max_seq_len": int(lengths.max()) if num_reqs else 0,
        "block_table_tensor": torch.zeros(num_reqs, 1, dtype=torch.int32),
        "slot_mapping": torch.zeros(max(total, num_tokens or 0), dtype=torch.int64),
    }
    names = {field.name for field in dataclasses.fields(made)}
    return made(**{name: value for name, value in values.items() if name in names})


def real_classes(sources: RunnerSources, target: Any) -> tuple[type, ...]:
    """The release's proposer classes rebuilt from its files (for line
    coverage); what they are given instead of vLLM's is :data:`STOOD_IN`."""
    return proposer_classes(sources, target).rebuilt


#: What the proposer's real methods are given in place of vLLM's, and why.
STOOD_IN: dict[str, str] = {
    "model": "the draft model; EP collectives at the forward context's shape, "
    "a drafter-forward event each (forward.FakeModel)",
    "eagle_prepare_inputs_padded, eagle_prepare_next_token_padded, "
    "eagle_step_update_slot_mapping_and_metadata": "triton kernels; what CPU code "
    "reads back of their results (indices to sample, rejected and valid counts, "
    "next token ids, clamped positions)",
    "coordinate_batch_across_dp, set_forward_context": "the running rank's, "
    "from the model runner's kit (the real sync, recorded)",
    "draft_attn_groups, slot mappings": "attention metadata and KV slots, read "
    "only by attention kernels; none built",
    "backup_next_token_ids": "CpuGpuBuffer; one CPU tensor and its numpy view",
    "__init__, load_model, initialize_attn_backend": "GPU buffers, weights, "
    "attention backends; not run (their attributes set as they set them)",
}


# -- per-rank routing ---------------------------------------------------------


#: Each rank's kit, by its parallel config (the rebuilt classes, and so
#: their module globals, serve every rank of a release).
_RANKS: weakref.WeakKeyDictionary[Any, V1RankKit] = weakref.WeakKeyDictionary()


def _rank_of(parallel_config: Any, what: str) -> V1RankKit:
    try:
        found = _RANKS.get(parallel_config)
    except TypeError:  # not weakly referenceable: not a rank's config
        found = None
    if found is None:
        raise gap(f"{what} with a parallel_config no rank owns at {asked_at()}")
    return found


def _route_sync(*args: Any, **kwargs: Any) -> Any:
    """The drafter's ``coordinate_batch_across_dp``: the calling rank's (its
    recorder's: the release's real function, what it returned told to the
    drafter caller call in progress)."""
    parallel_config = kwargs.get("parallel_config")
    if parallel_config is None:
        raise gap(
            "coordinate_batch_across_dp without parallel_config by keyword at "
            f"{asked_at()}"
        )
    recorder = _rank_of(parallel_config, "coordinate_batch_across_dp").recorder
    return recorder.coordinate(*args, **kwargs)


def _route_forward_context(
    attn_metadata: Any, vllm_config: Any, *args: Any, **kwargs: Any
) -> Any:
    """The drafter's ``set_forward_context``: the calling rank's."""
    rank = _rank_of(vllm_config.parallel_config, "set_forward_context")
    contexts = rank.forward_contexts
    return contexts.set_forward_context(attn_metadata, vllm_config, *args, **kwargs)


def _recording(cls: type, descriptor: type) -> type:
    """``cls`` whose ``_determine_batch_execution_and_padding`` (the
    drafter's caller of the sync) is recorded, one ``sync`` event per call,
    as the model runner's caller calls are (:mod:`dpsim.lanes.runner.v1.syncs`):
    phase ``iter K drafter ...`` on the rank's phase counter, inputs the
    drafter's token count and eager flag, the descriptor what it chose
    (mode, padded count), the agreement what the real sync returned."""
    real = cls._determine_batch_execution_and_padding  # type: ignore[attr-defined]
    parameters = tuple(inspect.signature(real).parameters)[1:]

    def _determine_batch_execution_and_padding(
        self: Any, *args: Any, **kwargs: Any
    ) -> Any:
        frame = sys._getframe(1)
        rank = _rank_of(self.vllm_config.parallel_config, "the drafter's sync")
        called = dict(zip(parameters, args, strict=False)) | kwargs
        num_tokens = int(called["num_tokens"])
        inputs = RankBatch(
            # The drafter syncs a token count alone; in its decode steps
            # (and a dummy run's) that is one token per request.
            num_reqs=num_tokens,
            num_tokens=num_tokens,
            need_eager=not called.get("use_cudagraphs", True),
            allow_ubatching=False,
            kind="dummy" if _under_dummy_run(frame) else "batch",
        )

        def result_of(returned: Any) -> V1Result:
            # What the drafter runs: the mode and padded count it returned.
            mode, padded = returned[0], int(returned[1])
            return V1Result((mode, descriptor(padded), False), 1, 1)

        return rank.recorder.record(
            lambda: real(self, *args, **kwargs),
            inputs,
            caller_frame=frame,
            result_of=result_of,
        )

    return type(
        cls.__name__,
        (cls,),
        {
            "_determine_batch_execution_and_padding": _determine_batch_execution_and_padding,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        },
    )


class _DraftModel(FakeModel):
    """The stood-in draft model, returning ``(last_hidden_states,
    hidden_states)`` where the real model does (``model_returns_tuple``)."""

    OWNER = "draft model"
    returns_tuple = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hidden = super().__call__(*args, **kwargs)
        return (hidden, hidden) if self.returns_tuple else hidden


# -- the release's classes ----------------------------------------------------


@functools.lru_cache(maxsize=16)
def proposer_classes(sources: RunnerSources, target: Any) -> ProposerClasses:
    """The release's proposer classes, rebuilt once per sources object and
    shared by its ranks."""
    version = sources.version
    eagle_path = sources.path(EAGLE_MODULE)
    utils_path = sources.path(UTILS_MODULE)
    metadata = _metadata_class(sources, version)
    eagle_tree = class_node(eagle_path, _EAGLE_CLASS, version=version)
    namespace = _globals(target, utils_path, eagle_path, metadata)
    trees = [eagle_tree]
    rebuilt: list[type] = []
    _check_dp_caller(sources, eagle_path, version)
    if _BASE_CLASS in _bases(eagle_tree):
        # 0.15-0.20 keep the base class in eagle.py; 0.21 moved it out.
        base_path = next(
            (
                path
                for path in (sources.file_of(BASE_MODULE), eagle_path)
                if path is not None and find_class(path, _BASE_CLASS) is not None
            ),
            eagle_path,  # class_node's one-line refusal names the file
        )
        base_tree = class_node(base_path, _BASE_CLASS, version=version)
        trees.insert(0, base_tree)
        base = real_class(
            base_path,
            _BASE_CLASS,
            _present(base_tree, _METHODS_KEPT, _REQUIRED),
            version=version,
            globals_=namespace,
            decorators=_DECORATORS,
        )
        rebuilt.append(base)
        proposer = real_class(
            eagle_path,
            _EAGLE_CLASS,
            _present(eagle_tree, _METHODS_KEPT, ()),
            version=version,
            globals_=namespace,
            bases=(base,),
            decorators=_DECORATORS,
        )
    else:
        if _bases(eagle_tree):
            raise TargetError(
                f"runner lane: vLLM {_shown(version)} has no EAGLE proposer the "
                f"lane can drive: eagle.py's {_EAGLE_CLASS} derives from "
                f"{', '.join(_bases(eagle_tree))}, not {_BASE_CLASS}"
            )
        proposer = real_class(
            eagle_path,
            _EAGLE_CLASS,
            _present(eagle_tree, _METHODS_KEPT, _REQUIRED),
            version=version,
            globals_=namespace,
            decorators=_DECORATORS,
        )
    rebuilt.insert(0, proposer)
    if hasattr(proposer, _DETERMINE):
        proposer = _recording(proposer, target.BatchExecutionDescriptor)
    return ProposerClasses(
        proposer=proposer,
        attributes=frozenset(_assigned(trees, _BUILDERS)),
        common_attn_metadata=metadata,
        rebuilt=tuple(rebuilt),
    )


def _check_dp_caller(
    sources: RunnerSources, eagle_path: Path, version: str | None
) -> None:
    """Refuse a release whose drafter has neither caller of the sync the
    lane knows: ``_determine_batch_execution_and_padding`` (0.17+) or
    ``_pad_batch_across_dp`` (0.12-0.16)."""
    paths = [p for p in (sources.file_of(BASE_MODULE), eagle_path) if p is not None]
    text = "".join(path.read_text() for path in paths)
    if f"def {_DETERMINE}(" in text or f"def {_PAD}(" in text:
        return
    raise TargetError(
        f"runner lane: vLLM {_shown(version)}'s EAGLE proposer has neither "
        f"{_DETERMINE} nor {_PAD}: its drafter does not coordinate across DP "
        "itself (before 0.12), which the V1 runner lane does not model"
    )


def _bases(node: ast.ClassDef) -> list[str]:
    return [ast.unparse(part) for part in node.bases]


def _metadata_class(sources: RunnerSources, version: str | None) -> type:
    for module in ATTENTION_MODULES:
        path = sources.file_of(module)
        if path is None:
            continue
        made = _top_level(
            path,
            _METADATA_CLASS,
            {
                "dataclass": dataclass,
                "field": field,
                "replace": replace,
                "deprecated": deprecated,
                "torch": torch,
                "np": np,
            },
        )
        if isinstance(made, type):
            return made
    raise TargetError(
        f"runner lane: vLLM {_shown(version)} has no {_METADATA_CLASS} the V1 "
        "drafter can build (neither v1/attention/backend.py nor "
        "v1/attention/backends/utils.py defines it)"
    )


def _top_level(path: Path, name: str, namespace: dict[str, Any]) -> Any:
    """Execute the file's top-level class or function statement ``name``
    alone (decorators and annotations as written) in ``namespace``, compiled
    with the file's real name and lines; None when it has none."""
    node: ast.stmt | None = find_class(path, name)
    if node is None:
        _, tree = parse_source(path)
        node = next(
            (
                part
                for part in tree.body
                if isinstance(part, ast.FunctionDef) and part.name == name
            ),
            None,
        )
    if node is None:
        return None
    module = ast.Module(body=[node], type_ignores=[])
    namespace = {"__name__": f"dpsim.lanes.runner.real.{name}", **namespace}
    register_file(path)
    exec(compile(module, str(path), "exec", dont_inherit=True), namespace)
    return namespace[name]


def _constant(paths: tuple[Path, ...], name: str) -> Any:
    """A module-level literal ``name = value`` of the first file defining it."""
    for path in paths:
        _, tree = parse_source(path)
        for part in tree.body:
            if (
                isinstance(part, ast.Assign)
                and [ast.unparse(t) for t in part.targets] == [name]
                and _is_literal(part.value)
            ):
                return ast.literal_eval(part.value)
    return None


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return False
    return True


def _globals(
    target: Any, utils_path: Path, eagle_path: Path, metadata: type
) -> dict[str, Any]:
    """The module globals the kept methods may use."""
    modes = target.CUDAGraphMode
    namespace: dict[str, Any] = {
        "torch": torch,
        "np": np,
        "CUDAGraphMode": modes,
        "BatchDescriptor": target.BatchExecutionDescriptor,
        "coordinate_batch_across_dp": _route_sync,
        "set_forward_context": _route_forward_context,
        _METADATA_CLASS: metadata,
        # Pinned host memory is a CUDA matter; the lane's tensors are CPU ones.
        "PIN_MEMORY": False,
        "TreeAttentionMetadata": _TreeAttentionMetadata,
        "async_tensor_h2d": _launcher("async_tensor_h2d", _async_tensor_h2d),
        "eagle_prepare_inputs_padded_kernel": _Kernel(
            "eagle_prepare_inputs_padded_kernel", _prepare_inputs_padded
        ),
        "_eagle_prepare_inputs_padded": _launcher(
            "_eagle_prepare_inputs_padded", _prepare_inputs_padded
        ),
        "eagle_prepare_next_token_padded_kernel": _Kernel(
            "eagle_prepare_next_token_padded_kernel", _prepare_next_token_padded
        ),
        "_eagle_prepare_next_token_padded": _launcher(
            "_eagle_prepare_next_token_padded", _prepare_next_token_padded
        ),
        "eagle_step_update_slot_mapping_and_metadata": _launcher(
            "eagle_step_update_slot_mapping_and_metadata", _step_update
        ),
        # Up to 0.19 eagle.py sizes its kernels' blocks with triton's helper.
        "triton": standin("triton", next_power_of_2=_next_power_of_2),
    }
    power = _top_level(utils_path, "next_power_of_2", {})
    if power is not None:
        namespace["next_power_of_2"] = power
    # In spec_decode/utils.py from 0.17, in eagle.py before.
    padding = _constant((utils_path, eagle_path), "PADDING_SLOT_ID")
    if padding is not None:
        namespace["PADDING_SLOT_ID"] = padding
    return namespace


# -- a rank's state -----------------------------------------------------------


def _attributes(
    kind: str,
    options: EngineOptions,
    *,
    use_cuda_graph: bool,
    rank: int,
    vllm_config: Any,
    dispatcher: Any,
    model: Any,
    tokens: int,
) -> dict[str, Any]:
    """Every attribute a release's proposer builders may give ``self``, with
    the lane's values (CPU tensors sized as vLLM sizes them). What the lane
    does not model is off, as by default: parallel drafting, draft models,
    multimodal and M-RoPE inputs, heterogeneous vocabularies, probabilistic
    drafting, EPLB."""
    k = options.num_speculative_tokens
    reqs = options.max_num_seqs
    arange = max(reqs + 1, tokens)
    method = _METHODS[kind]
    backup = torch.zeros(reqs, dtype=torch.int32)
    group = _attention_group()
    return {
        "vllm_config": vllm_config,
        "speculative_config": standin(
            "SpeculativeConfig",
            method=method,
            num_speculative_tokens=k,
            disable_padded_drafter_batch=False,
            enforce_eager=False,
            parallel_drafting=False,
        ),
        "draft_model_config": standin(
            "ModelConfig (the draft model's)",
            hf_config=standin("PretrainedConfig", architectures=_ARCHITECTURES[kind]),
            uses_mrope=False,
        ),
        "method": method,
        "pass_hidden_states_to_model": True,
        "_share_mtp_indices": False,
        "device": torch.device("cpu"),
        "dtype": torch.float32,
        "max_model_len": options.max_model_len,
        "dp_rank": rank,
        "eplb_state": None,
        "num_speculative_tokens": k,
        "hidden_size": HIDDEN_SIZE,
        "inputs_embeds_size": HIDDEN_SIZE,
        "parallel_drafting": False,
        "extra_slots_per_request": 1,
        "net_num_new_slots_per_request": 0,
        "needs_extra_input_slots": False,
        "constant_draft_positions": False,
        "parallel_drafting_token_id": 0,
        "parallel_drafting_hidden_state_tensor": None,
        "use_local_argmax_reduction": False,
        "use_fp64_gumbel": False,
        "use_heterogeneous_vocab": False,
        "vocab_mapping": None,
        "max_batch_size": reqs,
        "max_num_tokens": tokens,
        "token_arange_np": np.arange(tokens, dtype=np.int32),
        "max_query_tokens": tokens,
        "max_positions": tokens,
        "supports_mm_inputs": False,
        "draft_attn_groups": [group],
        "kv_cache_gid": 0,
        "eagle3_use_aux_hidden_state": False,
        "compilation_config": vllm_config.compilation_config,
        "cudagraph_dispatcher": dispatcher,
        "input_ids": torch.zeros(tokens, dtype=torch.int32),
        "uses_mrope": False,
        # XD-RoPE (0.26-0.29): off for the target and the draft model alike.
        "uses_xdrope_dim": 0,
        "draft_uses_xdrope_dim": 0,
        "positions": torch.zeros(tokens, dtype=torch.int64),
        "hidden_states": torch.zeros(tokens, HIDDEN_SIZE),
        "block_size": _BLOCK_SIZE,
        "arange": torch.arange(arange, dtype=torch.int32),
        "is_rejected_token_mask": None,
        "is_masked_token_mask": None,
        "inputs_embeds": torch.zeros(tokens, HIDDEN_SIZE),
        "backup_next_token_ids": standin(
            "CpuGpuBuffer",
            cpu=backup,
            gpu=backup,
            np=backup.numpy(),
            copy_to_gpu=lambda n=None: backup,
        ),
        "_enable_probabilistic_draft_probs": False,
        "_last_draft_probs": None,
        "_slot_mapping_buffer": torch.zeros(tokens, dtype=torch.int64),
        "allowed_attn_types": None,
        "model": model,
        "_draft_attn_layer_names": frozenset({_DRAFT_LAYER}),
        "attn_layer_names": [_DRAFT_LAYER],
        # 0.12-0.20 keep the model runner (and assert it is set); 0.12-0.14
        # find their attention metadata builder in its attention groups.
        "runner": standin(
            "GPUModelRunner (as the drafter holds it)", attn_groups=[[group]]
        ),
        "use_cuda_graph": use_cuda_graph,
        "attn_metadata_builder": None,
        "draft_indexer_metadata_builder": None,
        "indexer_layer_names": [],
    }


#: The KV cache block size (set from the KV cache spec in vLLM): any size
#: works, the slots it maps are read only by attention kernels.
_BLOCK_SIZE = 16
#: The draft model's one attention layer, as its attention group names it.
_DRAFT_LAYER = "drafter.layers.0.attn"


def _attention_group() -> Any:
    """The drafter's one attention group: its metadata, built per draft step
    by the group's builder in vLLM, is read only by attention kernels (stood
    in for), so each build answers an opaque metadata object. It answers
    the two forms releases call: ``get_metadata_builder().build_for_drafting``
    (up to 0.2x) and ``build_metadata_for_drafting`` (later)."""
    metadata = standin("AttentionMetadata (the drafter's)")
    spec = standin("KVCacheSpec", block_size=_BLOCK_SIZE)

    def build(common_attn_metadata: Any, draft_index: int = 0) -> Any:
        return metadata

    builder = standin(
        "AttentionMetadataBuilder", build_for_drafting=build, kv_cache_spec=spec
    )
    return standin(
        "AttentionGroup",
        layer_names=[_DRAFT_LAYER],
        kv_cache_spec=spec,
        build_metadata_for_drafting=build,
        get_metadata_builder=lambda *ubatch: builder,
    )


class _TreeAttentionMetadata:
    """Tree attention's metadata type (0.17-0.20 test the drafter's metadata
    against it): tree drafting is not modelled, so nothing is one."""


# -- stand-ins for triton kernels ---------------------------------------------


class _Kernel:
    """A triton kernel launched as ``kernel[grid](...)``: the grid is the
    launch's business, the arguments the stand-in's."""

    def __init__(self, name: str, implementation: Callable[..., Any]) -> None:
        self._launch = _launcher(name, implementation)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self._launch


def _next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the smallest power of two >= ``n`` (a
    kernel's block size; the kernels' stand-ins do not read it)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def _async_tensor_h2d(data: Any, device: Any = None, *args: Any) -> torch.Tensor:
    """A host-to-device copy: the lane's tensors stay on the CPU."""
    return torch.as_tensor(data).clone()


def _prepare_inputs_padded(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    *rest: Any,
) -> None:
    """``eagle_prepare_inputs_padded``: each request's index to sample (its
    last token less the rejected ones) and, where the release asks for them
    (0.19+: the argument before ``num_reqs``), the rejected counts."""
    *outputs, num_reqs = rest
    n = int(num_reqs)
    drafts = torch.diff(
        cu_num_draft_tokens[:n], prepend=cu_num_draft_tokens.new_zeros(1)
    )
    rejected = torch.where(
        drafts > 0, drafts + 1 - valid_sampled_tokens_count[:n].to(drafts.dtype), 0
    )
    token_indices_to_sample[:n] = (query_start_loc[1 : n + 1] - 1 - rejected).to(
        token_indices_to_sample.dtype
    )
    for out in outputs[:1]:
        out[:n] = rejected.to(out.dtype)


def _prepare_next_token_padded(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    next_token_ids: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    vocab_size: int,
    num_sampled_tokens_per_req: int,
    num_reqs: int,
    stride: int,
    BLOCK_SIZE_TOKENS: int = 0,
) -> None:
    """``eagle_prepare_next_token_padded``: each request's count of valid
    sampled tokens and its last valid one (the backup token when discarded
    or none is valid)."""
    n = int(num_reqs)
    tokens = sampled_token_ids[:n, : int(num_sampled_tokens_per_req)]
    valid = (tokens != -1) & (tokens < int(vocab_size))
    discarded = discard_request_mask[:n].bool()
    count = torch.where(discarded, 0, valid.sum(dim=1))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    last = torch.where(valid, positions, -1).max(dim=1).values
    picked = tokens.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1)
    use_backup = discarded | (last < 0)
    next_token_ids[:n] = torch.where(
        use_backup, backup_next_token_ids[:n].to(picked.dtype), picked
    ).to(next_token_ids.dtype)
    valid_sampled_tokens_count[:n] = count.to(valid_sampled_tokens_count.dtype)


def _step_update(
    positions_1d: torch.Tensor,
    block_table_tensor: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_model_len: int,
    out_clamped_positions: torch.Tensor,
    out_slot_mapping: torch.Tensor,
    input_batch_size: int | None = None,
) -> None:
    """``eagle_step_update_slot_mapping_and_metadata``: the next draft
    positions (0 past ``max_model_len``) and sequence lengths, as the kernel
    writes them; the slot mapping (read only by attention) is left as is."""
    n = positions_1d.shape[0]
    advanced = positions_1d + 1
    beyond = advanced >= max_model_len
    out_clamped_positions[:n] = torch.where(beyond, 0, advanced)
    lengths = torch.where(beyond, 1, seq_lens[:n] + 1).clamp(max=max_model_len)
    seq_lens[:n] = lengths.to(seq_lens.dtype)
