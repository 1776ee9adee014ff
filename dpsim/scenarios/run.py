"""Run a case: build its managers, start one program per rank, simulate.

This is the middle of dpsim's one-way flow (case -> simulator -> trace):
it returns the simulator's result untouched; properties judge it elsewhere.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dpsim.capture.policy import CapturePolicy
from dpsim.sim import SimResult, simulate
from dpsim.sim.choosers import Chooser
from dpsim.targets import ManagerConfig
from dpsim.targets.load import Target

from .case import Case
from .programs import PROGRAMS
from .ranks import RankSetting


class PolicyRefused(Exception):
    """The target's own manager refused the case's policy (vLLM's verdict, not a bug)."""


_managers: dict[tuple[Target, ManagerConfig], Any] = {}


def manager_for(target: Target, config: ManagerConfig) -> Any:
    """The target's manager for ``config``; built once, shared read-only."""
    key = (target, config)
    manager = _managers.get(key)
    if manager is None:
        try:
            manager = target.build_manager(config)
        except (ValueError, AssertionError) as error:
            raise PolicyRefused(f"{type(error).__name__}: {error}") from error
        _managers[key] = manager
    return manager


def setting_for(target: Target, case: Case) -> RankSetting:
    policy = case.policy
    dp_size = case.dp_size
    drafter: CapturePolicy = policy.drafter or policy
    drafter_prefill = drafter.manager_config(dp_size)
    if drafter_prefill.decode_query_len != policy.decode_query_len:
        drafter_prefill = _with_query_len(drafter_prefill, policy.decode_query_len)
    needs_drafter = case.scenario == "drafter"
    return RankSetting(
        target=target,
        dp_size=dp_size,
        manager=manager_for(target, policy.manager_config(dp_size)),
        drafter_prefill_manager=(
            manager_for(target, drafter_prefill) if needs_drafter else None
        ),
        drafter_decode_manager=(
            manager_for(target, _with_query_len(drafter_prefill, 1))
            if needs_drafter
            else None
        ),
        parallel_config=target.parallel_config(dp_size, 0, policy.microbatching),
    )


def _with_query_len(config: ManagerConfig, decode_query_len: int) -> ManagerConfig:
    return replace(config, decode_query_len=decode_query_len)


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
    """Simulate ``case`` on ``target``; raises :class:`PolicyRefused` if vLLM would."""
    setting = setting_for(target, case)
    program = PROGRAMS[case.scenario]
    options: dict[str, Any] = {"chooser": chooser}
    if step_budget is not None:
        options["step_budget"] = step_budget
    return simulate(
        lambda rank: program(setting, case, rank), ranks=case.dp_size, **options
    )
