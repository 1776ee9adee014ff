"""``dpsim mutate --lane runner``: mutants of the files the runner lane runs.

The runner lane rebuilds chosen methods of vLLM's engine, model runner and
speculator classes from the release's files (see
:func:`dpsim.lanes.runner.report.lane_origins`); those methods, and no others
of their 2,000-line files, are what a mutant may change: a mutant anywhere
else could never be told from the original. ``dp_utils`` mutates the real
sync's module functions, as the sync lane's ``--file sync`` does, judged here
by whole engines.

Each mutant is loaded the way the lane loads a source tree: a temporary
``vllm/`` whose files are links to the original's, but for the mutated one
(the lane reads every file from its package dir, so the mutant is the file
the lane loads). It is judged by ``dpsim check --lane runner``'s own search
(:func:`~dpsim.lanes.runner.check.run_runner_check`, same seed for every
mutant, no shrinking): killed by the first property that fails, survived
when none does within the examples or the ``--seconds`` cap, and *refused*
when the lane cannot drive it (a stand-in asked something it does not know,
a class it cannot rebuild): no verdict is not a kill, and a refused mutant is
not scored. Properties the original already breaks under the same budget are
not judged on the mutants (the report names them; ``--policy`` can fix a
policy under which the original holds them).
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner.check import RunnerCheckOptions, run_runner_check
from dpsim.lanes.runner.suite import RUNNER_LANE_TEST
from dpsim.mutate.files import MutatedFile
from dpsim.mutate.mutants import defined_functions
from dpsim.mutate.run import (
    KILLED,
    REFUSED,
    SURVIVED,
    Budget,
    Inherited,
    Job,
    Leg,
    MutantOutcome,
)
from dpsim.properties import RUNNER_LANE_PROPERTIES
from dpsim.records.policy import CapturePolicy
from dpsim.targets import load_spec, parse_target
from dpsim.targets.load import Target

#: What ``--file`` names under ``--lane runner``: the vLLM file, and which
#: rebuilt class (by name) marks it. ``dp_utils`` is the sync's module.
RUNNER_SLOTS: dict[str, str] = {
    "core": "v1/engine/core.py (the engine loop: DPEngineCoreProc and its bases)",
    "model_runner": "v1/worker/gpu/model_runner.py (GPUModelRunner)",
    "speculator": "the target-dependent autoregressive speculator's speculator.py",
    "draft": "v1/worker/gpu/spec_decode/speculator.py (DraftModelSpeculator)",
    "parallel": "config/parallel.py (ParallelConfig.sync_dp_state)",
    "dp_utils": "v1/worker/gpu/dp_utils.py (the real sync's module functions)",
}
#: The same for the lane's V1 model runner (``--runner v1``).
V1_RUNNER_SLOTS: dict[str, str] = {
    "core": RUNNER_SLOTS["core"],
    "gpu_model_runner": "v1/worker/gpu_model_runner.py (GPUModelRunner)",
    "eagle": "the V1 drafter: v1/spec_decode/eagle.py (EagleProposer), or "
    "llm_base_proposer.py where its methods live (0.3x)",
    "dp_utils": "v1/worker/dp_utils.py (the real sync's module functions)",
}
DEFAULT_RUNNER_SLOT = "core"
#: Mutants ``mutate --lane runner`` samples by default: each takes seconds
#: (whole engines per case) where a sync-lane mutant takes a fraction of one.
DEFAULT_RUNNER_LIMIT = 30
_MARKERS = {
    "core": ("DPEngineCoreProc",),
    "model_runner": ("GPUModelRunner",),
    "speculator": ("TargetDependentARSpeculator", "AutoRegressiveSpeculator"),
    "draft": ("DraftModelSpeculator",),
    "parallel": ("ParallelConfig",),
    "gpu_model_runner": ("GPUModelRunner",),
    "eagle": ("EagleProposer", "SpecDecodeBaseProposer"),
}
_DP_UTILS = {
    "v2": Path("v1/worker/gpu/dp_utils.py"),
    "v1": Path("v1/worker/dp_utils.py"),
}


def slots_of(runner: str) -> dict[str, str]:
    """The files ``--file`` names under ``--lane runner`` with ``runner``'s
    model runner."""
    return V1_RUNNER_SLOTS if runner == "v1" else RUNNER_SLOTS


#: The pseudo-leg a runner-lane plan runs: every mutant, one check.
RUNNER_LEG = Leg(RUNNER_LANE_TEST, "engines")


def runner_target(vllm: str | None, runner: str = "v2") -> Target:
    """The target ``--vllm`` names, loaded for ``runner``'s model runner; a
    release the lane cannot drive is refused before anything is fetched."""
    from dpsim.lanes.runner.commands import refuse_unsupported

    spec = parse_target(vllm, runner=runner)
    refuse_unsupported(spec)
    return load_spec(spec)


def package_dir(target: Target) -> Path:
    """The ``vllm/`` directory the lane reads ``target``'s files from."""
    from dpsim.lanes.runner.run import sources_for

    return Path(sources_for(target).package_dir)


def runner_mutated_file(target: Target, slot: str) -> tuple[MutatedFile, str]:
    """The file ``slot`` names in ``target`` and the functions the lane runs
    of it; also its path relative to the package dir (where a mutant goes)."""
    slots = slots_of(target.runner)
    if slot not in slots:
        raise UsageError(
            f"--file {slot!r}: under --lane runner with the "
            f"{target.runner.upper()} runner expected one of {', '.join(slots)}"
        )
    from dpsim.lanes.runner.report import lane_origins

    root = package_dir(target).resolve()
    functions: tuple[str, ...] | None = None
    if slot == "dp_utils":
        path = root / _DP_UTILS[target.runner]
    else:
        origins = lane_origins(target)
        # A marked class the lane keeps no method of (0.3x's EagleProposer,
        # whose methods its base holds) has nothing to mutate.
        marked = [o for o in origins if o.class_name in _MARKERS[slot] and o.methods]
        if not marked:
            raise TargetError(
                f"runner lane: {target.label} has no {slots[slot]} the lane "
                "runs, to mutate"
            )
        path = Path(marked[0].path).resolve()
        text = path.read_text()
        defined = defined_functions(ast.parse(text))
        # Every class the lane rebuilds from this file (core.py holds three).
        functions = tuple(
            qualified
            for origin in origins
            if Path(origin.path).resolve() == path
            for method in origin.methods
            if (qualified := f"{origin.class_name}.{method}") in defined
        )
    if not path.is_file():
        raise TargetError(f"runner lane: {target.label} has no {path.name} to mutate")
    data = path.read_bytes()
    mutated = MutatedFile(
        slot,
        str(path),
        data.decode("utf-8"),
        hashlib.sha256(data).hexdigest(),
        functions,
    )
    return mutated, str(path.relative_to(root))


@dataclass(frozen=True)
class RunnerPlan:
    """What every runner-lane mutant runs (the sync lane's :class:`Plan`'s
    fields the report reads, plus what loading a mutant needs)."""

    vllm: str | None
    #: The original ``vllm/`` directory and the mutated file's place in it.
    package: str
    relative: str
    #: The original file mutated.
    original: str
    budget: Budget
    #: The properties judged: the lane's, less those the original breaks.
    properties: tuple[str, ...]
    policy: CapturePolicy | None = None
    inherited: tuple[Inherited, ...] = ()
    baseline_seconds: float = 0.0
    slot: str = DEFAULT_RUNNER_SLOT
    runner: str = "v2"
    lane: str = "runner"
    legs: tuple[Leg, ...] = (RUNNER_LEG,)

    def load(self, path: str) -> Target:
        """The target whose ``relative`` file is ``path``: a tree beside it
        linking every other file of the original package."""
        tree = Path(path).with_suffix(".tree")
        if not tree.exists():
            shutil.copytree(
                self.package, tree / "vllm", copy_function=os.symlink, symlinks=True
            )
            replaced = tree / "vllm" / self.relative
            replaced.unlink()
            shutil.copyfile(path, replaced)
        return load_spec(parse_target(str(tree), runner=self.runner))

    def options(self, properties: tuple[str, ...] | None = None) -> RunnerCheckOptions:
        return RunnerCheckOptions(
            properties=self.properties if properties is None else properties,
            ranks=self.budget.ranks,
            examples=self.budget.examples,
            seed=self.budget.seed,
            shrink=False,  # a kill needs one failing case, not a small one
            policy=self.policy,
            runner=self.runner,
        )


def runner_baseline(
    vllm: str | None,
    target: Target,
    mutated: MutatedFile,
    relative: str,
    budget: Budget,
    policy: CapturePolicy | None,
    scratch: Path,
) -> RunnerPlan:
    """Check the original as every mutant will be checked (loaded from a
    linked tree, the same path a mutant takes), rerunning without each
    property it breaks until it passes: those are not judged on mutants."""
    started = time.perf_counter()
    plan = RunnerPlan(
        vllm,
        str(package_dir(target)),
        relative,
        mutated.path,
        budget,
        tuple(RUNNER_LANE_PROPERTIES),
        policy,
        slot=mutated.slot,
        runner=target.runner,
    )
    original = scratch / f"original_{Path(relative).name}"
    shutil.copyfile(mutated.path, original)
    loaded = plan.load(str(original))
    properties = plan.properties
    inherited: list[Inherited] = []
    while properties:
        report = run_runner_check(loaded, plan.options(properties))
        if report.finding is None:
            break
        broken = {verdict.property for verdict in report.finding.verdicts}
        inherited.extend(
            Inherited(RUNNER_LEG.scenario, RUNNER_LEG.profile, v.property, str(v))
            for v in report.finding.verdicts
        )
        properties = tuple(name for name in properties if name not in broken)
    if not properties:
        raise UsageError(
            f"mutate --lane runner: the original {target.label} breaks every runner-"
            "lane property under this budget; nothing is left to judge mutants by "
            "(fix a policy with --policy)"
        )
    return RunnerPlan(
        vllm,
        plan.package,
        relative,
        mutated.path,
        budget,
        properties,
        policy,
        tuple(inherited),
        time.perf_counter() - started,
        slot=mutated.slot,
        runner=target.runner,
    )


class _Cap(BaseException):
    """Ends a mutant's check at the wall-clock cap. A BaseException, so that
    Hypothesis lets it through instead of taking it for a failure."""


def check_runner_mutant(job: Job) -> MutantOutcome:
    """Load ``job``'s mutant as the lane loads a tree and run the check:
    killed, survived, or refused (the lane could not drive it)."""
    plan = job.plan
    assert isinstance(plan, RunnerPlan)
    started = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - started

    def cap(done: int, planned: int) -> None:
        # Between cases only: a case is bounded by the simulator's step budget.
        if elapsed() > plan.budget.seconds:
            raise _Cap

    leg = RUNNER_LEG
    try:
        target = plan.load(job.path)
        report = run_runner_check(target, plan.options(), cap)
    except _Cap:
        message = f"wall-clock cap of {plan.budget.seconds:g}s reached"
        return MutantOutcome(
            job.mutant_id, SURVIVED, message=message, elapsed=elapsed()
        )
    except TargetError as error:
        # The lane refused: a gap, a class it cannot rebuild. Not a kill.
        return MutantOutcome(
            job.mutant_id,
            REFUSED,
            None,
            leg.scenario,
            leg.profile,
            str(error),
            elapsed=elapsed(),
        )
    except Exception as error:
        return MutantOutcome.harness_tripped(job.mutant_id, leg, error, elapsed())
    if report.finding is None:
        return MutantOutcome(job.mutant_id, SURVIVED, elapsed=elapsed())
    primary = report.finding.primary
    return MutantOutcome(
        job.mutant_id,
        KILLED,
        primary.property,
        leg.scenario,
        leg.profile,
        str(primary),
        report.seconds,
        elapsed(),
    )
