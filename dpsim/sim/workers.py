"""The greenlets that run ranks: one crew per world, reused across its runs.

Starting a fresh greenlet and letting it finish costs several microseconds
(each one allocates its own interpreter data stack), about as much as the rest
of the simulator's per-rank work together. A worker therefore never finishes:
it runs one rank's program, passes the baton on (to the next rank, or to the
hub when none can run), and waits for that rank of the next run. A worker
whose rank was ended by ``GreenletExit`` is idle again afterwards too.

Worker k of a crew always runs rank k, and a crew belongs to one pooled world
(``dpsim.sim.world``), which has a fixed number of ranks: a run hands its
crew only the scheduler, not a task per worker, and gives nothing back.
"""

from __future__ import annotations

import threading
from typing import Protocol

from greenlet import getcurrent, greenlet


class RankRunner(Protocol):
    """What a worker needs from the scheduler of the run it serves."""

    def run_rank(self, rank: int) -> greenlet:
        """Run ``rank``'s program; return where the worker switches next."""
        ...


class _Generation(threading.local):
    def __init__(self) -> None:
        #: Bumped by :func:`reset_pool`: a crew made before it starts afresh.
        self.number = 0


_GENERATION = _Generation()


class Crew:
    """One idle-or-running worker per rank of a world."""

    __slots__ = ("_generation", "_hub", "runner", "workers")

    def __init__(self, runner: RankRunner) -> None:
        #: The scheduler whose ranks the workers run now (the last run's while idle).
        self.runner = runner
        #: Worker k runs rank k; switching to one starts its rank.
        self.workers: list[greenlet] = []
        self._hub: greenlet | None = None
        self._generation = _GENERATION.number

    def take(self, count: int, hub: greenlet, runner: RankRunner) -> list[greenlet]:
        """The ``count`` workers, ready to run ``runner``'s ranks under ``hub``.

        Only for a crew whose workers are all idle: every rank of its last
        run ended (see ``world.give_back_world``).
        """
        self.runner = runner
        workers = self.workers
        if self._generation != _GENERATION.number:
            self._generation = _GENERATION.number
            workers = self.workers = []
        if self._hub is not hub:
            # Where an exception that escapes a rank (KeyboardInterrupt)
            # surfaces. Runs in a row share a hub, so this is rare: setting a
            # parent checks for cycles.
            for worker in workers:
                worker.parent = hub
            self._hub = hub
        while len(workers) < count:
            # Started here, in the hub, where it parks at once: a greenlet
            # begins at the recursion depth of the one that starts it, so
            # one started by a rank deep in its program would add that depth
            # to its own, and ranks starting one another would overflow at a
            # few hundred.
            worker = greenlet(_worker_loop)
            worker.switch(self, len(workers))
            workers.append(worker)
        return workers


def _worker_loop(crew: Crew, rank: int) -> None:
    # The scheduler is read off the crew at each start, not passed in the
    # switch: the switch that parks an idle worker then carries nothing of
    # the finished run on this frame.
    target = getcurrent().parent
    assert target is not None
    while True:
        target.switch()
        target = crew.runner.run_rank(rank)


def reset_pool() -> None:
    """Make every crew start its next run with fresh workers.

    Called where a new search begins (``dpsim.check.run_check``). Workers that
    have served runs of several earlier searches can crash the interpreter
    (SIGSEGV) when a torch C++ exception is then raised in one of them, while
    fresh workers do not (``tests/test_check.py`` reproduces it in a child
    process). The root cause, somewhere in greenlet's stack switching under
    C++ unwinding, is not pinned down; reuse within one search keeps nearly
    all of the crews' speed.
    """
    _GENERATION.number += 1
