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
from types import SimpleNamespace
from typing import Any

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


def build_dispatcher(
    dispatcher_class: type,
    mode_enum: Any,
    config: ManagerConfig,
    compilation_class: type | None = None,
) -> Any:
    """A real dispatcher of ``dispatcher_class`` for ``config``, its keys
    initialised as vLLM's capture does."""
    mode = mode_enum[config.cudagraph_mode]
    sizes = sorted(config.capture_sizes)
    largest = config.effective_max_capture_size
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
    initialize = dispatcher.initialize_cudagraph_keys
    if "uniform_decode_query_len" in inspect.signature(initialize).parameters:
        initialize(mode, config.decode_query_len)
    else:
        initialize(mode)
    _check_lora_cases(dispatcher, config.lora_capture_cases)
    return dispatcher


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
        raise ValueError(
            f"this V1 dispatcher captures LoRA cases {sorted(captured)}, not the "
            f"policy's {sorted(wanted)}: no LoRA config of this release gives them"
        )
