"""What a release's own config code lets a deployment build.

The caller profile claims "what vLLM passes", so its capture policies must be
tables that vLLM itself would build: a false alarm there is the second-worst
outcome after a false pass. A policy is plain data and can say anything the
manager accepts (LoRA cases without 0, microbatching thresholds of 0, a
capture ceiling below the largest size); the release's configuration code
never produces those. :class:`BuildRules` answers, per release, with that
release's own code wherever it loads without a GPU:

* LoRA capture cases: ``get_lora_capture_cases`` of
  ``vllm/v1/worker/gpu/lora_utils.py``, executed from the release. It asks
  ``vllm.lora.utils.get_captured_lora_counts``, which dpsim does not fetch
  (that module imports the model zoo); :func:`captured_lora_counts` models
  it from its documented behaviour. The dummy batch's LoRA count comes from
  the release's ``get_num_active_loras_for_dispatch``.
* Microbatching thresholds: the checks in ``ParallelConfig`` (in
  ``vllm/config/parallel.py``) that raise on DBO thresholds, evaluated on the
  same stand-in that the sync reads. The class itself cannot be built here
  (pydantic, platform probes), so each such ``if`` test is compiled alone.
* Capture ceiling: ``CompilationConfig.post_init_cudagraph_sizes``, whose
  assertion pins ``max_cudagraph_capture_size`` to the largest size.

* Drafter tables: the ``CudaGraphManager`` arguments the release's
  speculators (``vllm/v1/worker/gpu/spec_decode/``) pass, read from their
  calls: none passes LoRA cases, varlen decode or a ubatch runner today.

Capture-size rounding for speculative decoding needs no rule here: the
release's manager (or nothing, where model runner v2 skips it) applies it
when dpsim builds the table, through the release's own config methods.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dpsim.errors import TargetError
from dpsim.records.policy import Microbatching
from dpsim.targets.manager import (
    ConfigView,
    ParallelConfigStandIn,
    manager_parameters,
)
from dpsim.targets.shim import ModuleLoader, function
from dpsim.targets.standins import STAND_INS

if TYPE_CHECKING:
    from dpsim.records.policy import CapturePolicy
    from dpsim.targets.load import Target

__all__ = ["BuildRules", "captured_lora_counts", "rules_for", "rules_of"]

LORA_UTILS_MODULE = "vllm.v1.worker.gpu.lora_utils"
_THRESHOLD_FIELDS = frozenset(
    {"dbo_decode_token_threshold", "dbo_prefill_token_threshold"}
)
#: Floors tried when lifting thresholds into what a release accepts; far above
#: any check vLLM has (``num_ubatches``), so exhausting it means a new rule.
_MAX_THRESHOLD_FLOOR = 4096
#: The largest ``max_loras`` searched when reading a case list back.
_MAX_LORAS = 64


def captured_lora_counts(max_loras: int, specialize: bool) -> list[int]:
    """Active-LoRA counts vLLM captures graphs for (``vllm/lora/utils.py``).

    Without specialisation one count, ``max_loras + 1``; with it, each power
    of two up to ``max_loras`` and ``max_loras + 1``, as vLLM's docstrings
    describe it. Modelled because dpsim does not fetch that module.
    """
    counts = {max_loras + 1}
    if specialize:
        counts.update(1 << k for k in range(max_loras.bit_length()))
    return sorted(counts)


ThresholdCheck = Callable[[Any], Any]


@dataclass(frozen=True, eq=False)
class BuildRules:
    """One release's rules for the tables it builds (see the module docstring).

    A rule the release lacks is None: then nothing is refused on its account
    (an older release without the threshold check does build thresholds of
    0, and a failure there is real).
    """

    #: The release's ``get_lora_capture_cases(lora_config, compilation_config)``.
    lora_capture_cases_fn: Callable[[Any, Any], Any] | None
    #: The release's ``get_num_active_loras_for_dispatch``.
    lora_dispatch_count_fn: Callable[..., Any] | None
    #: The ``if`` tests of ``ParallelConfig`` that raise on DBO thresholds.
    threshold_checks: tuple[ThresholdCheck, ...]
    #: The release's ``CompilationConfig`` (for ``post_init_cudagraph_sizes``).
    compilation_class: type | None
    #: The manager parameters the release's speculators pass, or None when
    #: that cannot be read off their calls (then drafter tables are kept).
    drafter_arguments: frozenset[str] | None = None

    # -- LoRA -------------------------------------------------------------

    def lora_cases(
        self, max_loras: int, specialize_graphs: bool, specialize_active: bool
    ) -> tuple[int, ...] | None:
        """The cases the release captures for this LoRA configuration, or
        None where the release has no LoRA capture cases."""
        if self.lora_capture_cases_fn is None:
            return None
        lora = SimpleNamespace(
            max_loras=max_loras, specialize_active_lora=specialize_active
        )
        compilation = SimpleNamespace(cudagraph_specialize_lora=specialize_graphs)
        return tuple(
            sorted(int(c) for c in self.lora_capture_cases_fn(lora, compilation))
        )

    def max_loras(self, cases: tuple[int, ...] | None) -> int | None:
        """The ``max_loras`` whose configuration gives ``cases``, or None when
        no LoRA configuration of this release does."""
        if cases is None or self.lora_capture_cases_fn is None:
            return None
        for max_loras in range(1, _MAX_LORAS + 1):
            for graphs in (True, False):
                for active in (False, True):
                    if self.lora_cases(max_loras, graphs, active) == tuple(cases):
                        return max_loras
        return None

    def dummy_batch_loras(self, cases: tuple[int, ...] | None) -> int:
        """What the release's model runner passes as ``num_active_loras`` for
        a dummy batch (an idle DP rank's step) under a table with ``cases``."""
        max_loras = self.max_loras(cases)
        if max_loras is None or self.lora_dispatch_count_fn is None:
            return 0
        lora = SimpleNamespace(max_loras=max_loras)
        return int(self.lora_dispatch_count_fn(lora, None, [], True))

    # -- microbatching ----------------------------------------------------

    def accepts_thresholds(self, settings: Microbatching) -> bool:
        """Whether the release's ``ParallelConfig`` accepts these settings."""
        config = ParallelConfigStandIn(microbatching=settings)
        return not any(check(config) for check in self.threshold_checks)

    def fit_thresholds(self, settings: Microbatching) -> Microbatching:
        """``settings`` with every threshold below the least common floor the
        release accepts lifted to it; unchanged when already accepted."""
        for floor in range(_MAX_THRESHOLD_FLOOR + 1):
            fitted = Microbatching(
                num_ubatches=settings.num_ubatches,
                decode_token_threshold=max(settings.decode_token_threshold, floor),
                prefill_token_threshold=max(settings.prefill_token_threshold, floor),
            )
            if self.accepts_thresholds(fitted):
                return fitted
        raise TargetError(
            "ParallelConfig refuses every microbatching threshold up to "
            f"{_MAX_THRESHOLD_FLOOR} for {settings.num_ubatches} microbatches"
        )

    # -- capture sizes ----------------------------------------------------

    def accepts_ceiling(self, sizes: tuple[int, ...], max_capture_size: int) -> bool:
        """Whether the release's config can hold ``max_capture_size`` with
        ``sizes`` (its ``post_init_cudagraph_sizes`` asserts it)."""
        post_init = getattr(self.compilation_class, "post_init_cudagraph_sizes", None)
        if post_init is None:
            # Every release dpsim knows pins the ceiling to the largest size.
            return not sizes or max(sizes) == max_capture_size
        view = ConfigView(
            self.compilation_class,
            compile_sizes=None,
            cudagraph_capture_sizes=list(sizes),
            max_cudagraph_capture_size=max_capture_size,
        )
        try:
            post_init(view)
        except AssertionError:
            return False
        return True

    def drafter_table(self, drafter: CapturePolicy) -> CapturePolicy:
        """``drafter`` without the features the release's speculators never
        give their managers."""
        passed = self.drafter_arguments
        if passed is None:
            return drafter
        return replace(
            drafter,
            lora_capture_cases=(
                drafter.lora_capture_cases if "lora_capture_cases" in passed else None
            ),
            varlen_decode=drafter.varlen_decode and "varlen_decode" in passed,
            microbatching=(
                drafter.microbatching if "ubatch_runner" in passed else None
            ),
        )

    # -- a whole policy ---------------------------------------------------

    def unbuildable(self, policy: CapturePolicy) -> str | None:
        """Why the release would not build ``policy``, in one line, or None.

        For a policy that claims the caller profile (a counterexample file,
        say) but did not come from these rules.
        """
        tables = [("", policy)]
        if policy.drafter is not None:
            tables.append(("drafter ", policy.drafter))
        for who, table in tables:
            cases = table.lora_capture_cases
            if (
                cases is not None
                and self.lora_capture_cases_fn is not None
                and self.max_loras(cases) is None
            ):
                return f"{who}LoRA cases {list(cases)} are no LoRA configuration's"
            settings = table.microbatching
            if settings is not None and not self.accepts_thresholds(settings):
                return (
                    f"{who}microbatching thresholds "
                    f"{settings.decode_token_threshold}/"
                    f"{settings.prefill_token_threshold} are refused by "
                    f"ParallelConfig for {settings.num_ubatches} microbatches"
                )
            ceiling = table.max_capture_size
            if ceiling is not None and not self.accepts_ceiling(
                table.capture_sizes, ceiling
            ):
                return (
                    f"{who}max_capture_size {ceiling} is not the largest capture "
                    "size, which CompilationConfig requires"
                )
        drafter = policy.drafter
        if drafter is not None and self.drafter_table(drafter) != drafter:
            return (
                "drafter has LoRA cases, varlen decode or microbatching, "
                "which no speculator of this release gives its manager"
            )
        return None


def _drafter_arguments(
    package_dir: Path, parameters: tuple[str, ...]
) -> frozenset[str] | None:
    """The manager parameters passed by every ``...CudaGraphManager(...)`` call
    under ``spec_decode/``; None when a call hides them (``*args``, ``**kw``)
    or there is no speculator to read."""
    root = package_dir / "v1" / "worker" / "gpu" / "spec_decode"
    passed: set[str] = set()
    calls = 0
    for path in sorted(root.rglob("*.py")) if root.is_dir() else ():
        try:
            source = path.read_text()
        except OSError:
            return None
        if "CudaGraphManager" not in source:
            # No call of a manager can be in it: parsing and walking every
            # file of the package cost a fresh check some 40 ms.
            continue
        try:
            tree = ast.parse(source, filename=str(path))
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
            if not str(name).endswith("CudaGraphManager"):
                continue
            calls += 1
            if any(isinstance(arg, ast.Starred) for arg in node.args) or any(
                keyword.arg is None for keyword in node.keywords
            ):
                return None
            passed.update(parameters[: len(node.args)])
            passed.update(keyword.arg for keyword in node.keywords if keyword.arg)
    return frozenset(passed) if calls else None


def _threshold_checks(path: Path) -> tuple[ThresholdCheck, ...]:
    """Each ``if`` in ``ParallelConfig`` that reads a DBO threshold and raises,
    compiled as a function of the config."""
    try:
        source = path.read_text()
    except OSError:
        return ()
    tree = ast.parse(source, filename=str(path))
    checks: list[ThresholdCheck] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == "ParallelConfig"):
            continue
        for statement in ast.walk(node):
            if not isinstance(statement, ast.If):
                continue
            reads = {
                sub.attr
                for sub in ast.walk(statement.test)
                if isinstance(sub, ast.Attribute)
            }
            raises = any(isinstance(sub, ast.Raise) for sub in statement.body)
            if reads & _THRESHOLD_FIELDS and raises:
                checks.append(_compile_check(statement.test, path))
    return tuple(checks)


def _compile_check(test: ast.expr, path: Path) -> ThresholdCheck:
    lambda_ = ast.Expression(
        body=ast.Lambda(
            args=ast.arguments(
                posonlyargs=[],
                args=[ast.arg(arg="self")],
                kwonlyargs=[],
                kw_defaults=[],
                defaults=[],
            ),
            body=test,
        )
    )
    ast.fix_missing_locations(lambda_)
    check = eval(compile(lambda_, str(path), "eval"), {"__builtins__": __builtins__})
    # Refuse now, not in the middle of a search, a check reading more than
    # the stand-in holds.
    try:
        check(ParallelConfigStandIn(microbatching=Microbatching()))
    except Exception as error:
        raise TargetError(
            f"{path}:{test.lineno}: cannot evaluate ParallelConfig's threshold "
            f"check: {type(error).__name__}: {error}"
        ) from error
    return check


@functools.lru_cache(maxsize=32)
def rules_for(
    package_dir: Path,
    compilation_class: type | None,
    manager_class: type | None = None,
) -> BuildRules:
    """The rules of the vLLM at ``package_dir`` (a release, tree or package)."""
    stand_ins = {
        **STAND_INS,
        "vllm.lora.utils": {"get_captured_lora_counts": captured_lora_counts},
    }
    loader = ModuleLoader(package_dir, stand_ins=stand_ins)
    lora_utils = (
        loader.module(LORA_UTILS_MODULE)
        if loader.source_path(LORA_UTILS_MODULE) is not None
        else None
    )
    return BuildRules(
        lora_capture_cases_fn=(
            function(lora_utils, "get_lora_capture_cases") if lora_utils else None
        ),
        lora_dispatch_count_fn=(
            function(lora_utils, "get_num_active_loras_for_dispatch")
            if lora_utils
            else None
        ),
        threshold_checks=_threshold_checks(package_dir / "config" / "parallel.py"),
        compilation_class=compilation_class,
        drafter_arguments=(
            _drafter_arguments(package_dir, manager_parameters(manager_class))
            if manager_class is not None
            else None
        ),
    )


def rules_of(target: Target) -> BuildRules:
    """The rules of a loaded target's base vLLM (its ``--target`` file aside:
    config code is the release's)."""
    return rules_for(
        target.package_dir,
        target.compilation.__dict__.get("CompilationConfig"),
        target.manager_class,
    )
