"""Virtual ranks as greenlets, taking turns under one deterministic scheduler.

Every rank's program runs in its own greenlet; :meth:`Scheduler.run` runs in
the caller's greenlet (the hub). A rank gives up the baton when it blocks (in a
collective that cannot complete yet), at a preemption point (where
interleaving can change what a program observes: entering an async op, polling
``is_completed()``, completing a collective), or when it ends. The chooser then
says which runnable rank goes next, and the choice is recorded. Nothing else
decides the order, so the same programs and choices give the same run.
Greenlets rather than threads: a switch costs well under a microsecond, a
condition-variable handoff many times more.

The rank giving up the baton makes that choice itself and switches straight
to the next rank (or carries on, when a preemption point picks it again),
rather than going through the hub: half the switches, and in an N-rank run
that parks N ranks in one collective, switches are a large share of the cost.
The hub gets the baton back only when no rank can run, or when the chooser
raised: that exception belongs to the caller of ``run()``, never to the
program of the rank that happened to ask (whose ``except Exception`` could
swallow a replay divergence).

When no rank can run the loop ends; what the blocked ranks wait for is the
diagnosis, read by :mod:`dpsim.sim.result` before :meth:`Scheduler.close`
throws ``GreenletExit`` into them so their ``finally`` blocks run.
"""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from bisect import insort
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from greenlet import GreenletExit, getcurrent, greenlet

from dpsim.boundary import fault_of
from dpsim.records.trace import ErrorInfo, RankState
from dpsim.sim import workers as workers_pool
from dpsim.sim.choosers import Chooser, LowestFirst

DEFAULT_STEP_BUDGET = 100_000

#: Looked up once: an Enum member read off its class goes through the enum
#: metaclass's ``__getattr__`` hook, and every rank of every run ends so.
_FINISHED = RankState.FINISHED

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
    """The error as a trace keeps it: stable across processes and runs, and
    whose it is (:func:`~dpsim.boundary.fault_of`)."""
    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    if frames:
        innermost = frames[-1]
        where = f"{os.path.basename(innermost.filename)}:{innermost.lineno} in {innermost.name}"
    message = _ADDRESS.sub("0x?", str(error))
    fault = fault_of(error)
    return ErrorInfo(
        type=type(error).__name__,
        message=message,
        where=where,
        fault=None if fault is None else _ADDRESS.sub("0x?", str(fault)),
    )


class Scheduler:
    """Runs ``programs[rank](rank)`` for every rank, one at a time."""

    # One is made per run, and its attributes are read at every switch.
    __slots__ = (
        "_budget",
        "_budget_stopped",
        "_choose",
        "_closing",
        "_ended",
        "_failure",
        "_lowest_first",
        "_programs",
        "_runnable",
        "_started",
        "_workers",
        "choices",
        "current",
        "exits",
        "hub",
        "steps",
    )

    def __init__(
        self,
        programs: Sequence[Program],
        chooser: Chooser,
        step_budget: int = DEFAULT_STEP_BUDGET,
    ) -> None:
        ranks = len(programs)
        self._programs = programs
        self._choose = chooser.choose
        #: The default chooser's pick needs no call (it is every run's but
        #: a drawn or replayed schedule's, asked at every switch).
        self._lowest_first = type(chooser) is LowestFirst
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
        #: What the chooser raised in a rank's greenlet, for the hub to re-raise.
        self._failure: BaseException | None = None

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
        # Never this rank's own worker: it is not runnable until woken.
        self.next_greenlet().switch()

    def preempt(self) -> None:
        """A point where another rank may run first; this one stays runnable."""
        if self._closing:
            raise GreenletExit
        runnable = self._runnable
        if not runnable:
            return  # nobody else could run: no choice to make or record
        rank = self.current
        insort(runnable, rank)
        target = self.next_greenlet()
        if target is not self._workers[rank]:
            target.switch()  # returns when this rank is picked again

    def wake(self, ranks: Sequence[int]) -> None:
        """Make blocked ``ranks`` runnable again."""
        runnable = self._runnable
        runnable.extend(ranks)
        runnable.sort()

    @property
    def closing(self) -> bool:
        return self._closing

    # -- passing the baton -------------------------------------------------

    def _pick(self, runnable: list[int]) -> int:
        """Take the chooser's pick from ``runnable`` (two or more) and record it."""
        rank = self._choose(runnable)
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
        self.choices.append(rank)
        return rank

    def next_greenlet(self) -> greenlet:
        """Pick who runs next and make it current; the hub when nobody can.

        Called in the greenlet giving up the baton, which then switches to
        the one returned (:meth:`block`, or a caller that knows the run is not
        closing). A rank's first switch starts it: its worker was handed its
        task in :meth:`run`.
        """
        runnable = self._runnable
        if len(runnable) == 1:
            rank = runnable.pop()  # no choice to make or record
        elif runnable and self._lowest_first:
            rank = runnable.pop(0)
            self.choices.append(rank)
        elif runnable:
            try:
                rank = self._pick(runnable)
            except BaseException as error:
                self._failure = error
                return self.hub
        else:
            return self.hub
        self.current = rank
        return self._workers[rank]

    # -- the hub -----------------------------------------------------------

    def run(
        self,
        crew: workers_pool.Crew,
        on_quiescent: Callable[[], bool] | None = None,
    ) -> None:
        """Run ranks until none can run, worker k of ``crew`` running rank k.
        On an exception, close before re-raising.

        ``crew``'s workers must all be idle. When no rank can run, ``on_quiescent()`` (if given) is called in the
        hub; it may wake ranks (a message into a parked rank's mailbox) and
        return True to go on. The run ends when it returns False or woke no one.
        """
        if self.hub is not None:
            raise SchedulerError("a Scheduler runs once")
        self.hub = getcurrent()
        self._workers = crew.take(len(self._programs), self.hub, self)
        runnable = self._runnable
        try:
            while True:
                while runnable:
                    # Back here when no rank can run, or when the chooser raised.
                    self.next_greenlet().switch()
                    failure = self._failure
                    if failure is not None:
                        self._failure = None
                        raise failure
                self.current = -1
                if on_quiescent is None or not on_quiescent() or not runnable:
                    break
        except BaseException:
            self.close()
            raise

    def blocked_ranks(self) -> tuple[int, ...]:
        """Ranks that started and have not ended (read in the hub, between ranks)."""
        return tuple(
            rank
            for rank, (started, ended) in enumerate(
                zip(self._started, self._ended, strict=True)
            )
            if started and not ended
        )

    def every_rank_ended(self) -> bool:
        """Whether no rank's greenlet is left suspended (after :meth:`close`,
        unless a program swallowed every ``GreenletExit`` thrown into it)."""
        return self._ended == self._started

    def frame(self, rank: int) -> FrameType | None:
        """Where a blocked rank stands: its greenlet's innermost frame, else None."""
        if not self._started[rank] or self._ended[rank] or rank == self.current:
            return None
        frame: FrameType | None = self._workers[rank].gr_frame
        return frame

    def run_rank(self, rank: int) -> greenlet:
        """Run one rank's program to its end, in a worker; record how it ended.

        Returns where the worker switches next: the next rank, or the hub.
        """
        self._started[rank] = True
        try:
            returned = self._programs[rank](rank)
        except GreenletExit:
            pass  # thrown by close(): this rank stays where it was
        except StepBudgetExceeded:
            self.exits[rank] = (RankState.BUDGET, None, None)
        # SystemExit too: a target's sys.exit() in one rank is that rank's
        # error, not the end of the run (KeyboardInterrupt still ends it).
        except (Exception, SystemExit) as error:
            if not self._closing:
                self.exits[rank] = (
                    (RankState.BUDGET, None, None)
                    if self._budget_stopped[rank]
                    else (RankState.RAISED, None, describe_exception(error))
                )
        else:
            if self._closing:
                pass
            elif self._budget_stopped[rank]:
                # The program caught the budget stop and returned anyway.
                self.exits[rank] = (RankState.BUDGET, None, None)
            else:
                self.exits[rank] = (_FINISHED, returned, None)
        finally:
            self._ended[rank] = True
        if self._closing:
            return self.hub
        return self.next_greenlet()

    def close(self) -> None:
        """End every rank still blocked, letting its ``finally`` blocks run.

        Code run while closing cannot enter collectives, tick, or record: any
        attempt raises ``GreenletExit`` again, so the trace stays as the run
        left it. Workers whose rank ended are idle again.
        """
        if self._closing:
            return
        self._closing = True
        self._budget = -1  # so a tick in a finally block ends the rank at once
        self._runnable.clear()
        workers = self._workers
        if self._ended == self._started:
            # Every rank that started has ended (the usual case): no one to
            # end, and every worker is idle.
            self.current = -1
            return
        for rank, worker in enumerate(workers):
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
