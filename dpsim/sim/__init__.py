"""The simulator: N virtual DP ranks in one process, fake collectives, exact diagnosis.

``simulate(program, ranks=N)`` runs ``program(rank)`` on every rank, each in
its own greenlet under one deterministic scheduler, with a simulated world
installed (``dpsim.targets.runtime``) so loaded targets' ``torch.distributed``,
``get_dp_group()`` and ``should_skip_dp_coordination()`` reach fake
collectives. It returns a :class:`SimResult`: the outcome, one
:class:`RankTrace` per rank, and the scheduling choices that replay the run.
The trace's types and the group names belong to both lanes and live in
:mod:`dpsim.records`, imported from there (one path to each name).

Process groups, by name (all span every rank unless ``groups=`` says
otherwise; declare more as name -> member ranks):

- ``"world"``: torch's default group, used by collectives called with
  ``group=None`` (``dist.group.WORLD``).
- ``"dp_cpu"``: ``get_dp_group().cpu_group``, the gloo group the DP sync
  all-reduces over; ``cpu_all_reduce_`` and ``barrier`` use it too.
- ``"dp_device"``: ``get_dp_group().device_group``; the coordinator's
  ``all_reduce`` / ``all_gather`` / ``broadcast`` use it.
- ``"ep"``: the expert-parallel group scenarios use to model the forward
  pass's MoE collectives.

Each group numbers its own collectives, so ``dp_cpu#3`` and ``dp_device#3`` are
unrelated, as two communicators are in a real deployment.

Outcomes, by precedence (the first that applies): ``crash`` (a rank raised),
``budget`` (a rank exceeded its step budget), ``mismatch`` (members entered a
collective with different kind/op/shape/dtype/source), ``hang`` (a collective
never completed: some rank waits, or an async one was left unmatched), ``ok``.

``measure_overhead()`` compares a simulated run with the same per-rank calls
answered instantly from a recorded run (``InstantWorld``): the overhead the
simulator adds over the target's own cost.
"""

from dpsim.sim.choosers import (
    LOWEST_FIRST,
    Chooser,
    HypothesisChooser,
    LowestFirst,
    ReplayChooser,
    ReplayDivergedError,
)
from dpsim.sim.collectives import SimCollectives, SimProcessGroup, SimWork
from dpsim.sim.coordinator import GroupCoordinatorView
from dpsim.sim.instant import InstantWorld
from dpsim.sim.overhead import measure_overhead
from dpsim.sim.render import render_table
from dpsim.sim.scheduler import (
    DEFAULT_STEP_BUDGET,
    Program,
    SchedulerError,
    StepBudgetExceeded,
)
from dpsim.sim.simulate import simulate
from dpsim.sim.world import (
    SimWorld,
    current_rank,
    current_world,
    record,
)

__all__ = [
    "DEFAULT_STEP_BUDGET",
    "LOWEST_FIRST",
    "Chooser",
    "GroupCoordinatorView",
    "HypothesisChooser",
    "InstantWorld",
    "LowestFirst",
    "Program",
    "ReplayChooser",
    "ReplayDivergedError",
    "SchedulerError",
    "SimCollectives",
    "SimProcessGroup",
    "SimWork",
    "SimWorld",
    "StepBudgetExceeded",
    "current_rank",
    "current_world",
    "measure_overhead",
    "record",
    "render_table",
    "simulate",
]
