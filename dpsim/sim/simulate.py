"""``simulate()``: one run of N virtual ranks, from programs to a ``SimResult``.

The only place the simulated world is installed, and only for the duration of
the run: afterwards ``runtime.current()`` is whatever it was before, and
nothing in torch was ever touched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dpsim.records.trace import SimResult
from dpsim.sim.choosers import LOWEST_FIRST, Chooser
from dpsim.sim.mailbox import Quiescence
from dpsim.sim.result import result_of_run
from dpsim.sim.scheduler import DEFAULT_STEP_BUDGET, Program, Scheduler
from dpsim.sim.world import give_back_world, resolve_groups, take_world
from dpsim.targets import runtime


def simulate(
    programs: Program | Sequence[Program],
    *,
    ranks: int,
    groups: Mapping[str, Sequence[int]] | None = None,
    chooser: Chooser | None = None,
    step_budget: int = DEFAULT_STEP_BUDGET,
    skip_dp_coordination: Collection[int] = (),
    on_quiescent: Callable[[Quiescence], bool] | None = None,
) -> SimResult:
    """Run ``programs`` on ``ranks`` virtual ranks until none can run.

    Args:
        programs: one callable run on every rank, or one per rank; each is
            called as ``program(rank)`` and its return value, which must be
            JSON-friendly, goes into the rank's trace.
        ranks: how many virtual ranks.
        groups: extra process groups, or members for the default ones, as
            name -> global ranks (see ``dpsim.sim`` for the default names).
        chooser: who runs next when several ranks could; default lowest first.
        step_budget: ticks plus collectives a rank may take before it is
            stopped with a ``budget`` verdict.
        skip_dp_coordination: ranks on which ``should_skip_dp_coordination()``
            starts out True.
        on_quiescent: called when no rank can run (see
            :mod:`dpsim.sim.mailbox`); it may put messages into parked ranks'
            mailboxes and return True to go on, or return False to end the run.
    """
    program_list = per_rank_programs(programs, ranks)
    scheduler = Scheduler(program_list, chooser or LOWEST_FIRST, step_budget)
    world = take_world(
        scheduler,
        resolve_groups(ranks, groups),
        [rank in skip_dp_coordination for rank in range(ranks)]
        if skip_dp_coordination
        else [False] * ranks,
    )
    previous = runtime.install(world)
    try:
        if on_quiescent is None:
            scheduler.run(world.crew)
        else:
            quiescence = Quiescence(world)
            scheduler.run(world.crew, lambda: on_quiescent(quiescence))
        result = result_of_run(scheduler, world)
    finally:
        try:
            scheduler.close()
        finally:
            runtime.restore(previous)
    # Only after a run nothing escaped from: an exception that escapes a
    # rank's program past the scheduler (KeyboardInterrupt) ends its worker,
    # and the world's crew must be whole for the next run.
    if scheduler.every_rank_ended():
        give_back_world(world)
    return result


def per_rank_programs(
    programs: Program | Sequence[Program], ranks: int
) -> list[Program]:
    if callable(programs):
        one: Callable[[int], Any] = programs
        return [one] * ranks
    program_list = list(programs)
    if len(program_list) != ranks:
        raise ValueError(f"got {len(program_list)} programs for {ranks} ranks")
    return program_list
