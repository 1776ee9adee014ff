"""Real ``CudagraphDispatcher`` instances of the V1 runner, built without a GPU.

vLLM builds the dispatcher from its ``VllmConfig`` and, once the attention
backends have settled the cudagraph mode, calls
``initialize_cudagraph_keys(mode, uniform_decode_query_len)``, which fills the
table of graphs it will capture; from then on ``dispatch`` answers from that
table. Nothing there touches a device, so dpsim does exactly that with a
strict view of the config (:class:`~dpsim.targets.v1.strict.StrictView`)
holding what a capture table (:class:`~dpsim.records.policy.ManagerConfig`)
says. A config the release refuses raises its own ``ValueError`` or
``AssertionError``, as for V2's manager.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from types import MethodType, SimpleNamespace
from typing import Any

from dpsim.boundary import modelled
from dpsim.records.policy import ManagerConfig
from dpsim.targets.v1.strict import view_of_paths

OWNER = "VllmConfig (as the V1 CudagraphDispatcher reads it)"


def lora_settings(cases: tuple[int, ...] | None) -> tuple[int, bool, bool] | None:
    """``(max_loras, cudagraph_specialize_lora, specialize_active_lora)`` that
    make vLLM capture the LoRA ``cases`` (active-LoRA counts, 0 = without
    LoRA), or None for no LoRA at all. vLLM captures ``max_loras + 1`` as its
    largest count, the no-LoRA graphs when ``cudagraph_specialize_lora``, and
    the powers of two below when ``specialize_active_lora``."""
    if not cases or cases == (0,):
        return None
    counts = [case for case in cases if case]
    return max(counts) - 1, 0 in cases, len(counts) > 1


def lora_capture_cases(dispatcher_class: type) -> Callable[[Any, Any], list[int]]:
    """The LoRA cases this release's V1 dispatcher captures for a LoRA
    configuration, as ``get_lora_capture_cases(lora_config,
    compilation_config)`` answers for V2 (:class:`~dpsim.targets.buildable.
    BuildRules`), so that the caller profile draws the LoRA tables a V1
    deployment builds where the release has no V2 rule (before 0.24).

    From 0.16 the dispatcher's own ``_get_lora_cases`` answers, run on a strict
    view holding the configuration (and ``specialize_lora_count``, which its
    ``__init__`` copies from ``specialize_active_lora``). Before, the rule is
    inline in ``initialize_cudagraph_keys`` and graphs know only whether LoRA
    is active: the LoRA graphs always, the no-LoRA ones when
    ``cudagraph_specialize_lora``; given here in :func:`lora_settings`'
    encoding (``max_loras + 1`` for "LoRA active").
    """
    own_rule = dispatcher_class.__dict__.get("_get_lora_cases")

    def cases(lora: Any, compilation: Any) -> list[int]:
        specialize_graphs = bool(compilation.cudagraph_specialize_lora)
        if own_rule is None:
            return (
                [0, lora.max_loras + 1] if specialize_graphs else [lora.max_loras + 1]
            )
        view = view_of_paths(
            OWNER,
            {
                ("vllm_config", "lora_config", "max_loras"): lora.max_loras,
                ("vllm_config", "lora_config", "specialize_active_lora"): (
                    lora.specialize_active_lora
                ),
                ("compilation_config", "cudagraph_specialize_lora"): specialize_graphs,
                ("specialize_lora_count",): lora.specialize_active_lora,
            },
        )
        return [int(case) for case in own_rule(view)]

    return cases


#: When a release rounds its capture sizes to multiples of the decode query
#: length before capture (``adjust_cudagraph_sizes_for_spec_decode``): never,
#: for a FULL decode mode (0.20+), or only for one with a separate decode
#: routine (0.11-0.19). Read off the release's call site, see ``v1.load``.
SPEC_ROUNDING = (None, "full_decode", "separate_routine")


def build_dispatcher(
    dispatcher_class: type,
    mode_enum: Any,
    config: ManagerConfig,
    compilation_class: type | None = None,
    spec_rounding: str | None = None,
    *,
    initialize: bool = True,
) -> Any:
    """A real dispatcher of ``dispatcher_class`` for ``config``, its keys
    initialised as vLLM's capture does: capture sizes first rounded for
    speculative decoding where the release does (``spec_rounding``, with its
    own ``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``).
    ``initialize=False`` leaves the keys to the caller: the V1 drafter's
    dispatcher shares the model runner's config, and the drafter's own real
    ``initialize_cudagraph_keys`` sets its keys (with its own mode)."""
    mode = mode_enum[config.cudagraph_mode]
    sizes, largest = _capture_sizes(
        config, mode, mode_enum, compilation_class, spec_rounding
    )
    lora = lora_settings(config.lora_capture_cases)
    paths: dict[tuple[str, ...], Any] = {
        ("compilation_config", "cudagraph_mode"): mode,
        ("compilation_config", "cudagraph_capture_sizes"): sizes,
        ("compilation_config", "max_cudagraph_capture_size"): largest,
        ("compilation_config", "compile_sizes"): [],
        ("compilation_config", "cudagraph_specialize_lora"): bool(lora and lora[1]),
        # dpsim models vLLM's default compilation: attention split out of the
        # piecewise graphs, which piecewise modes require (the dispatcher
        # asserts it; mode and splitting_ops only word that assertion).
        ("compilation_config", "is_attention_compiled_piecewise"): lambda: True,
        ("compilation_config", "mode"): "VLLM_COMPILE",
        ("compilation_config", "splitting_ops"): [],
        ("scheduler_config", "max_num_seqs"): config.max_num_seqs,
        ("num_speculative_tokens",): max(config.decode_query_len - 1, 0),
        ("speculative_config",): None,
        ("lora_config",): None,
        # Not the dispatcher's business: the caller method reads it (see
        # model_is_encoder_decoder), and the dispatcher is what reaches it.
        ("model_config", "is_encoder_decoder"): config.encoder_decoder,
    }
    if config.decode_query_len > 1:
        del paths[("speculative_config",)]
        paths[("speculative_config", "num_speculative_tokens")] = (
            config.decode_query_len - 1
        )
    if lora is not None:
        del paths[("lora_config",)]
        paths[("lora_config", "max_loras")] = lora[0]
        paths[("lora_config", "specialize_active_lora")] = lora[2]
    padded = _padded_sizes(compilation_class, sizes, largest)
    if padded is not None:
        # Up to 0.16 the dispatcher pads through VllmConfig.pad_for_cudagraph,
        # a lookup in the table CompilationConfig computes (done above with
        # the release's own method).
        paths[("compilation_config", "bs_to_padded_graph_size")] = padded
        paths[("pad_for_cudagraph",)] = padded.__getitem__
    vllm_config = view_of_paths(OWNER, paths, where=_reads_in(dispatcher_class))
    dispatcher = dispatcher_class(vllm_config)
    if not initialize:
        return dispatcher
    keys = dispatcher.initialize_cudagraph_keys
    if "uniform_decode_query_len" in inspect.signature(keys).parameters:
        keys(mode, config.decode_query_len)
    else:
        keys(mode)
    _check_lora_cases(dispatcher, config.lora_capture_cases)
    return dispatcher


def model_is_encoder_decoder(dispatcher: Any) -> bool:
    """Whether the deployment ``dispatcher`` was built for serves an
    encoder-decoder model (the policy's ``encoder_decoder``).

    The caller's stand-in ``self`` and the V1 oracle both need it, and both
    get the dispatcher already; carrying it in the dispatcher's config view
    (where vLLM's ``VllmConfig`` has it too) spares a new argument through
    every layer between the policy and a rank's call.
    """
    return bool(dispatcher.vllm_config.model_config.is_encoder_decoder)


def _reads_in(dispatcher_class: type) -> Callable[[str], str]:
    """Says where the dispatcher's source first reads an attribute the view
    lacks: the first line naming it, in the release's own file."""
    init = getattr(dispatcher_class, "__init__", None)
    code = getattr(init, "__code__", None)
    path = Path(code.co_filename) if code is not None else None

    def where(dotted: str) -> str:
        if path is None:
            return ""
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return ""
        wanted = f".{dotted.rsplit('.', 1)[-1]}"
        for number, line in enumerate(lines, start=1):
            if wanted in line:
                return f"vLLM reads it at {path.name}:{number}"
        return ""

    return where


def _capture_sizes(
    config: ManagerConfig,
    mode: Any,
    mode_enum: Any,
    compilation_class: type | None,
    spec_rounding: str | None,
) -> tuple[list[int], int]:
    """The capture sizes and largest size vLLM captures for ``config``."""
    sizes = sorted(config.capture_sizes)
    largest = config.effective_max_capture_size
    rounds = (
        spec_rounding is not None
        and config.decode_query_len > 1
        and mode.decode_mode() == mode_enum.FULL
        and (spec_rounding != "separate_routine" or mode.separate_routine())
    )
    method = getattr(compilation_class, "adjust_cudagraph_sizes_for_spec_decode", None)
    if not rounds or not inspect.isfunction(method):
        return sizes, largest
    holder = SimpleNamespace(
        cudagraph_capture_sizes=list(sizes),
        max_cudagraph_capture_size=largest,
        bs_to_padded_graph_size=None,
        # Sequence parallelism is outside what dpsim models: off, as by default.
        pass_config=SimpleNamespace(enable_sp=False),
    )
    recompute = getattr(compilation_class, "compute_bs_to_padded_graph_size", None)
    holder.compute_bs_to_padded_graph_size = (
        MethodType(recompute, holder) if inspect.isfunction(recompute) else _nothing
    )
    arguments = [config.decode_query_len]
    if "tensor_parallel_size" in inspect.signature(method).parameters:
        arguments.append(config.tensor_parallel_size)
    method(holder, *arguments)
    return list(holder.cudagraph_capture_sizes), int(holder.max_cudagraph_capture_size)


def _nothing() -> None:
    return None


def _padded_sizes(
    compilation_class: type | None, sizes: list[int], largest: int
) -> list[int] | None:
    method = getattr(compilation_class, "compute_bs_to_padded_graph_size", None)
    if not inspect.isfunction(method):
        return None
    holder = SimpleNamespace(
        cudagraph_capture_sizes=list(sizes),
        max_cudagraph_capture_size=largest,
        bs_to_padded_graph_size=None,
    )
    method(holder)
    table = holder.bs_to_padded_graph_size
    return list(table) if isinstance(table, list) else None


def _check_lora_cases(dispatcher: Any, cases: tuple[int, ...] | None) -> None:
    """Refuse a table whose LoRA cases this release would not capture: the
    dispatcher would answer for another configuration than the policy's."""
    keys = getattr(dispatcher, "cudagraph_keys", {})
    descriptors = [d for table in keys.values() for d in table]
    if not descriptors:
        return
    wanted = set(cases or (0,))
    if hasattr(descriptors[0], "num_active_loras"):
        captured = {int(d.num_active_loras) for d in descriptors}
    else:
        captured = {1 if d.has_lora else 0 for d in descriptors}
        wanted = {1 if case else 0 for case in wanted}
    if captured != wanted:
        # As vLLM's own config refuses such a table: the policy is refused.
        raise modelled(
            ValueError(
                f"this V1 dispatcher captures LoRA cases {sorted(captured)}, not "
                f"the policy's {sorted(wanted)}: no LoRA config of this release "
                "gives them"
            )
        )
