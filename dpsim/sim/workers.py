"""A per-thread pool of greenlets that run ranks, reused across runs.

Starting a fresh greenlet and letting it finish costs several microseconds
(each one allocates its own interpreter data stack), about as much as the rest
of the simulator's per-rank work together. A worker therefore never finishes:
it runs one rank's program, passes the baton on (to the next rank, or to the
hub when none can run), and waits for the next rank, in this run or a later
one. A worker whose rank was ended by
``GreenletExit`` is idle again afterwards and goes back to the pool too.
"""

from __future__ import annotations

import threading
from typing import Protocol

from greenlet import getcurrent, greenlet

#: Idle workers kept per thread; more are created on demand and dropped after.
MAX_IDLE_WORKERS = 1024


class RankRunner(Protocol):
    """What a worker needs from the scheduler that hands it a rank."""

    def run_rank(self, rank: int) -> None: ...

    def after_rank(self) -> greenlet: ...


Task = tuple[RankRunner, int]


class Worker(greenlet):
    """A pooled greenlet; ``task`` is the rank it runs when next switched to idle."""

    task: Task | None = None


def _worker_loop() -> None:
    # The task comes as an attribute of the worker, set by whoever switches to
    # it, not as the switch's value: the switch that parks an idle worker is
    # then made with nothing of the finished run on this frame.
    me = getcurrent()
    assert isinstance(me, Worker)
    target = me.parent  # a new worker parks in whoever created it: see take()
    assert target is not None
    while True:
        target.switch()
        runner, rank = me.task  # type: ignore[misc]  # set by take() before any switch
        me.task = None
        runner.run_rank(rank)
        target = runner.after_rank()
        del runner


class _Pool(threading.local):
    def __init__(self) -> None:
        self.idle: list[Worker] = []


_POOL = _Pool()


def take(count: int, hub: greenlet, runner: RankRunner) -> list[Worker]:
    """``count`` workers, the k-th handed rank k of ``runner``: switching to
    one starts that rank, and a worker never switched to runs nothing."""
    idle = _POOL.idle
    workers = []
    for rank in range(count):
        if idle:
            worker = idle.pop()
        else:
            # Started here, where it parks at once: a greenlet begins at the
            # recursion depth of the one that starts it, so one started by a
            # rank deep in its program would add that depth to its own, and
            # ranks starting one another would overflow at a few hundred.
            worker = Worker(_worker_loop)
            worker.switch()
        # Where an exception that escapes a rank (KeyboardInterrupt) surfaces.
        # Usually already so: runs in a row share a hub. Setting it checks for
        # cycles, which costs more than this test.
        if worker.parent is not hub:
            worker.parent = hub
        worker.task = (runner, rank)
        workers.append(worker)
    return workers


def reset_pool() -> None:
    """Drop the idle workers; the next runs start fresh ones.

    Called where a new search begins (``dpsim.check.run_check``). Workers that
    have served runs of several earlier searches can crash the interpreter
    (SIGSEGV) when a torch C++ exception is then raised in one of them, while
    fresh workers do not (``tests/test_check.py`` reproduces it in a child
    process). The root cause, somewhere in greenlet's stack switching under
    C++ unwinding, is not pinned down; reuse within one search keeps nearly
    all of the pool's speed.
    """
    _POOL.idle.clear()


def give_back(workers: list[Worker]) -> None:
    """Return workers that are idle (waiting for a task) to the pool."""
    idle = _POOL.idle
    for worker in workers:
        if not worker.dead and len(idle) < MAX_IDLE_WORKERS:
            idle.append(worker)
