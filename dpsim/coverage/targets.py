"""Which code of a loaded target ``--coverage`` measures.

The sync lane's target is the sync function's own file (every function of
V2's ``v1/worker/gpu/dp_utils.py`` or V1's ``v1/worker/dp_utils.py``), the
dispatch it consults (V2's ``CudaGraphManager.dispatch``, V1's
``CudagraphDispatcher.dispatch``, each with the methods of its class it calls
on ``self`` and the functions of its file it calls by name) and, for V1, the
caller method dpsim runs for real
(``GPUModelRunner._determine_batch_execution_and_padding`` and the methods it
calls, as :mod:`dpsim.targets.v1.caller` cut them out). Support files dpsim
executes only to borrow a definition (``compilation.py``, ``math_utils.py``)
are not the target and are not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpsim.errors import TargetError
from dpsim.lanes.runner.where import display_name

from .scope import Scope, self_calls

_CALLER_MODULE = "vllm.v1.worker.gpu_model_runner"
#: Module -> the method whose closure of ``self`` calls is measured there
#: (None: every function of the file).
_MEASURED: dict[str, str | None] = {
    "vllm.v1.worker.gpu.dp_utils": None,
    "vllm.v1.worker.dp_utils": None,
    "vllm.v1.worker.gpu.cudagraph_utils": "CudaGraphManager.dispatch",
    "vllm.v1.cudagraph_dispatcher": "CudagraphDispatcher.dispatch",
}


def scopes_for(target: Any) -> tuple[Scope, ...]:
    """The scopes of a sync-lane :class:`~dpsim.targets.load.Target`."""
    scopes = []
    for loaded in target.files:
        if loaded.module not in _MEASURED:
            continue
        entry = _MEASURED[loaded.module]
        functions = None
        if entry is not None:
            try:
                functions = self_calls(loaded.path, entry)
            except TargetError:
                continue  # a release whose class has no such method: nothing to measure
        scopes.append(Scope(loaded.path, module_file(loaded.module), functions))
    from dpsim.targets.v1.caller import RUNNER_CLASS, Caller

    caller = getattr(target.api, "caller", None)
    # Before 0.12 the V1 caller is modelled by dpsim (not a Caller): nothing
    # of vLLM's runs there.
    if isinstance(caller, Caller):
        scopes.append(
            Scope(
                str(caller.path),
                module_file(_CALLER_MODULE),
                tuple(f"{RUNNER_CLASS}.{method.name}" for method in caller.methods),
            )
        )
    return tuple(scopes)


def module_file(module: str) -> str:
    """How reports name the file playing ``module`` (``v1/worker/gpu/dp_utils.py``),
    wherever it was read from: a ``--target`` or ``--caller-file`` is shown,
    and matched by the unreachable marks, as the file it stands for."""
    return module.removeprefix("vllm.").replace(".", "/") + ".py"


def runner_lane_scopes(target: Any) -> tuple[Scope, ...]:
    """The runner lane's: every method it rebuilds from the release's files
    and runs for real (engine loop, worker, model runner, speculators, as
    ``dpsim targets --lane runner`` lists them), and the sync lane's scopes
    (the lane runs the release's own sync functions too)."""
    from dpsim.lanes.runner.report import lane_origins

    # Sorted: lane_origins' order is not the same from one process to the
    # next (the V2 speculators' classes come from a set), a report's must be.
    origins = sorted(
        lane_origins(target),
        key=lambda origin: (display_name(Path(origin.path)), origin.class_name),
    )
    scopes = [
        Scope(
            str(origin.path),
            display_name(Path(origin.path)),
            tuple(f"{origin.class_name}.{method}" for method in origin.methods),
        )
        for origin in origins
        # A class rebuilt over its real base with no method of its own
        # (V1's EagleProposer) runs nothing of its file.
        if origin.methods
    ]
    return (*scopes, *scopes_for(target))
