"""Which vLLM files the runner lane reads, for one target, and how it loads them.

The lane runs more of vLLM than the sync lane: the engine core's busy loop,
the worker, the V2 model runner and its helpers, the speculators, the
scheduler's output types. :data:`RUNNER_LANE_MODULES` names them (each part
of the lane adds the modules it needs here, one line each); for a release,
the cache keeps their files too, fetched (or fetched again, once, said in one
line on stderr) the first time the lane uses the release, so the sync lane's
fetch stays as small as it was (:func:`dpsim.targets.cache.ensure_release`).
A module a release does not have is simply absent: :meth:`RunnerSources.has`
says so, and :meth:`RunnerSources.path` refuses in one line naming it.

Loading a module (:meth:`RunnerSources.load_module`) goes through the shim's
:class:`~dpsim.targets.shim.ModuleLoader`, one per sources object, with each
module's mode chosen by the caller:

* strict (``lenient=False``): the file is executed as is; any error is a
  one-line :class:`~dpsim.errors.TargetError` naming the line;
* lenient (``lenient=True``): statement by statement; a statement that fails
  (it needs a dependency dpsim does not load) leaves the names it binds as
  *inert stubs* that answer everything. Stubs are NOT strict: lane code must
  not let vLLM touch them. Prefer strict loads, or extract just the classes
  needed with :func:`~dpsim.lanes.runner.extract.real_class` using a lenient
  module's namespace only for the names that did load for real.

The loader is seeded with the sync lane's :class:`~dpsim.targets.load.Target`
of the same spec (:attr:`RunnerSources.target`): its ``dp_utils``,
``cudagraph_utils`` and ``compilation`` modules ARE the lane's, so a class or
enum member the lane's code compares (``CUDAGraphMode.FULL``,
``CudaGraphManager`` subclasses) is the very object the sync lane's managers
and adapters use. One sources object per run: share it between the parts.

Either way, what the module imports from vLLM modules nobody loaded, and
every third-party package but torch and numpy, is an inert stub (the shim's
rule), and module-level state is shared by every virtual rank using the
loader: per-rank state (forward context, caches) needs per-rank stand-ins.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsim.errors import TargetError
from dpsim.lanes.runner import where
from dpsim.targets.cache import ensure_release
from dpsim.targets.load import (
    COMPILATION_MODULE,
    CUDAGRAPH_MODULE,
    DP_UTILS_MODULE,
    FORWARD_CONTEXT_MODULE,
    V1_CALLER_MODULE,
    V1_DISPATCHER_MODULE,
    V1_DP_UTILS_MODULE,
    Target,
    _tree_version,
    load_spec,
)
from dpsim.targets.shim import EXECUTED, ModuleLoader
from dpsim.targets.spec import (
    ReleaseSpec,
    TargetSpec,
    TreeSpec,
    _release_key,
    check_release,
)
from dpsim.targets.standins import STAND_INS
from dpsim.targets.v1.load import V1Target

#: The modules the runner lane reads. ``pkg.*`` is the whole package below
#: ``pkg``; a package's own name is its ``__init__.py``.
RUNNER_LANE_MODULES: tuple[str, ...] = (
    "vllm.v1.engine.core",
    "vllm.v1.engine.coordinator",
    "vllm.v1.engine",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.gpu.input_batch",
    "vllm.v1.worker.gpu.states",
    "vllm.v1.worker.gpu.eplb_utils",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.dp_utils",
    "vllm.v1.worker.gpu.async_utils",
    "vllm.v1.worker.gpu.spec_decode.*",
    "vllm.v1.worker.gpu.sample.greedy_argmax",
    "vllm.v1.worker.utils",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.interface",
    "vllm.v1.worker.utils",
    "vllm.v1.worker.gpu.attn_utils",
    "vllm.v1.outputs",
    "vllm.config.parallel",
    "vllm.forward_context",
    "vllm.v1.worker.gpu.kv_connector",
    "vllm.v1.worker.gpu.ec_connector",
    "vllm.v1.worker.gpu.pcp_manager",
    "vllm.v1.worker.gpu.cp_utils",
)
#: The modules the runner lane reads for the V1 model runner (``--runner
#: v1``): the same engine and scheduler output types, the V1 runner's worker,
#: model runner, drafters and helpers. Fetched only when the V1 runner lane
#: uses a release: the V2 lane's and the sync lane's fetches stay as they were.
V1_RUNNER_LANE_MODULES: tuple[str, ...] = (
    "vllm.v1.engine.core",
    "vllm.v1.engine.coordinator",
    "vllm.v1.engine",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.interface",
    "vllm.config.parallel",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.ubatch_utils",
    "vllm.v1.worker.dp_utils",
    "vllm.v1.worker.utils",
    "vllm.v1.cudagraph_dispatcher",
    "vllm.v1.spec_decode.*",
    # The drafter's CommonAttentionMetadata (0.2x+, and its older home).
    "vllm.v1.attention.backend",
    "vllm.v1.attention.backends.utils",
    "vllm.v1.outputs",
    "vllm.forward_context",
    "vllm.utils.math_utils",
)
#: The oldest (major, minor) the lane drives: the V2 runner's engine, worker
#: and speculator layout it is written against starts there.
OLDEST_RUNNER_LANE = (0, 26)
#: The oldest (major, minor) the lane drives with the V1 runner: the V1
#: runner's caller method, around which the lane runs its steps, starts there
#: (the engine loop is driven from 0.12 too, :mod:`.engine`).
OLDEST_V1_RUNNER_LANE = (0, 12)
#: What the V2 releases the sync lane drives (0.18+) but the runner lane
#: does not lack, each with the (major, minor) that added it (``{}`` in the
#: text): a release is refused naming every one it predates. Each is a fact of the releases' own
#: files (the release-marked tests check them against the files).
_ADDED_IN: tuple[tuple[tuple[int, int], str], ...] = (
    (
        (0, 26),
        "its V2 model runner has no sort_batch_req_ids ({} added it; before, "
        "prepare_inputs orders the batch's requests inline), which the lane's "
        "stood-in prepare_inputs takes from the release",
    ),
    (
        (0, 26),
        "its speculators have no SpeculatorCudaGraphManager ({} added it), "
        "from which the lane builds the drafter's graphs",
    ),
    (
        (0, 23),
        "it has no target-dependent autoregressive speculator "
        "(spec_decode/autoregressive, {} added it; only EAGLE's)",
    ),
)


def lane_modules(runner: str) -> tuple[str, ...]:
    """The modules the runner lane reads for ``runner``'s model runner."""
    return V1_RUNNER_LANE_MODULES if runner == "v1" else RUNNER_LANE_MODULES


def wheel_prefixes(modules: tuple[str, ...] = RUNNER_LANE_MODULES) -> tuple[str, ...]:
    """The paths inside a wheel that hold ``modules`` (what the cache keeps)."""
    prefixes: list[str] = []
    for module in modules:
        if module.endswith(".*"):
            prefixes.append(module[:-2].replace(".", "/") + "/")
        else:
            base = module.replace(".", "/")
            prefixes.extend((f"{base}.py", f"{base}/__init__.py"))
    return tuple(prefixes)


#: What the releases the V1 sync lane drives (0.11.1+) but the V1 runner
#: lane does not lack, each with the (major, minor) that added it, as
#: :data:`_ADDED_IN` (checked against the files by release-marked tests).
_V1_ADDED_IN: tuple[tuple[tuple[int, int], str], ...] = (
    (
        (0, 12),
        "its GPUModelRunner has no _determine_batch_execution_and_padding ({} "
        "added it; before, the DP sync sits inside _prepare_inputs), whose "
        "real caller the lane runs",
    ),
)


def check_runner_lane_release(version: str, runner: str = "v2") -> None:
    """Refuse, before any fetch, a release the lane cannot drive with ``runner``."""
    if runner == "v1":
        _check_v1_runner_lane_release(version)
        return
    check_release(version, "v2")  # before 0.18: the sync lane's own refusal
    _refuse_older(version, OLDEST_RUNNER_LANE, _ADDED_IN, "runner lane", "runner lane")


def _check_v1_runner_lane_release(version: str) -> None:
    check_release(version, "v1")  # before 0.11.1: the sync lane's own refusal
    _refuse_older(
        version,
        OLDEST_V1_RUNNER_LANE,
        _V1_ADDED_IN,
        "runner lane (V1 runner)",
        "V1 runner lane",
    )


def _refuse_older(
    version: str,
    oldest: tuple[int, int],
    added_in: tuple[tuple[tuple[int, int], str], ...],
    prefix: str,
    lane: str,
) -> None:
    """Refuse a release older than ``oldest``, naming each item of ``added_in``
    it predates."""
    key = _release_key(version)[:2]
    if key >= oldest:
        return
    missing = "; ".join(
        text.format(".".join(map(str, added)))
        for added, text in added_in
        if key < added
    )
    raise TargetError(
        f"{prefix}: vLLM {version} cannot be driven: {missing}; the {lane} "
        f"drives {'.'.join(map(str, oldest))}.0 and later; refused without fetching it"
    )


@dataclass(eq=False)  # hashed by identity: parts cache what they build per sources
class RunnerSources:
    """The vLLM files of one target as the runner lane reads them.

    ``package_dir`` plays ``vllm/``; ``overrides`` maps module names to files
    replacing the package's own (``--target``'s ``dp_utils.py``);
    ``stand_ins`` adds to the shim's faithful stand-ins
    (:data:`dpsim.targets.standins.STAND_INS`) for this loader; ``spec`` is
    the target spec it was made for; ``loaded_target`` the sync lane's
    Target of it when the caller has one already (else loaded on first use).
    """

    package_dir: Path
    version: str | None
    overrides: dict[str, Path] = field(default_factory=dict)
    stand_ins: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    spec: TargetSpec | None = None
    loaded_target: Target | None = None
    _loader: _LaneLoader | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_spec(cls, spec: TargetSpec) -> RunnerSources:
        """A target spec's sources: its release (cache kept for the lane, with
        the files of the spec's runner) or tree, with ``--target`` replacing
        the sync file (V2's ``gpu/dp_utils.py``, V1's ``dp_utils.py``)."""
        if spec.runner not in ("v1", "v2"):
            raise TargetError(
                f"runner lane: drives vLLM's V1 and V2 model runners, not the "
                f"{spec.runner.upper()} runner"
            )
        modules = lane_modules(spec.runner)
        if isinstance(spec.base, ReleaseSpec):
            check_runner_lane_release(spec.base.version, spec.runner)
            package_dir = ensure_release(
                spec.base.version, runner=spec.runner, extra=wheel_prefixes(modules)
            )
            made = cls(package_dir, spec.base.version, spec=spec)
        else:
            package_dir = spec.base.package_dir
            made = cls(package_dir, _tree_version(package_dir), spec=spec)
        if spec.dp_utils_file is not None:
            made.overrides[
                DP_UTILS_MODULE if spec.runner == "v2" else V1_DP_UTILS_MODULE
            ] = spec.dp_utils_file
        if spec.caller_file is not None:
            made.overrides[V1_CALLER_MODULE] = spec.caller_file
        return made

    @classmethod
    def for_release(cls, version: str, runner: str = "v2") -> RunnerSources:
        return cls.for_spec(TargetSpec(ReleaseSpec(version), runner=runner))

    @property
    def runner(self) -> str:
        """The model runner the sources are read for: ``v1`` or ``v2``."""
        return self.spec.runner if self.spec is not None else "v2"

    @classmethod
    def for_tree(cls, package_dir: Path) -> RunnerSources:
        """A vLLM source tree's or installed package's ``vllm/`` directory."""
        return cls.for_spec(TargetSpec(TreeSpec(package_dir)))

    @property
    def target(self) -> Target:
        """The sync lane's loaded target of the same spec (its sync adapters,
        its managers; loaded once per process, as the sync lane loads it)."""
        if self.loaded_target is None:
            spec = self.spec or TargetSpec(
                TreeSpec(self.package_dir),
                dp_utils_file=self.overrides.get(DP_UTILS_MODULE),
            )
            self.loaded_target = load_spec(spec)
        return self.loaded_target

    @property
    def label(self) -> str:
        """How messages name the target: ``vLLM 0.33.0`` or ``vLLM (this tree)``."""
        return f"vLLM {self.version or '(this tree)'}"

    def file_of(self, module: str) -> Path | None:
        """The file ``module`` is read from (a package's ``__init__.py``), or None."""
        if module in self.overrides:
            return self.overrides[module]
        parts = module.split(".")
        if parts[0] != "vllm":
            return None
        base = self.package_dir.joinpath(*parts[1:])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def has(self, module: str) -> bool:
        return self.file_of(module) is not None

    def path(self, module: str) -> Path:
        """The file of ``module``; a one-line refusal naming it when absent."""
        found = self.file_of(module)
        if found is None:
            shown = module.removeprefix("vllm.").replace(".", "/") + ".py"
            raise TargetError(
                f"runner lane: {self.label} has no {shown} ({module}), which the "
                "runner lane needs"
            )
        return found

    @property
    def loader(self) -> ModuleLoader:
        """This target's module loader (made on first use)."""
        if self._loader is None:
            loader = _LaneLoader(self, {**STAND_INS, **self.stand_ins})
            loader.seed(self.target)
            self._loader = loader
        return self._loader

    def load_module(self, name: str, *, lenient: bool) -> types.ModuleType:
        """``name`` executed from its file, strictly or statement by statement
        (see the module docstring); the same module object on every call.

        A module already loaded in the other mode, or already made an inert
        stub because something imported it first, is refused: the caller
        would not get what it asked for.
        """
        self.path(name)  # absent: one line naming it
        loader = self.loader
        mode = "lenient" if lenient else "strict"
        found = loader._modules.get(name)
        if found is not None:
            had = _mode_of(loader, name)
            if had != mode:
                raise TargetError(
                    f"runner lane: {self.label}'s {name} was already loaded "
                    f"{had}, not {mode}"
                )
            return found
        if lenient:
            loader.lenient = loader.lenient | {name}
        else:
            loader.executed = loader.executed | {name}
        return loader.module(name)


#: The V1 target's modules it executes strictly (the rest leniently).
_V1_EXECUTED = frozenset({V1_DP_UTILS_MODULE, V1_DISPATCHER_MODULE})


def _seeded_modules(target: Target) -> tuple[tuple[str, types.ModuleType], ...]:
    """The target's own modules, by the names its runner's code imports
    them as (a V1 target's sync and dispatcher, and its forward context)."""
    if isinstance(target, V1Target):
        return (
            (V1_DP_UTILS_MODULE, target.dp_utils),
            (V1_DISPATCHER_MODULE, target.cudagraph_utils),
            (COMPILATION_MODULE, target.compilation),
            (FORWARD_CONTEXT_MODULE, target.forward_context),
        )
    return (
        (DP_UTILS_MODULE, target.dp_utils),
        (CUDAGRAPH_MODULE, target.cudagraph_utils),
        (COMPILATION_MODULE, target.compilation),
    )


def _mode_of(loader: ModuleLoader, name: str) -> str:
    if name in loader.executed:
        return "strict"
    if name in loader.lenient:
        return "lenient"
    return "as an inert stub"


class _LaneLoader(ModuleLoader):
    """The shim's loader with two additions for the lane: a package's own
    module is its ``__init__.py`` (the engine's ``vllm.v1.engine``), and every
    file it executes counts as vLLM's for :mod:`~dpsim.lanes.runner.where`."""

    def __init__(
        self, sources: RunnerSources, stand_ins: Mapping[str, Mapping[str, Any]]
    ) -> None:
        super().__init__(
            sources.package_dir,
            overrides=sources.overrides,
            stand_ins=stand_ins,
            executed=frozenset(),
            lenient=frozenset(),
        )
        self._sources = sources

    def source_path(self, name: str) -> Path | None:
        return self._sources.file_of(name)

    def seed(self, target: Target) -> None:
        """Make the target's own modules this loader's, in the mode the
        target executed each (see the module docstring)."""
        for name, module in _seeded_modules(target):
            self._modules[name] = module
            if name in EXECUTED or name in _V1_EXECUTED:
                self.executed = self.executed | {name}
            else:
                self.lenient = self.lenient | {name}
        for loaded in target.files:
            where.register_file(loaded.path)

    def _execute(self, name: str, path: Path, *, lenient: bool) -> types.ModuleType:
        where.register_file(path)
        module = super()._execute(name, path, lenient=lenient)
        if path.name == "__init__.py" and not lenient:
            # A strictly executed package is a plain module: its submodules
            # are found as the shim finds them (a lenient one is a ShimModule,
            # which does this itself). Other missing names stay missing.
            module.__dict__.setdefault("__path__", [])
            module.__dict__.setdefault("__getattr__", self._submodule_of(name))
        return module

    def _submodule_of(self, package: str) -> Any:
        def submodule(attribute: str) -> types.ModuleType:
            full = f"{package}.{attribute}"
            if not self._is_module(full):
                raise AttributeError(
                    f"module {package!r} has no attribute {attribute!r}"
                )
            return self.module(full)

        return submodule
