"""The real-distributed lane: a case on N real processes and real process groups.

The parent starts one process per rank, ``python -m dpsim.replay.worker``
as ``torchrun`` starts workers (see :mod:`dpsim.replay.worker`), and watches marker files in a private run directory:

1. start-up: every rank loads the target and joins the groups; a rank that
   fails here (or dies) aborts the lane with its own error, and a start-up
   slower than ``startup_s`` is an error too;
2. the run: a rank is settled once it reports its end (``rank-N.done``) or its
   process exits. All settled: the finished ranks are released and exit.
   No rank log growing for ``timeout_s`` plus a grace while some rank is
   unsettled: the watchdog declares the lane hung. Each group also has
   ``timeout=timeout_s``, so a rank stuck in gloo usually reports its own
   timeout first.

Whatever happens, even an exception or ^C in the parent, every child is
reaped before :func:`run_lane` returns (:func:`dpsim.processes.reap`).
Children also ask the kernel to kill them should the parent die. The per-rank
logs then become a ``SimResult`` (:mod:`dpsim.replay.traces`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dpsim import processes
from dpsim.errors import UsageError
from dpsim.properties import Verdict, judge, select
from dpsim.records.case import Case
from dpsim.records.trace import SimResult
from dpsim.replay import traces
from dpsim.replay.worker import RankJob
from dpsim.scenarios.run import refuse_faults
from dpsim.targets.spec import DEFAULT_RELEASE

BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_STARTUP_S = 120.0
#: Beyond the groups' own timeout, so a stuck rank can report it itself.
WATCHDOG_GRACE_S = 2.0
_POLL_S = 0.01
#: Seconds the finished ranks have to exit once released, and a rank has
#: between SIGTERM and SIGKILL.
_EXIT_WAIT_S = 1.0

Process = subprocess.Popen[bytes]


class LaneError(UsageError):
    """The lane could not run the case (start-up failed, no GPUs, ...)."""


@dataclass(frozen=True)
class RankEnd:
    """How one process ended, beside what its log says."""

    rank: int
    pid: int | None
    exitcode: int | None  # negative: killed by that signal
    #: processes.EXITED, TERMINATED (SIGTERM from the watchdog) or KILLED
    reaped: str
    backend_error: str | None


@dataclass(frozen=True)
class LaneRun:
    backend: str
    case: Case
    result: SimResult
    verdicts: tuple[Verdict, ...]
    ends: tuple[RankEnd, ...]
    #: The watchdog fired: no rank made progress for the timeout.
    watchdog_fired: bool
    startup_s: float
    run_s: float
    #: Modules whose source a rank loaded with another hash than the parent's.
    source_mismatch: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return not self.verdicts


def check_backend(backend: str, ranks: int) -> None:
    """Refuse a lane this machine cannot run, in one line."""
    if backend not in BACKENDS:
        raise LaneError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        raise LaneError("this torch has no gloo backend; the replay lane needs it")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise LaneError("--backend nccl needs CUDA GPUs; none is visible here")
        if not dist.is_nccl_available():
            raise LaneError("--backend nccl: this torch was built without NCCL")
        gpus = torch.cuda.device_count()
        if gpus < ranks:
            raise LaneError(
                f"--backend nccl runs one process per GPU: the case has {ranks} "
                f"ranks, this machine {gpus} GPU(s); use --backend gloo"
            )


def run_lane(
    case: Case,
    *,
    vllm: str | None,
    target_file: str | None,
    runner: str | None = None,
    caller_file: str | None = None,
    properties: tuple[str, ...] = (),
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    startup_s: float = DEFAULT_STARTUP_S,
    expected_files: dict[str, str] | None = None,
    step_budget: int = 0,
) -> LaneRun:
    """Run ``case`` on ``case.dp_size`` real processes and judge what they did."""
    check_backend(backend, case.dp_size)
    if timeout_s <= 0:
        raise LaneError("the lane's timeout must be positive")
    run_dir = Path(tempfile.mkdtemp(prefix="dpsim-lane-"))
    jobs = [
        RankJob(
            rank=rank,
            ranks=case.dp_size,
            backend=backend,
            vllm=vllm,
            target_file=target_file,
            runner=runner,
            caller_file=caller_file,
            case=case.to_dict(),
            run_dir=str(run_dir),
            timeout_s=timeout_s,
            startup_s=startup_s,
            step_budget=step_budget,
            parent_pid=os.getpid(),
        )
        for rank in range(case.dp_size)
    ]
    children: list[Process] = []
    reaped: list[processes.Ended] | None = None
    try:
        started = time.monotonic()
        for job in jobs:
            with job.path("stderr").open("wb") as stderr:
                children.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "dpsim.replay.worker", str(job.write())],
                        stdin=subprocess.DEVNULL,
                        stdout=stderr,
                        stderr=stderr,
                        env={**os.environ, "OMP_NUM_THREADS": "1"},
                    )
                )
        await_startup(jobs, children, startup_s)
        ready = time.monotonic()
        fired = _watch(jobs, children, timeout_s + WATCHDOG_GRACE_S)
        (run_dir / "release").touch()
        finished = time.monotonic()
        reaped = processes.reap(children, patience=_EXIT_WAIT_S, grace=_EXIT_WAIT_S)
        logs = [traces.parse_log(job.rank, job.path("jsonl")) for job in jobs]
    except BaseException:
        if reaped is None:
            reaped = processes.reap(children, patience=0.2, grace=_EXIT_WAIT_S)
        raise
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    result = traces.result_from_logs(logs)
    # A rank that raised from dpsim's side of the boundary: no verdict.
    refuse_faults(target_file or f"vllm {vllm or DEFAULT_RELEASE}", result, [])
    verdicts = tuple(judge(case, result, select(properties)))
    return LaneRun(
        backend=backend,
        case=case,
        result=result,
        verdicts=verdicts,
        ends=tuple(
            RankEnd(index, end.pid, end.exitcode, end.how, logs[index].backend_error)
            for index, end in enumerate(reaped)
        ),
        watchdog_fired=fired,
        startup_s=ready - started,
        run_s=finished - ready,
        source_mismatch=_source_mismatch(logs, expected_files),
    )


class MarkedJob(Protocol):
    """A rank's job as the parent watches it: by its marker files."""

    @property
    def rank(self) -> int: ...
    def path(self, suffix: str) -> Path: ...


def await_startup(
    jobs: Sequence[MarkedJob], children: list[Process], limit_s: float
) -> None:
    """Wait until every rank is ready; a rank failing first, or a start-up
    slower than ``limit_s``, is a :class:`LaneError`."""
    deadline = time.monotonic() + limit_s
    while True:
        pending = [job for job in jobs if not job.path("ready").exists()]
        if not pending:
            return
        for job, process in zip(jobs, children, strict=True):
            if job in pending and (
                job.path("done").exists() or process.poll() is not None
            ):
                log = traces.parse_log(job.rank, job.path("jsonl"))
                reason = log.setup_error or _last_line(job.path("stderr"))
                raise LaneError(f"rank {job.rank} failed to start: {reason}")
        if time.monotonic() > deadline:
            raise LaneError(
                f"ranks {[job.rank for job in pending]} did not start within "
                f"{limit_s:g}s (target load and process-group rendezvous)"
            )
        time.sleep(_POLL_S)


def _watch(jobs: list[RankJob], children: list[Process], stall_s: float) -> bool:
    """Wait until every rank is settled; True if the watchdog had to give up."""
    logs = [job.path("jsonl") for job in jobs]
    sizes = [-1] * len(jobs)
    last_progress = time.monotonic()
    while True:
        settled = all(
            job.path("done").exists() or process.poll() is not None
            for job, process in zip(jobs, children, strict=True)
        )
        if settled:
            return False
        now = time.monotonic()
        for index, path in enumerate(logs):
            try:
                size = path.stat().st_size
            except OSError:
                size = -1
            if size != sizes[index]:
                sizes[index] = size
                last_progress = now
        if now - last_progress > stall_s:
            return True
        time.sleep(_POLL_S)


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1][:500] if lines else "it exited without a word"


def _source_mismatch(
    logs: list[traces.RankLogData], expected: dict[str, str] | None
) -> tuple[str, ...]:
    if expected is None:
        return ()
    lines = []
    for log in logs:
        for module, digest in sorted(log.files.items()):
            if expected.get(module) != digest:
                lines.append(f"rank {log.rank}: {module} sha256 {digest[:12]}")
    return tuple(lines)
