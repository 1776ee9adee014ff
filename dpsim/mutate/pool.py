"""Worker processes for mutants, each job under a hard time limit.

Why not ``ProcessPoolExecutor``: it cannot stop one task. A mutant that
wedges the harness where no progress hook runs must cost its worker, not the
whole run, so each worker here has its own pipe, and one that overruns its
job's limit is terminated (by its own pid) and replaced. Workers are started
and stopped by :mod:`dpsim.processes` (spawned, not forked).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from dpsim import processes
from dpsim.mutate.run import KILLED, TIMEOUT, WORKER, Job, MutantOutcome, check_mutant

#: Time a fresh worker may take to import torch and dpsim before its first job.
START_ALLOWANCE = 30.0


def _serve(connection: Connection) -> None:
    # Hypothesis and the simulator may print; the report is the parent's.
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker
    sys.stdout = sys.stderr = devnull
    import torch

    # Tiny tensors: more threads than one only contend with the other workers.
    torch.set_num_threads(1)
    while True:
        try:
            job = connection.recv()
        except EOFError:
            return
        if job is None:
            return
        connection.send(check_mutant(job))


@dataclass
class _Worker:
    process: BaseProcess
    connection: Connection
    job: Job | None = None
    started: float = 0.0
    fresh: bool = True


def run_jobs(
    jobs: Iterable[Job],
    workers: int,
    limit: float,
) -> Iterator[MutantOutcome]:
    """Outcomes of ``jobs`` in the order they finish; at most ``limit``
    seconds each before its worker is terminated and the job is a timeout."""
    pending = deque(jobs)
    pool: list[_Worker] = []
    retried: set[str] = set()

    def start() -> _Worker:
        parent, child = processes.SPAWN.Pipe()
        process = processes.start(_serve, child)
        child.close()
        return _Worker(process, parent)

    try:
        pool = [start() for _ in range(max(1, min(workers, len(pending))))]
        while pending or any(worker.job is not None for worker in pool):
            for worker in pool:
                if worker.job is None and pending:
                    worker.job = pending.popleft()
                    worker.started = time.monotonic()
                    worker.connection.send(worker.job)
            busy = [worker for worker in pool if worker.job is not None]
            now = time.monotonic()
            nearest = min(_deadline(worker, limit) for worker in busy) - now
            ready = wait([worker.connection for worker in busy], max(0.0, nearest))
            for index, worker in enumerate(pool):
                job = worker.job
                if job is None:
                    continue
                outcome: MutantOutcome | None = None
                if worker.connection in ready:
                    try:
                        outcome = worker.connection.recv()
                    except (EOFError, OSError):
                        worker.process.join(timeout=5)
                        code = worker.process.exitcode
                        pool[index] = _replace(worker, start)
                        worker.job = None
                        if job.mutant_id not in retried:
                            # A crash can come from what earlier mutants left
                            # in that process; a fresh one gets a verdict.
                            retried.add(job.mutant_id)
                            pending.appendleft(job)
                            continue
                        outcome = MutantOutcome(
                            job.mutant_id,
                            KILLED,
                            WORKER,
                            message=f"the worker died twice (exit {code})",
                            elapsed=time.monotonic() - worker.started,
                        )
                elif time.monotonic() > _deadline(worker, limit):
                    outcome = MutantOutcome(
                        job.mutant_id,
                        TIMEOUT,
                        message=f"no verdict within {limit:g}s; worker terminated",
                        elapsed=time.monotonic() - worker.started,
                    )
                    pool[index] = _replace(worker, start)
                if outcome is not None:
                    worker.job = None
                    worker.fresh = False
                    yield outcome
    finally:
        for worker in pool:
            with contextlib.suppress(OSError):
                worker.connection.send(None)
        processes.reap([worker.process for worker in pool], patience=2.0)


def _deadline(worker: _Worker, limit: float) -> float:
    return worker.started + limit + (START_ALLOWANCE if worker.fresh else 0.0)


def _replace(worker: _Worker, start: Callable[[], _Worker]) -> _Worker:
    processes.reap([worker.process])
    worker.connection.close()
    return start()
