"""Loading a V1-runner target: the sync, its caller, the dispatcher.

``vllm/v1/worker/dp_utils.py`` is executed from source (loops ticked, as for
V2), the dispatcher module too; ``forward_context.py`` (``BatchDescriptor``,
``DPMetadata``), ``ubatch_utils.py`` and ``lora/utils.py`` are executed
leniently; the caller method is cut out of ``gpu_model_runner.py``
(:mod:`~dpsim.targets.v1.caller`). A ``--target`` file replaces
``dp_utils.py``, a ``--caller-file`` ``gpu_model_runner.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dpsim.errors import TargetError
from dpsim.records.policy import CudagraphMode, ManagerConfig, Microbatching
from dpsim.targets import adapters, load, standins
from dpsim.targets.manager import ParallelConfigStandIn
from dpsim.targets.shim import EXECUTED, LENIENT, LoadedFile, ModuleLoader, function
from dpsim.targets.spec import (
    OLDEST_V1_RELEASE,
    V1_ENTRY,
    TargetSpec,
    v1_removed,
    v1_runner_removed,
)
from dpsim.targets.v1 import caller as caller_module
from dpsim.targets.v1.api import V1API, CallerLike, recording
from dpsim.targets.v1.dispatcher import build_dispatcher
from dpsim.targets.v1.modelled import ModelledCaller

V1_EXECUTED = frozenset(
    {
        load.V1_DP_UTILS_MODULE,
        load.V1_DISPATCHER_MODULE,
        "vllm.utils.math_utils",
    }
)
V1_LENIENT = LENIENT | {load.FORWARD_CONTEXT_MODULE, "vllm.lora.utils"}
#: V2's stand-ins but for ``dp_utils``, which V1 executes (its skip switch is
#: pointed at the world after loading, see :func:`_loaded_sync`).
V1_STAND_INS = {
    **{
        name: value
        for name, value in standins.STAND_INS.items()
        if name != load.V1_DP_UTILS_MODULE
    },
    # 0.30+: pinned host memory only for CUDA tensors; dpsim's are on the CPU.
    "vllm.utils.torch_utils": {"PIN_MEMORY": False},
    # 0.28+: a debug guard around device syncs, inert unless vLLM's debug
    # switch is on.
    "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
}
SKIP_SWITCH = "should_skip_dp_coordination"


@dataclass(frozen=True, eq=False)
class V1Target(load.Target):
    """The V1 runner's coordination of one vLLM: its sync, caller and dispatcher.

    ``dp_utils`` is ``vllm/v1/worker/dp_utils.py``; ``cudagraph_utils`` is the
    dispatcher's module (V1's counterpart of V2's manager module).
    """

    forward_context: ModuleType = field(repr=False)
    #: The caller method as loaded; None where it is modelled (0.11.x).
    caller: caller_module.Caller | None = field(repr=False)
    coordination_skippable: bool
    #: How this release rounds capture sizes for speculative decoding
    #: (:data:`~dpsim.targets.v1.dispatcher.SPEC_ROUNDING`).
    spec_rounding: str | None

    @property
    def caller_modelled(self) -> bool:
        return self.caller is None

    @property
    def label(self) -> str:
        base = f"vllm {self.version}" if self.version else f"vllm at {self.spec.base}"
        if self.spec.dp_utils_file is not None:
            base = f"{self.spec.dp_utils_file.name} on {base}"
        if self.spec.caller_file is not None:
            base = f"{base} with caller {self.spec.caller_file.name}"
        return f"{base} (V1 runner)"

    @property
    def BatchExecutionDescriptor(self) -> type:
        return self.forward_context.BatchDescriptor

    @property
    def manager_class(self) -> type:
        return self.cudagraph_utils.CudagraphDispatcher

    def build_manager(
        self, config: ManagerConfig, manager_class: type | None = None
    ) -> Any:
        """A real, initialised ``CudagraphDispatcher`` of this version for
        ``config`` (V1 has one kind: ``manager_class`` must be None)."""
        assert manager_class is None
        return build_dispatcher(
            self.manager_class,
            self.CUDAGraphMode,
            config,
            self.compilation.__dict__.get("CompilationConfig"),
            self.spec_rounding,
        )

    @property
    def skips_coordination(self) -> bool:
        return self.coordination_skippable

    def parallel_config(
        self, dp_size: int, dp_rank: int, microbatching: Microbatching | None
    ) -> ParallelConfigStandIn:
        config = super().parallel_config(dp_size, dp_rank, microbatching)
        # vLLM's default: the V1 sync reduces on the DP device group (NCCL in a
        # deployment, the simulator's CPU stand-in here).
        config.disable_nccl_for_dp_synchronization = False
        return config

    def what_loaded(self) -> dict[str, Any]:
        """What this target runs, for ``dpsim targets``."""
        return what_loaded(self)


def load_v1(spec: TargetSpec, package_dir: Path, version: str | None) -> V1Target:
    loader = ModuleLoader(
        package_dir,
        overrides=_overrides(spec),
        stand_ins=V1_STAND_INS,
        executed=EXECUTED | V1_EXECUTED,
        lenient=V1_LENIENT,
    )
    if v1_runner_removed(package_dir):
        raise TargetError(v1_removed(str(spec.base)))
    for required in (
        load.V1_DP_UTILS_MODULE,
        load.V1_DISPATCHER_MODULE,
        load.FORWARD_CONTEXT_MODULE,
        load.COMPILATION_MODULE,
    ):
        if loader.source_path(required) is None:
            raise TargetError(
                f"{spec.base}: no {required.replace('.', '/')}.py there (dpsim's V1 "
                f"runner needs vLLM {OLDEST_V1_RELEASE} or later)"
            )
    compilation = loader.module(load.COMPILATION_MODULE)
    mode_enum = compilation.__dict__.get("CUDAGraphMode")
    if mode_enum is None or not hasattr(mode_enum, CudagraphMode.NONE):
        raise TargetError(
            f"{spec.base}: vllm/config/compilation.py has no CUDAGraphMode"
        )
    dp_utils = loader.module(load.V1_DP_UTILS_MODULE)
    sync = function(dp_utils, V1_ENTRY)
    if sync is None:
        raise TargetError(
            f"{dp_utils.__file__} defines no {V1_ENTRY}: not the V1 runner's dp_utils.py"
        )
    skippable = function(dp_utils, SKIP_SWITCH) is not None
    if skippable:
        # The world decides when a call is solo, as for V2's stand-in.
        dp_utils.__dict__[SKIP_SWITCH] = standins.should_skip_dp_coordination
    dispatcher_module = loader.module(load.V1_DISPATCHER_MODULE)
    forward_context = loader.module(load.FORWARD_CONTEXT_MODULE)
    descriptor = forward_context.__dict__.get("BatchDescriptor")
    if not isinstance(descriptor, type):
        raise TargetError(
            f"{spec.base}: vllm/forward_context.py has no BatchDescriptor"
        )
    if not isinstance(dispatcher_module.__dict__.get("CudagraphDispatcher"), type):
        raise TargetError(
            f"{spec.base}: vllm/v1/cudagraph_dispatcher.py has no CudagraphDispatcher"
        )
    caller_path = loader.source_path(load.V1_CALLER_MODULE)
    if caller_path is None:
        raise TargetError(
            f"{spec.base}: no vllm/v1/worker/gpu_model_runner.py there (the V1 "
            "caller's file)"
        )
    recorded = recording(sync)
    caller: caller_module.Caller | None = None
    if _has_caller(caller_path) or spec.caller_file is not None:
        globals_ = _caller_globals(loader, mode_enum, descriptor, recorded)
        caller = caller_module.extract(caller_path, version, globals_)
        files = [*loader.loaded, LoadedFile.read(load.V1_CALLER_MODULE, caller_path)]
        api = _adapt(dp_utils, sync, caller, descriptor, mode_enum)
    elif "allow_dp_padding" in inspect.signature(sync).parameters:
        # 0.11.x: the sync sits inside _prepare_inputs; its caller is modelled.
        modelled = ModelledCaller(recorded, descriptor, mode_enum)
        # Hashed all the same: the release the model follows is this file.
        files = [*loader.loaded, LoadedFile.read(load.V1_CALLER_MODULE, caller_path)]
        api = _adapt(dp_utils, sync, modelled, descriptor, mode_enum)
    else:
        raise TargetError(
            f"{caller_path}: {caller_module.RUNNER_CLASS} has no "
            f"{caller_module.CALLER_METHOD}, and this {V1_ENTRY} is not the 0.11 one "
            "whose caller dpsim models"
        )
    return V1Target(
        spec=spec,
        version=version,
        files=tuple(files),
        package_dir=package_dir,
        dp_utils=dp_utils,
        cudagraph_utils=dispatcher_module,
        compilation=compilation,
        api=api,
        split_sizes=None,
        forward_context=forward_context,
        caller=caller,
        coordination_skippable=skippable,
        spec_rounding=spec_rounding(caller_path, Path(compilation.__file__ or "")),
    )


#: The call that rounds capture sizes for speculative decoding before capture.
_ROUNDING_CALL = ".adjust_cudagraph_sizes_for_spec_decode("
#: How many lines above that call its guard sits.
_GUARD_LINES = 8


def spec_rounding(*sources: Path) -> str | None:
    """Where and when the release rounds capture sizes for speculative
    decoding, read off the guard above its call: in the model runner up to
    0.19 (FULL decode with a separate routine), in ``CompilationConfig`` from
    0.20 (any FULL decode). None when neither file calls it."""
    for path in sources:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines):
            if _ROUNDING_CALL in line and "def " not in line:
                guard = "\n".join(lines[max(number - _GUARD_LINES, 0) : number])
                if "separate_routine()" in guard:
                    return "separate_routine"
                return "full_decode"
    return None


def _has_caller(path: Path) -> bool:
    """Whether ``path`` defines the caller method, read off its text (the
    extraction, which parses it, names anything else wrong with it)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return True  # let the extraction say why it cannot be read
    return f"def {caller_module.CALLER_METHOD}(" in text


def _overrides(spec: TargetSpec) -> dict[str, Path]:
    overrides = {}
    if spec.dp_utils_file is not None:
        overrides[load.V1_DP_UTILS_MODULE] = spec.dp_utils_file
    if spec.caller_file is not None:
        overrides[load.V1_CALLER_MODULE] = spec.caller_file
    return overrides


class CUDAGraphStatStandIn:
    """``CUDAGraphStat`` (``vllm/compilation/cuda_graph.py``): the caller only
    builds one when CUDA-graph metrics are on, which dpsim's runner has off."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _caller_globals(
    loader: ModuleLoader, mode_enum: Any, descriptor: type, sync: Any
) -> dict[str, Any]:
    """The module globals the caller methods may use, from the loaded modules."""
    from dpsim.targets.shim import TORCH_VIEW

    math_utils = loader.module("vllm.utils.math_utils")
    ubatch_utils = loader.module("vllm.v1.worker.ubatch_utils")
    named: dict[str, Any] = {
        "CUDAGraphMode": mode_enum,
        "BatchDescriptor": descriptor,
        "CUDAGraphStat": CUDAGraphStatStandIn,
        V1_ENTRY: sync,
        "np": np,
        "torch": TORCH_VIEW,
    }
    for module in (math_utils, ubatch_utils):
        for name, value in module.__dict__.items():
            if not name.startswith("_") and inspect.isfunction(value):
                named.setdefault(name, value)
    return named


def _adapt(
    dp_utils: ModuleType,
    sync: Any,
    caller: CallerLike,
    descriptor: type,
    mode_enum: Any,
) -> V1API:
    parameters = tuple(inspect.signature(sync).parameters)
    if parameters[:2] != ("num_tokens_unpadded", "allow_microbatching"):
        raise TargetError(
            f"{dp_utils.__file__}: {V1_ENTRY}{inspect.signature(sync)} has a "
            "signature no dpsim adapter supports"
        )
    collective, rows = adapters._read_collective(Path(dp_utils.__file__ or ""))
    agreement = ["num_tokens_across_dp", "ubatch"]
    if "cudagraph_mode" in parameters:
        agreement.insert(1, "cg_mode")
    return V1API(
        caller=caller,
        parameters=parameters,
        agreement_fields=tuple(agreement),
        descriptor_fields=_fields(descriptor),
        collective=f"{collective} (on the DP device group)",
        tensor_rows=rows,
        mode_enum=mode_enum,
    )


def _fields(descriptor: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(descriptor):
        return tuple(item.name for item in dataclasses.fields(descriptor))
    return tuple(getattr(descriptor, "_fields", ()))


def what_loaded(target: V1Target) -> dict[str, Any]:
    """What a V1 target runs: sync, caller, dispatcher, collective, features."""
    api = target.api
    assert isinstance(api, V1API)
    caller = target.caller
    return {
        "runner": "v1",
        "sync": {
            "entry": V1_ENTRY,
            "file": target.dp_utils.__file__,
            "parameters": list(api.parameters),
        },
        "caller": (
            "modelled"
            if caller is None
            else {
                "method": f"{caller_module.RUNNER_CLASS}.{caller.entry.name}",
                "file": str(caller.path),
                "lines": [caller.entry.first_line, caller.entry.last_line],
                "also": [method.name for method in caller.methods[1:]],
                "parameters": list(caller.parameters),
                "reads": [".".join(chain) for chain in caller.answered],
                "not_modelled": [".".join(chain) for chain in caller.unanswered],
            }
        ),
        "dispatcher": f"{target.manager_class.__name__} ({target.cudagraph_utils.__file__})",
        "tensor_rows": api.tensor_rows,
        "collective": api.collective,
        "group": "get_dp_group().device_group",
        "features": list(api.features),
        "agreement_fields": list(api.agreement_fields),
        "descriptor_fields": list(api.descriptor_fields),
        "skips_coordination": target.skips_coordination,
    }
