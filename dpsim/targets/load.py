"""A loaded target: the real sync function of one vLLM, ready to run.

``load_target`` resolves a spec to a package directory (the release cache, a
source tree, an installed package), executes the files under test in a
private :class:`~dpsim.targets.shim.ModuleLoader`, and adapts the result.
Loaded targets are memoised per spec and file state, so a process that
checks thousands of cases loads each version once.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from dpsim.errors import TargetError
from dpsim.records.policy import CudagraphMode, ManagerConfig, Microbatching
from dpsim.targets import adapters
from dpsim.targets.api import TargetAPI
from dpsim.targets.cache import cache_root, ensure_release
from dpsim.targets.manager import ParallelConfigStandIn, build_manager
from dpsim.targets.shim import LoadedFile, ModuleLoader
from dpsim.targets.spec import OLDEST_RELEASE, ReleaseSpec, TargetSpec, parse_target
from dpsim.targets.split_sizes import (
    CONFIG_FILE,
    SplitSizes,
    load_split_sizes,
    takes_split_sizes,
)
from dpsim.targets.standins import STAND_INS

DP_UTILS_MODULE = "vllm.v1.worker.gpu.dp_utils"
CUDAGRAPH_MODULE = "vllm.v1.worker.gpu.cudagraph_utils"
COMPILATION_MODULE = "vllm.config.compilation"
MATH_UTILS_MODULE = "vllm.utils.math_utils"
#: 0.34+: the file whose VllmConfig methods resolve the split capture tables.
VLLM_CONFIG_MODULE = "vllm.config.vllm"
_TARGET_DEPENDENT_SPECULATOR = (
    "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py"
)
#: The V1 runner's sync, its dispatcher, its descriptors, and the module whose
#: file the V1 caller method is taken from (never executed as a module).
V1_DP_UTILS_MODULE = "vllm.v1.worker.dp_utils"
V1_DISPATCHER_MODULE = "vllm.v1.cudagraph_dispatcher"
FORWARD_CONTEXT_MODULE = "vllm.forward_context"
V1_CALLER_MODULE = "vllm.v1.worker.gpu_model_runner"
UBATCH_UTILS_MODULE = "vllm.v1.worker.ubatch_utils"
#: What dpsim takes from each module the V2 runner's sync needs.
_READ_FROM = {
    DP_UTILS_MODULE: "the sync",
    CUDAGRAPH_MODULE: "the CudaGraphManager",
    COMPILATION_MODULE: "CUDAGraphMode",
}
# ``__version__ = version = '0.29.0'`` as setuptools-scm writes it, or simpler.
_VERSION_LINE = re.compile(r"""^(?:__version__|version)\b.*?['"]([^'"]+)['"]""", re.M)


@dataclass(frozen=True, eq=False)
class Target:
    """The real DP-sync code of one vLLM (or one file on top of one vLLM)."""

    spec: TargetSpec
    #: The vLLM version of the base, when known.
    version: str | None
    files: tuple[LoadedFile, ...]
    #: The directory playing ``vllm/`` (cache entry, tree or package).
    package_dir: Path
    dp_utils: ModuleType = field(repr=False)
    cudagraph_utils: ModuleType = field(repr=False)
    compilation: ModuleType = field(repr=False)
    api: TargetAPI = field(repr=False)
    #: The release's resolution of 0.34's split capture tables, where its
    #: manager takes them (:mod:`dpsim.targets.split_sizes`).
    split_sizes: SplitSizes | None = field(repr=False)

    @property
    def runner(self) -> str:
        """The model runner whose sync this is: "v1" or "v2"."""
        return self.spec.runner

    @property
    def label(self) -> str:
        base = f"vllm {self.version}" if self.version else f"vllm at {self.spec.base}"
        if self.spec.dp_utils_file is None:
            return base
        return f"{self.spec.dp_utils_file.name} on {base}"

    @property
    def CUDAGraphMode(self) -> Any:
        return self.compilation.CUDAGraphMode

    @property
    def BatchExecutionDescriptor(self) -> type:
        return self.cudagraph_utils.BatchExecutionDescriptor

    @property
    def manager_class(self) -> type:
        return self.cudagraph_utils.CudaGraphManager

    def build_manager(
        self, config: ManagerConfig, manager_class: type | None = None
    ) -> Any:
        """A real ``CudaGraphManager`` of this version for ``config`` (or
        ``manager_class``, another of its managers, such as the runner
        lane's ``ModelCudaGraphManager``)."""
        return build_manager(
            manager_class or self.manager_class,
            self.CUDAGraphMode,
            config,
            self.compilation.__dict__.get("CompilationConfig"),
            self.split_sizes,
        )

    @functools.cached_property
    def skips_coordination(self) -> bool:
        """Whether this vLLM lets callers skip DP coordination
        (``skip_dp_coordination()``, 0.30+), whatever the sync file does with it."""
        runtime_helpers = self.source_text("v1/worker/dp_utils.py") or ""
        return "def skip_dp_coordination" in runtime_helpers

    @functools.cached_property
    def drafter_prefill_passes_query_bound(self) -> bool:
        """Whether this vLLM's drafter prefill, reusing the target's
        agreement, passes its batch's query-length bound beside it (0.34's
        ``TargetDependentARSpeculator``: the bound the target's step passed),
        rather than none (earlier releases)."""
        text = self.source_text(_TARGET_DEPENDENT_SPECULATOR)
        if text is None:
            return False
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return False
        return any(
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "dispatch_cg_and_sync_dp"
            and {"max_query_len", "dp_sync_state"}
            <= {keyword.arg for keyword in node.keywords}
            for node in ast.walk(tree)
        )

    def source_text(self, relative: str) -> str | None:
        """A file of the base vLLM (e.g. its model runner), read not executed."""
        try:
            return (self.package_dir / relative).read_text()
        except OSError:
            return None

    def parallel_config(
        self, dp_size: int, dp_rank: int, microbatching: Microbatching | None
    ) -> ParallelConfigStandIn:
        return ParallelConfigStandIn(
            data_parallel_size=dp_size,
            data_parallel_rank=dp_rank,
            microbatching=microbatching,
        )


_loaded: dict[tuple[Any, ...], Target] = {}


def load_target(
    vllm: str | None = None,
    target_file: str | Path | None = None,
    runner: str | None = None,
    caller_file: str | Path | None = None,
) -> Target:
    """Load ``--vllm SPEC`` (default: the newest supported release), optionally
    with ``--target FILE`` replacing its runner's ``dp_utils.py``, for
    ``runner`` (default: see :func:`~dpsim.targets.spec.parse_target`), with
    ``caller_file`` replacing V1's ``gpu_model_runner.py``."""
    return load_spec(parse_target(vllm, target_file, runner, caller_file))


def load_spec(spec: TargetSpec) -> Target:
    # A release's files live in the cache in use; a different cache is a
    # different place to load from.
    where = cache_root() if isinstance(spec.base, ReleaseSpec) else None
    key = (
        spec,
        _file_state(spec.dp_utils_file),
        _file_state(spec.caller_file),
        where,
    )
    found = _loaded.get(key)
    if found is None:
        found = _load(spec)
        _loaded[key] = found
    return found


def _file_state(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    stat = path.stat()
    return (stat.st_mtime_ns, stat.st_size)


def required_modules(runner: str) -> tuple[str, ...]:
    """The modules every target of ``runner`` executes from source, whatever
    its version: what a counterexample of that runner must record. For V1
    that includes the caller's file, which is read (its method cut out, or,
    on 0.11.x, the file whose lines the modelled caller follows), not
    executed as a module."""
    if runner == "v1":
        return (
            V1_DP_UTILS_MODULE,
            UBATCH_UTILS_MODULE,
            V1_DISPATCHER_MODULE,
            FORWARD_CONTEXT_MODULE,
            COMPILATION_MODULE,
            V1_CALLER_MODULE,
        )
    return (DP_UTILS_MODULE, CUDAGRAPH_MODULE, COMPILATION_MODULE)


def source_paths(spec: TargetSpec, modules: Iterable[str]) -> dict[str, Path | None]:
    """The file each module would be executed from if ``spec`` were loaded
    (``None``: none there), executing nothing: what ``dpsim replay`` hashes
    before it lets a counterexample's target run. A release not cached yet is
    fetched (downloaded and unpacked, never imported)."""
    loader = _loader(spec, _package_dir(spec))
    return {module: loader.source_path(module) for module in modules}


def _package_dir(spec: TargetSpec) -> Path:
    if isinstance(spec.base, ReleaseSpec):
        return ensure_release(spec.base.version, runner=spec.runner)
    return spec.base.package_dir


def _loader(spec: TargetSpec, package_dir: Path) -> ModuleLoader:
    overrides = {}
    if spec.dp_utils_file is not None:
        sync = V1_DP_UTILS_MODULE if spec.runner == "v1" else DP_UTILS_MODULE
        overrides[sync] = spec.dp_utils_file
    if spec.caller_file is not None:
        overrides[V1_CALLER_MODULE] = spec.caller_file
    return ModuleLoader(package_dir, overrides=overrides, stand_ins=STAND_INS)


def _load(spec: TargetSpec) -> Target:
    package_dir = _package_dir(spec)
    if isinstance(spec.base, ReleaseSpec):
        version: str | None = spec.base.version
    else:
        version = _tree_version(package_dir)
    if spec.runner == "v1":
        # Imported here: the V1 loader builds on this module's Target.
        from dpsim.targets.v1.load import load_v1

        return load_v1(spec, package_dir, version)
    loader = _loader(spec, package_dir)
    required = (DP_UTILS_MODULE, CUDAGRAPH_MODULE, COMPILATION_MODULE)
    missing = [name for name in required if loader.source_path(name) is None]
    if missing:
        file = f"{missing[0].replace('.', '/')}.py"
        if len(missing) < len(required):
            # Newer, not older: a module dpsim reads has moved or been renamed.
            raise TargetError(
                f"{spec.base}: no {file} there, though the rest of the V2 "
                "runner's sync is: this code moved it, and dpsim reads "
                f"{_READ_FROM[missing[0]]} from that file"
            )
        raise TargetError(
            f"{spec.base}: no {file} there (dpsim needs vLLM {OLDEST_RELEASE} or later)"
        )
    dp_utils = loader.module(DP_UTILS_MODULE)
    cudagraph_utils = loader.module(CUDAGRAPH_MODULE)
    compilation = loader.module(COMPILATION_MODULE)
    mode_enum = compilation.__dict__.get("CUDAGraphMode")
    if mode_enum is None or not hasattr(mode_enum, CudagraphMode.NONE):
        raise TargetError(
            f"{spec.base}: vllm/config/compilation.py has no CUDAGraphMode"
        )
    api = adapters.adapt(dp_utils, cudagraph_utils, mode_enum)
    split_sizes = None
    files = list(loader.loaded)
    if takes_split_sizes(
        tuple(inspect.signature(cudagraph_utils.CudaGraphManager).parameters)
    ):
        split_sizes = load_split_sizes(
            package_dir, version, compilation, loader.module(MATH_UTILS_MODULE)
        )
        # Read, not executed as a module: recorded so a replay checks it too.
        files.append(LoadedFile.read(VLLM_CONFIG_MODULE, package_dir / CONFIG_FILE))
    return Target(
        spec=spec,
        version=version,
        files=tuple(files),
        package_dir=package_dir,
        dp_utils=dp_utils,
        cudagraph_utils=cudagraph_utils,
        compilation=compilation,
        api=api,
        split_sizes=split_sizes,
    )


def _tree_version(package_dir: Path) -> str | None:
    version_file = package_dir / "_version.py"
    try:
        match = _VERSION_LINE.search(version_file.read_text())
    except OSError:
        return None
    return match.group(1) if match else None
