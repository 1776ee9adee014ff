"""Run a case: build its managers, start one program per rank, simulate.

This is the middle of dpsim's one-way flow (case -> simulator -> trace):
it returns the simulator's result untouched; properties judge it elsewhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from dpsim import allowances
from dpsim.boundary import collect_gaps, fault_of, refusal, refused
from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy, CudagraphMode, ManagerConfig
from dpsim.records.trace import SimResult
from dpsim.sim import simulate
from dpsim.sim.choosers import Chooser
from dpsim.targets.load import Target

from .programs import PROGRAMS
from .ranks import RankSetting

#: How many policies' managers are kept built (see ``_built_manager``).
MANAGERS_KEPT = 32


class PolicyRefused(Exception):
    """The target's own manager refused the case's policy (vLLM's verdict, not a bug)."""


def manager_for(target: Target, config: ManagerConfig) -> Any:
    """The target's manager for ``config``; built once, shared read-only.

    vLLM's own ``ValueError`` or assertion refuses the policy
    (:class:`PolicyRefused`); anything else, and anything from dpsim's side
    (a constructor call the release no longer takes), refuses the run
    (:class:`~dpsim.errors.BoundaryError`).
    """
    try:
        return _built_manager(target, config)
    except (ValueError, AssertionError) as error:
        if fault_of(error) is not None:
            raise refusal(target.label, error, _BUILDING) from error
        raise PolicyRefused(f"{type(error).__name__}: {error}") from error
    except Exception as error:
        raise refusal(target.label, error, _BUILDING) from error


_BUILDING = "building its CudaGraphManager"


# Bounded, and small: generated policies differ from case to case, so a
# search would otherwise keep every table it built, and a kept table is
# thousands of objects that each of the collector's full collections walks
# again (the largest part of a search's heap, by far). The policies a search
# comes back to are recent ones (a shrink, the fast engine's reused ones, the
# caller profile's few configs): 32 misses a handful more in 800 cases than
# 256 did, under either engine.
@functools.lru_cache(maxsize=MANAGERS_KEPT)
def _built_manager(target: Target, config: ManagerConfig) -> Any:
    return target.build_manager(config)


@dataclass(frozen=True)
class Tables:
    """The capture tables one policy gives a deployment: the target's, and the
    drafter's prefill and decode tables (the target's own policy when there is
    no separate drafter policy), as vLLM's autoregressive speculator builds them."""

    target: ManagerConfig
    drafter_prefill: ManagerConfig
    drafter_decode: ManagerConfig


def tables_for(target: Target, policy: CapturePolicy, dp_size: int) -> Tables:
    drafter = policy.drafter or policy
    # The drafter's prefill runs the target's batch shape, decode length included.
    prefill = replace(
        drafter.manager_config(dp_size), decode_query_len=policy.decode_query_len
    )
    return Tables(
        policy.manager_config(dp_size), prefill, _drafter_decode(target, prefill)
    )


def setting_for(target: Target, case: Case) -> RankSetting:
    dp_size = case.dp_size
    manager, drafter_prefill, drafter_decode = _managers(
        target, case.policy, dp_size, case.scenario == "drafter"
    )
    return RankSetting(
        target=target,
        dp_size=dp_size,
        manager=manager,
        drafter_prefill_manager=drafter_prefill,
        drafter_decode_manager=drafter_decode,
        # Fresh for every case, unlike the managers: a plain object the
        # target is handed, so nothing it could do to one outlives the case.
        parallel_config=target.parallel_config(dp_size, 0, case.policy.microbatching),
        rank_parallel_configs=(
            tuple(
                target.parallel_config(dp_size, rank, case.policy.microbatching)
                for rank in range(dp_size)
            )
            if target.runner == "v1"
            else ()
        ),
    )


# The same policy and size come back case after case (a fixed --policy, a
# shrink, the caller profile's few configs), and working their tables out
# again cost about a tenth of a simulated 8-rank case. A refusal is not
# cached: PolicyRefused is raised again, fresh, every time.
@functools.lru_cache(maxsize=MANAGERS_KEPT)
def _managers(
    target: Target, policy: CapturePolicy, dp_size: int, needs_drafter: bool
) -> tuple[Any, Any, Any]:
    """The target's manager for ``policy`` at ``dp_size``, and the drafter's
    prefill and decode ones when the scenario runs a drafter (else None)."""
    tables = tables_for(target, policy, dp_size)
    if not needs_drafter:
        return manager_for(target, tables.target), None, None
    return (
        manager_for(target, tables.target),
        manager_for(target, tables.drafter_prefill),
        manager_for(target, tables.drafter_decode),
    )


def _drafter_decode(target: Target, prefill: ManagerConfig) -> ManagerConfig:
    """The drafter's decode table, as vLLM's autoregressive speculator builds it:
    one token per request, FULL graphs only (FULL_DECODE_ONLY) when the mode's
    decode routine is FULL, else none at all (no PIECEWISE draft decodes)."""
    modes = target.CUDAGraphMode
    full_decodes = modes[prefill.cudagraph_mode].decode_mode() == modes.FULL
    return replace(
        prefill,
        decode_query_len=1,
        cudagraph_mode=CudagraphMode.FULL_DECODE_ONLY
        if full_decodes
        else CudagraphMode.NONE,
        # 0.34+: its own request sizes, from the deployment's config.
        draft_decode_for=(
            prefill.decode_query_len if target.split_sizes is not None else None
        ),
    )


def why_not_runnable(target: Target, case: Case) -> str | None:
    """Why ``case`` cannot run on ``target`` at all (another version's case), or None."""
    from .generate import scenarios_for

    if case.scenario not in scenarios_for(target):
        return f"{target.label} has no {case.scenario!r} scenario"
    for step in case.steps:
        for batch in step:
            name = target.api.unsupported_input(batch)
            if name is not None:
                return (
                    f"the case passes {name}, which {target.label}'s sync does not take"
                )
    return None


def run_case(
    target: Target,
    case: Case,
    *,
    chooser: Chooser | None = None,
    step_budget: int | None = None,
) -> SimResult:
    """Simulate ``case`` on ``target``; raises :class:`PolicyRefused` if vLLM
    would, and :class:`~dpsim.errors.BoundaryError` where dpsim could not
    drive it: a gap was met, or a rank raised from dpsim's side of the
    boundary (never a verdict; see :mod:`dpsim.boundary`)."""
    # Each case, its manager builds included, gets the same CPU allowance.
    allowances.case_started()
    program = PROGRAMS[case.scenario]
    options: dict[str, Any] = {"chooser": chooser}
    if step_budget is not None:
        options["step_budget"] = step_budget
    with collect_gaps() as gaps:
        setting = setting_for(target, case)
        result = simulate(
            lambda rank: program(setting, case, rank), ranks=case.dp_size, **options
        )
    refuse_faults(target.label, result, gaps)
    return result


#: The pre-flight's one decode per rank, and the policy it runs under.
_TRIVIAL_DECODE = RankBatch(
    num_reqs=1, num_tokens=1, uniform_token_count=1, kind="decode"
)
_PREFLIGHT_POLICY = CapturePolicy(capture_sizes=(1, 2, 4, 8))


def preflight(target: Target) -> None:
    """Drive ``target`` once before any case is generated: its manager built
    for a plain policy and its sync called by two ranks with one decode each.

    A release whose code does not fit what dpsim knows (a constructor, a sync
    signature, an agreement, a config read) is then refused in one line
    (:class:`~dpsim.errors.BoundaryError`) before a search starts, rather
    than at its first case. Only whether dpsim could drive the case counts:
    its verdict is not looked at (a vLLM bug there is the search's to find).
    """
    case = Case("step", "caller", _PREFLIGHT_POLICY, ((_TRIVIAL_DECODE,) * 2,))
    try:
        run_case(target, case)
    except PolicyRefused as error:
        raise refused(
            target.label,
            f"its CudaGraphManager refused the plain policy of dpsim's "
            f"pre-flight ({error})",
        ) from error


def refuse_faults(label: str, result: SimResult, gaps: list[str]) -> None:
    """Refuse a run of ``label`` that met a gap, or in which a rank raised
    from dpsim's side of the boundary: such a run has no verdict."""
    if gaps:
        more = f" (and {len(gaps) - 1} more)" if len(gaps) > 1 else ""
        raise refused(label, f"a gap: {gaps[0]}{more}")
    for trace in result.ranks:
        if trace.error is not None and trace.error.fault is not None:
            raise refused(label, f"rank {trace.rank} raised {trace.error.fault}")
