"""How much the simulator adds to the target's own cost.

``overhead`` = (wall time of ``rounds`` calls of ``simulate(programs, ranks)``)
/ (wall time of ``rounds`` rounds of the bare baseline), where one bare round
calls every rank's program once, one after another, in an ``InstantWorld``
that answers each collective at once with the result the simulated run
recorded. Both sides make the same per-rank calls and do the same torch work
(the bare side still copies each result into the rank's tensor); the
difference is scheduling, matching, reducing, recording and building the
result. ``overhead >= 1`` means the simulator is slower; 1.0 would be free.

The two sides are timed in alternating chunks so that drift in machine speed
(other processes, frequency scaling) hits both alike, by the wall clock and,
apart, by this process's CPU time (``cpu_overhead``), which other processes
on a busy machine disturb less: the wall-clock figure is what a user waits,
the CPU one is the steadier comparison.

Each timed chunk is preceded by one untimed round of its own side, so that
both sides are timed warm. The simulation runs all of the bare side's code
and more of its own (scheduler, greenlet switches, matching, result
building), so a bare chunk evicts the simulator's code and data from the
caches while a simulated chunk leaves the bare side's warm: without the
warm-up round, the first round of every simulated chunk paid for a refill the
bare side never pays (at 8 ranks on the real sync, 350-530 us more than the
chunk's median round of about 540 us, against 15-145 us for a bare chunk's
first round), a charge that grows with the number of chunks and not with
what the simulator costs.

Both sides are timed with the heap that was alive before the first timed
chunk frozen out of the collector's full collections (``frozen_heap``), as a
search runs its cases (``dpsim.check``). Otherwise every full collection
walks torch's and the release's whole heap, and the simulated side, which
allocates more objects, brings those collections on more often: at 8 ranks
on the real sync, 75k of its 2,759k instructions per round over 200 rounds, a cost that
depends on how much else the process holds and that a check never pays.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from dpsim.collector import frozen_heap
from dpsim.records.trace import Outcome
from dpsim.sim.instant import InstantWorld
from dpsim.sim.render import render_table
from dpsim.sim.scheduler import Program
from dpsim.sim.simulate import per_rank_programs, simulate
from dpsim.targets import runtime


def measure_overhead(
    programs: Program | Sequence[Program],
    ranks: int,
    rounds: int,
    *,
    groups: Mapping[str, Sequence[int]] | None = None,
    chunks: int = 20,
) -> dict[str, Any]:
    """Time ``rounds`` simulated runs against ``rounds`` bare rounds.

    Returns ``ranks``, ``rounds``, ``rounds_per_s`` (simulated),
    ``bare_rounds_per_s``, ``overhead`` and ``cpu_overhead`` (see the module
    docstring) and the per-rank-call times ``sim_us_per_rank_call`` /
    ``bare_us_per_rank_call``.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    program_list = per_rank_programs(programs, ranks)
    reference = simulate(program_list, ranks=ranks, groups=groups)
    if reference.outcome is not Outcome.OK:
        raise ValueError(
            "measure_overhead() needs a program that completes; the reference run did not:\n"
            + render_table(reference)
        )
    instant = InstantWorld(reference)

    def bare_rounds(count: int) -> list[Any]:
        returned: list[Any] = []
        with runtime.installed(instant):
            for _ in range(count):
                instant.rewind()
                returned = []
                for rank, program in enumerate(program_list):
                    instant.current = rank
                    returned.append(program(rank))
        return returned

    # Honesty check: the baseline must make the calls the simulation made.
    if bare_rounds(1) != reference.returns():
        raise ValueError("the bare baseline returned other values than the simulation")

    sizes = [
        rounds // chunks + (1 if i < rounds % chunks else 0) for i in range(chunks)
    ]
    bare_seconds = sim_seconds = bare_cpu = sim_cpu = 0.0
    with frozen_heap():
        for size in sizes:
            if size == 0:
                continue
            bare_rounds(1)  # untimed: warm (see the module docstring)
            started, cpu_started = time.perf_counter(), time.process_time()
            bare_rounds(size)
            bare_seconds += time.perf_counter() - started
            bare_cpu += time.process_time() - cpu_started
            simulate(program_list, ranks=ranks, groups=groups)  # untimed: warm
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(size):
                simulate(program_list, ranks=ranks, groups=groups)
            sim_seconds += time.perf_counter() - started
            sim_cpu += time.process_time() - cpu_started
    return {
        "ranks": ranks,
        "rounds": rounds,
        "rounds_per_s": rounds / sim_seconds,
        "bare_rounds_per_s": rounds / bare_seconds,
        "overhead": sim_seconds / bare_seconds,
        # The clock's resolution can leave a tiny run's CPU time at 0.
        "cpu_overhead": sim_cpu / bare_cpu if bare_cpu > 0 else None,
        "sim_us_per_rank_call": sim_seconds / (rounds * ranks) * 1e6,
        "bare_us_per_rank_call": bare_seconds / (rounds * ranks) * 1e6,
    }
