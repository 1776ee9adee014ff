"""The real V2 ``Worker`` of a release, per virtual rank, over the real runner.

:func:`build_worker` rebuilds ``Worker`` from the release's
``v1/worker/gpu_worker.py`` with the methods the engine's executor calls on
the DP path (:data:`RUN_FOR_REAL`: ``execute_model``, ``sample_tokens``,
``execute_dummy_batch``, ``take_draft_token_ids``, and what they call:
``annotate_profile``, 0.33's ``randomize_dummy_inputs``) and gives it the
rank's real ``GPUModelRunner`` (:mod:`.model_runner`).

Decorators dropped, with why: ``@torch.inference_mode()`` (thread-local torch
state shared by virtual ranks, held on for the whole run by the installed
world instead; see :mod:`.model_runner`) and
``@with_gpu_sync_check`` (a debug check for GPU-to-CPU syncs, which returns
the method unchanged unless a debug switch enabled it).

Stood in for: the profiler (none: ``annotate_profile`` gives vLLM's own
``nullcontext``), ``vllm.envs`` (``VLLM_RANDOMIZE_DP_DUMMY_INPUTS`` off, as
by default). Pipeline parallelism is not modelled: the pipeline group is the
shim's single stage, so the PP send/receive paths are never taken (and
would meet unsupplied names, a gap, if they were).
"""

from __future__ import annotations

import ast
import contextlib
import functools
from pathlib import Path
from types import NoneType
from typing import Any

import numpy as np
import torch

from dpsim.lanes.runner.extract import real_class
from dpsim.lanes.runner.model_runner import (
    OUTPUTS_MODULE,
    Sources,
    Sync,
    build_model_runner,
    runner_kit,
)
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import instance, standin
from dpsim.records.policy import CapturePolicy
from dpsim.targets.shim import is_stub, parse_source
from dpsim.targets.standins import get_pp_group, get_single_rank_group

WORKER_MODULE = "vllm.v1.worker.gpu_worker"
#: Worker methods run for real: the first four must be there; the others
#: are kept where the release has them.
REQUIRED = (
    "execute_model",
    "sample_tokens",
    "execute_dummy_batch",
    "take_draft_token_ids",
)
RUN_FOR_REAL = (*REQUIRED, "annotate_profile", "randomize_dummy_inputs")
DECORATORS = {"torch.inference_mode()": None, "with_gpu_sync_check": None}


def build_worker(
    sources: Sources,
    options: EngineOptions,
    policy: CapturePolicy,
    rank: int,
    dp_size: int,
    *,
    speculator: Any,
    sync: Sync,
) -> Any:
    """Rank ``rank``'s real ``Worker`` over its real ``GPUModelRunner``
    (:func:`~dpsim.lanes.runner.model_runner.build_model_runner`, which says
    what ``speculator`` and ``sync`` are)."""
    runner = build_model_runner(
        sources, options, policy, rank, dp_size, speculator, sync=sync
    )
    return worker_over(sources, runner)


def worker_over(sources: Sources, runner: Any) -> Any:
    """The real ``Worker`` over ``runner``, the rank's real model runner of
    either runner (``sources.runner``: the worker's ``use_v2_model_runner``)."""
    return instance(
        _worker_class(sources),
        model_runner=runner,
        vllm_config=standin(
            "VllmConfig",
            parallel_config=runner.parallel_config,
            compilation_config=standin("CompilationConfig"),
        ),
        parallel_config=runner.parallel_config,
        _pp_send_work=[],
        use_v2_model_runner=sources.runner == "v2",
        profiler=None,
    )


def real_classes(sources: Sources) -> tuple[type, ...]:
    """The release's classes the worker and runner rebuild (their real
    methods: ``cls.DPSIM_ORIGIN.codes()``), for line coverage."""
    kit = runner_kit(sources, sources.target)
    connectors = (kit.kv_connector, kit.ec_connector)  # no EC connector: 0.26-0.27
    return (
        _worker_class(sources),
        kit.runner_class,
        kit.eplb_class,
        *(type(connector) for connector in connectors if connector is not None),
    )


@functools.lru_cache(maxsize=16)
def _worker_class(sources: Sources) -> type:
    if sources.runner == "v1":
        from dpsim.lanes.runner.v1.model_runner import v1_runner_kit

        outputs = v1_runner_kit(sources).modules[OUTPUTS_MODULE]
    else:
        outputs = runner_kit(sources, sources.target).modules[OUTPUTS_MODULE]
    return _built(
        sources.path(WORKER_MODULE),
        sources.version,
        outputs.__dict__.get("ModelRunnerOutput"),
        outputs.__dict__.get("AsyncModelRunnerOutput"),
    )


@functools.lru_cache(maxsize=16)
def _built(
    path: Path, version: str | None, model_runner_output: Any, async_output: Any
) -> type:
    _, tree = parse_source(path)
    have: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Worker":
            have = {
                item.name for item in node.body if isinstance(item, ast.FunctionDef)
            }
    globals_: dict[str, Any] = {
        "torch": torch,
        "np": np,
        "NoneType": NoneType,
        "nullcontext": contextlib.nullcontext,
        "get_pp_group": get_pp_group,
        "get_tp_group": get_single_rank_group,
        "envs": standin("vllm.envs", VLLM_RANDOMIZE_DP_DUMMY_INPUTS=False),
    }
    for name, value in (
        ("ModelRunnerOutput", model_runner_output),
        ("AsyncModelRunnerOutput", async_output),
    ):
        if value is not None and not is_stub(value):
            globals_[name] = value
    return real_class(
        path,
        "Worker",
        [name for name in RUN_FOR_REAL if name in REQUIRED or name in have],
        version=version,
        globals_=globals_,
        decorators=DECORATORS,
    )
