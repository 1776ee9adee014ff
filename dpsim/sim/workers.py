"""A per-thread pool of greenlets that run ranks, reused across runs.

Starting a fresh greenlet and letting it finish costs several microseconds
(each one allocates its own interpreter data stack), about as much as the rest
of the simulator's per-rank work together. A worker therefore never finishes:
it runs one rank's program, reports back to the hub, and waits for the next
rank, in this run or a later one. A worker whose rank was ended by
``GreenletExit`` is idle again afterwards and goes back to the pool too.
"""

from __future__ import annotations

import threading
from typing import Protocol

from greenlet import greenlet

#: Idle workers kept per thread; more are created on demand and dropped after.
MAX_IDLE_WORKERS = 1024


class RankRunner(Protocol):
    """What a worker needs from the scheduler that hands it a rank."""

    hub: greenlet | None

    def run_rank(self, rank: int) -> None: ...


Task = tuple[RankRunner, int]


def _worker_loop(task: Task) -> None:
    while True:
        runner, rank = task
        runner.run_rank(rank)
        hub = runner.hub
        assert hub is not None
        # Hold nothing of the finished run while idle.
        del task, runner
        task = hub.switch()


class _Pool(threading.local):
    def __init__(self) -> None:
        self.idle: list[greenlet] = []


_POOL = _Pool()


def take(count: int, hub: greenlet) -> list[greenlet]:
    """``count`` workers, each to be started with ``worker.switch((runner, rank))``."""
    idle = _POOL.idle
    workers = []
    for _ in range(count):
        worker = idle.pop() if idle else greenlet(_worker_loop)
        # Where an exception that escapes a rank (KeyboardInterrupt) surfaces.
        worker.parent = hub
        workers.append(worker)
    return workers


def give_back(workers: list[greenlet]) -> None:
    """Return workers that are idle (waiting for a task) to the pool."""
    idle = _POOL.idle
    for worker in workers:
        if not worker.dead and len(idle) < MAX_IDLE_WORKERS:
            idle.append(worker)
