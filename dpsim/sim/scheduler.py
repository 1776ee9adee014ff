"""Virtual ranks as greenlets, taking turns under one deterministic scheduler.

Every rank's program runs in its own greenlet; the scheduler runs in the
greenlet that called :meth:`Scheduler.run` (the hub). A rank gives the baton
back when it blocks (in a collective that cannot complete yet), at a
preemption point (where interleaving can change what a program observes:
entering an async op, polling ``is_completed()``, completing a collective), or
when it ends. The hub then asks the chooser which runnable rank goes next and
records the choice. Nothing else decides the order, so the same programs and
choices give the same run. Greenlets rather than threads: a switch costs well
under a microsecond, a condition-variable handoff many times more.

When no rank can run the loop ends; what the blocked ranks wait for is the
diagnosis, read by :mod:`dpsim.sim.result` before :meth:`Scheduler.close`
throws ``GreenletExit`` into them so their ``finally`` blocks run.
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from greenlet import GreenletExit, getcurrent, greenlet

from dpsim.sim import workers as workers_pool
from dpsim.sim.choosers import Chooser
from dpsim.sim.trace import ErrorInfo, RankState

DEFAULT_STEP_BUDGET = 100_000

Program = Callable[[int], Any]


class StepBudgetExceeded(BaseException):
    """Stops a rank that took more steps than its budget.

    A ``BaseException`` so that ``except Exception`` in target code cannot
    swallow it and spin on.
    """


class SchedulerError(RuntimeError):
    """The simulator itself was misused (a bad chooser answer, a nested switch)."""


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def describe_exception(error: BaseException) -> ErrorInfo:
    """The error as a trace keeps it: stable across processes and runs."""
    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    if frames:
        innermost = frames[-1]
        where = f"{os.path.basename(innermost.filename)}:{innermost.lineno} in {innermost.name}"
    message = _ADDRESS.sub("0x?", str(error))
    return ErrorInfo(type=type(error).__name__, message=message, where=where)


class Scheduler:
    """Runs ``programs[rank](rank)`` for every rank, one at a time."""

    def __init__(
        self,
        programs: Sequence[Program],
        chooser: Chooser,
        step_budget: int = DEFAULT_STEP_BUDGET,
    ) -> None:
        ranks = len(programs)
        self._programs = programs
        self._chooser = chooser
        self._budget = step_budget
        #: The rank whose greenlet is running, or -1 in the hub.
        self.current = -1
        self.steps = [0] * ranks
        #: Per rank: None while running or blocked, else (state, returned, error).
        self.exits: list[tuple[RankState, Any, ErrorInfo | None] | None] = [
            None
        ] * ranks
        self.choices: list[int] = []
        self._runnable: list[int] = list(range(ranks))  # kept sorted
        self._budget_stopped = [False] * ranks
        self._closing = False
        #: The greenlet running the scheduling loop; ranks switch back to it.
        self.hub: greenlet | None = None
        self._workers: list[greenlet] = []
        self._started = [False] * ranks
        self._ended = [False] * ranks

    # -- called from inside a rank ---------------------------------------

    def charge(self) -> None:
        """Count one step (a loop iteration or a collective) for the current rank."""
        rank = self.current
        steps = self.steps[rank] + 1
        self.steps[rank] = steps
        if steps > self._budget:
            if self._closing:
                raise GreenletExit
            self._budget_stopped[rank] = True
            raise StepBudgetExceeded(
                f"rank {rank} exceeded its step budget of {self._budget}"
            )

    def block(self) -> None:
        """Give up the baton until some other rank wakes this one."""
        if self._closing:
            raise GreenletExit
        assert self.hub is not None
        self.hub.switch()

    def preempt(self) -> None:
        """A point where another rank may run first; this one stays runnable."""
        if self._closing:
            raise GreenletExit
        if not self._runnable:
            return  # nobody else could run: no choice to make or record
        assert self.hub is not None
        runnable = self._runnable
        runnable.append(self.current)
        runnable.sort()
        self.hub.switch()

    def wake(self, ranks: Sequence[int]) -> None:
        """Make blocked ``ranks`` runnable again."""
        runnable = self._runnable
        runnable.extend(ranks)
        runnable.sort()

    @property
    def closing(self) -> bool:
        return self._closing

    # -- the hub -----------------------------------------------------------

    def run(self) -> None:
        """Run ranks until none can run. On an exception, close before re-raising."""
        if self.hub is not None:
            raise SchedulerError("a Scheduler runs once")
        hub = self.hub = getcurrent()
        ranks = len(self._programs)
        workers = self._workers = workers_pool.take(ranks, hub)
        tasks = [(self, rank) for rank in range(ranks)]
        runnable = self._runnable
        choices = self.choices
        choose = self._chooser.choose
        try:
            while runnable:
                if len(runnable) == 1:
                    rank = runnable.pop()
                else:
                    rank = choose(runnable)
                    if rank == runnable[0]:
                        del runnable[0]
                    else:
                        try:
                            runnable.remove(rank)
                        except ValueError:
                            raise SchedulerError(
                                f"chooser picked rank {rank!r}, not one of the "
                                f"runnable ranks {runnable}"
                            ) from None
                    choices.append(rank)
                self.current = rank
                # A rank's first switch starts it; later ones resume it where it
                # blocked, which ignores the task.
                workers[rank].switch(tasks[rank])
            self.current = -1
        except BaseException:
            self.close()
            raise

    def run_rank(self, rank: int) -> None:
        """Run one rank's program to its end, in a worker; record how it ended."""
        self._started[rank] = True
        try:
            returned = self._programs[rank](rank)
        except GreenletExit:
            return  # thrown by close(): this rank stays where it was
        except StepBudgetExceeded:
            self.exits[rank] = (RankState.BUDGET, None, None)
            return
        except Exception as error:
            if self._closing:
                return
            if self._budget_stopped[rank]:
                self.exits[rank] = (RankState.BUDGET, None, None)
            else:
                self.exits[rank] = (RankState.RAISED, None, describe_exception(error))
            return
        finally:
            self._ended[rank] = True
        if self._closing:
            return
        if self._budget_stopped[rank]:
            # The program caught the budget stop and returned anyway.
            self.exits[rank] = (RankState.BUDGET, None, None)
        else:
            self.exits[rank] = (RankState.FINISHED, returned, None)

    def close(self) -> None:
        """End every rank still blocked, letting its ``finally`` blocks run.

        Code run while closing cannot enter collectives, tick, or record: any
        attempt raises ``GreenletExit`` again, so the trace stays as the run
        left it. Workers whose rank ended go back to the pool.
        """
        if self._closing:
            return
        self._closing = True
        self._budget = -1  # so a tick in a finally block ends the rank at once
        self._runnable.clear()
        for rank, worker in enumerate(self._workers):
            # A program that swallows GreenletExit gets a few more; after that
            # its worker is left to the garbage collector.
            attempts = 0
            while self._started[rank] and not self._ended[rank] and attempts < 3:
                attempts += 1
                self.current = rank
                # An error in a finally block of a rank being ended is not the run's.
                with contextlib.suppress(Exception):
                    worker.throw(GreenletExit)
        self.current = -1
        workers_pool.give_back(
            [
                worker
                for rank, worker in enumerate(self._workers)
                if self._ended[rank] or not self._started[rank]
            ]
        )
        self._workers = []
