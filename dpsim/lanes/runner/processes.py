"""A runner-lane case on real processes: one real engine per process, real gloo.

The runner lane's counterpart of :func:`dpsim.replay.run_lane`. The parent
starts one ``python -m dpsim.lanes.runner.rank_process`` per rank (each
builds its rank's scheduler, speculator, worker and real engine with the
simulator's own builders and joins gloo groups ``world``, ``dp_cpu``,
``dp_device``, ``ep`` and ``engine_dp``), and runs the coordinator model
itself, relaying ``START_DP_WAVE``, requests and shutdowns over one duplex
pipe per child (:mod:`dpsim.lanes.runner.relay`). What travels is
deterministic, and so is when it counts: the case is first simulated, and the
real run follows the simulator's schedule of this channel (the order of the
calls on the coordinator model, what each rank saw at each look at its
input: :mod:`dpsim.lanes.runner.schedule`), so the two traces can be compared
collective for collective. The collectives are real gloo's.

The end is decided as the simulator decides it, with one difference real
processes force:

* every rank still running parked on its input with nothing in flight to it,
  and no rank ended standing in a collective: the coordinator model's
  ``on_quiescent`` (shutdown to every idle engine once input has ended; a
  rank shut down and parked again ends the run there);
* a rank that ended standing in a collective (its gloo group timed out:
  ``timeout_s``), and every other rank parked: the parked ranks are stopped
  where they stand, as the simulator leaves them;
* no rank log growing for ``timeout_s`` plus a grace while some rank has not
  settled: the watchdog fires (a hang the groups' own timeouts did not end).

Then every child is reaped, whatever happened, and the per-rank logs become a
``SimResult`` (:mod:`dpsim.replay.traces`) judged with the same properties:
compare it with the simulator's (:func:`dpsim.replay.disagreements`).
A stand-in asked what it does not know, in any rank, refuses the run
(:class:`~dpsim.errors.TargetError`), as in the simulator.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

from dpsim import processes
from dpsim.errors import BoundaryError, TargetError
from dpsim.properties import Verdict, judge
from dpsim.records.groups import DEFAULT_GROUP_NAMES, ENGINE_DP_GROUP
from dpsim.records.trace import SimResult
from dpsim.replay import traces
from dpsim.replay.compare import disagreements
from dpsim.replay.lane import (
    DEFAULT_STARTUP_S,
    DEFAULT_TIMEOUT_S,
    WATCHDOG_GRACE_S,
    LaneError,
    RankEnd,
    await_startup,
    check_backend,
)
from dpsim.targets.load import Target
from dpsim.terminal import printable

from .case import RunnerCase
from .engine import coordinator_for
from .rank_process import RunnerRankJob
from .relay import PARKED, RankLink, serve
from .run import sources_for, step_budget_for
from .schedule import simulate_with_schedule

#: The runner lane's groups, in the simulator's order (its defaults, then
#: the engines' own DP group, as ``run_runner_case`` declares it).
GROUP_NAMES = (*DEFAULT_GROUP_NAMES, ENGINE_DP_GROUP)
#: The backend the runner lane's real processes use (its device groups hold
#: CPU tensors: the stood-in model computes nothing on a GPU).
BACKEND = "gloo"
_POLL_S = 0.01
_EXIT_WAIT_S = 1.0

Process = subprocess.Popen[bytes]


@dataclass(frozen=True)
class RunnerLaneRun:
    """A runner case on real processes: the trace, judged, and how ranks ended."""

    case: RunnerCase
    result: SimResult
    verdicts: tuple[Verdict, ...]
    ends: tuple[RankEnd, ...]
    watchdog_fired: bool
    startup_s: float
    run_s: float
    #: Modules whose source a rank loaded with another hash than the parent's.
    source_mismatch: tuple[str, ...]

    @property
    def backend(self) -> str:
        return BACKEND

    @property
    def holds(self) -> bool:
        return not self.verdicts


def run_runner_lane(
    target: Target,
    case: RunnerCase,
    properties: Sequence[Any],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    startup_s: float = DEFAULT_STARTUP_S,
) -> RunnerLaneRun:
    """Run ``case`` on ``case.dp_size`` real processes, one real engine each,
    and judge the trace with ``properties`` (property objects, as
    :func:`dpsim.properties.judge` takes them)."""
    check_backend(BACKEND, case.dp_size)
    if timeout_s <= 0:
        raise LaneError("the lane's timeout must be positive")
    # The simulator's schedule of the coordinator channel, which the real
    # processes follow (see dpsim.lanes.runner.schedule); refuses a case the
    # lane cannot drive (or a target loaded for the other runner) before any
    # process starts.
    _, schedule = simulate_with_schedule(target, case)
    spec = target.spec
    run_dir = Path(tempfile.mkdtemp(prefix="dpsim-runner-lane-"))
    links: list[RankLink] = []
    jobs: list[RunnerRankJob] = []
    children: list[Process] = []
    reaped: list[processes.Ended] | None = None
    try:
        started = time.monotonic()
        for rank in range(case.dp_size):
            ours, theirs = multiprocessing.Pipe(duplex=True)
            links.append(RankLink(rank, ours))
            job = RunnerRankJob(
                rank=rank,
                ranks=case.dp_size,
                backend=BACKEND,
                vllm=str(spec.base),
                dp_utils_file=None
                if spec.dp_utils_file is None
                else str(spec.dp_utils_file),
                case=case.to_dict(),
                run_dir=str(run_dir),
                timeout_s=timeout_s,
                startup_s=startup_s,
                step_budget=step_budget_for(case),
                parent_pid=os.getpid(),
                relay_fd=theirs.fileno(),
                looks=schedule.looks_of(rank),
            )
            jobs.append(job)
            with job.path("stderr").open("wb") as stderr:
                children.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "dpsim.lanes.runner.rank_process",
                            str(job.write()),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=stderr,
                        stderr=stderr,
                        pass_fds=(theirs.fileno(),),
                        env={**os.environ, "OMP_NUM_THREADS": "1"},
                    )
                )
            theirs.close()
        # The coordinator model only puts into its mailboxes: links take puts.
        coordinator = coordinator_for(sources_for(target), cast(Any, links))
        for link in links:
            coordinator.attach(link.rank, link.shutdown)
        await_startup(jobs, children, startup_s)
        ready = time.monotonic()
        fired = _Relay(jobs, children, links, coordinator, schedule.calls).run(
            timeout_s + WATCHDOG_GRACE_S
        )
        (run_dir / "release").touch()
        finished = time.monotonic()
        reaped = processes.reap(children, patience=_EXIT_WAIT_S, grace=_EXIT_WAIT_S)
        logs = [traces.parse_log(job.rank, job.path("jsonl")) for job in jobs]
        gaps = [gap for job in jobs for gap in _logged(job, "gaps")]
    except BaseException:
        if reaped is None:
            reaped = processes.reap(children, patience=0.2, grace=_EXIT_WAIT_S)
        raise
    finally:
        for link in links:
            link.connection.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    if gaps:
        more = f" (and {len(gaps) - 1} more gaps)" if len(gaps) > 1 else ""
        raise TargetError(
            printable(f"runner lane cannot drive {target.label}: {gaps[0]}{more}")
        )
    result = traces.result_from_logs(logs, GROUP_NAMES)
    for trace in result.ranks:
        if trace.error is not None and trace.error.fault is not None:
            # A rank raised from dpsim's side of the boundary: no verdict.
            raise BoundaryError(
                printable(
                    f"runner lane cannot drive {target.label}: rank {trace.rank} "
                    f"raised {trace.error.fault}"
                )
            )
    loaded = {item.module: item.sha256 for item in target.files}
    return RunnerLaneRun(
        case=case,
        result=result,
        verdicts=tuple(judge(case, result, properties)),
        ends=tuple(
            RankEnd(index, end.pid, end.exitcode, end.how, logs[index].backend_error)
            for index, end in enumerate(reaped)
        ),
        watchdog_fired=fired,
        startup_s=ready - started,
        run_s=finished - ready,
        source_mismatch=tuple(
            f"rank {log.rank}: {module} sha256 {digest[:12]}"
            for log in logs
            for module, digest in sorted(log.files.items())
            if loaded.get(module) != digest
        ),
    )


class _Quiet:
    """What the coordinator model's ``on_quiescent`` reads (a
    :class:`~dpsim.sim.mailbox.Quiescence`'s ``parked`` and ``blocked``)."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.parked = dict.fromkeys(ranks)
        self.blocked = ranks


class _Relay:
    """The parent's loop: relay the children's calls to the coordinator
    model, decide the end (see the module docstring), watch for a stall."""

    def __init__(
        self,
        jobs: list[RunnerRankJob],
        children: list[Process],
        links: list[RankLink],
        coordinator: Any,
        calls: Sequence[tuple[int, str]],
    ) -> None:
        self.jobs = jobs
        self.children = children
        self.links = links
        self.coordinator = coordinator
        self.settled: dict[int, bool] = {}  # rank -> ended in a collective
        self.open = {link.connection: link for link in links}
        #: The simulator's order of calls, while the run follows it; the
        #: calls received and not yet made, by rank, oldest first.
        self.calls: deque[tuple[int, str]] | None = deque(calls)
        self.waiting: dict[int, tuple[Any, ...]] = {}

    def run(self, stall_s: float) -> bool:
        """Until every rank has settled; True if the watchdog had to give up."""
        sizes = [-1] * len(self.jobs)
        last_progress = time.monotonic()
        while True:
            self._relay()
            self._settle()
            self._serve()
            if len(self.settled) == len(self.jobs):
                return False
            self._decide()
            now = time.monotonic()
            for index, job in enumerate(self.jobs):
                try:
                    size = job.path("jsonl").stat().st_size
                except OSError:
                    size = -1
                if size != sizes[index]:
                    sizes[index] = size
                    last_progress = now
            if now - last_progress > stall_s:
                return True

    def _relay(self) -> None:
        for connection in wait(list(self.open), timeout=_POLL_S):
            assert isinstance(connection, Connection)
            link = self.open[connection]
            try:
                message = connection.recv()
            except (EOFError, OSError):
                del self.open[connection]  # the child is gone
                continue
            if message[0] == PARKED:
                link.parked_at = message[1]
            else:
                link.parked_at = None
                self.waiting[link.rank] = message

    def _serve(self) -> None:
        """Make the children's calls waiting here, in the simulator's order
        while the run follows it, else as they came."""
        while self.waiting:
            if self.calls:
                rank, kind = self.calls[0]
                message = self.waiting.get(rank)
                if message is None and rank not in self.settled:
                    return  # its turn comes once that rank makes the call
                if message is not None and message[0] == kind:
                    self.calls.popleft()
                    self._make(rank, self.waiting.pop(rank))
                    continue
            # Past the simulator's calls, or off them: the order calls came in.
            self.calls = None
            rank = next(iter(self.waiting))
            self._make(rank, self.waiting.pop(rank))

    def _make(self, rank: int, message: tuple[Any, ...]) -> None:
        link = self.links[rank]
        try:
            serve(link, message, self.coordinator)
        except (BrokenPipeError, ConnectionResetError):
            self.open.pop(link.connection, None)

    def _settle(self) -> None:
        for job, child in zip(self.jobs, self.children, strict=True):
            if job.rank in self.settled:
                continue
            if job.path("done").exists() or child.poll() is not None:
                log = traces.parse_log(job.rank, job.path("jsonl"))
                self.settled[job.rank] = any(
                    not entry.completed for entry in log.collectives
                )

    def _decide(self) -> None:
        running = tuple(
            link.rank
            for link in self.links
            if link.rank not in self.settled and not link.stopped
        )
        if not running or not all(self.links[rank].parked for rank in running):
            return  # some rank is still working (or in a collective)
        if not any(self.settled.values()) and self.coordinator.on_quiescent(
            _Quiet(running)
        ):
            return  # shutdowns delivered
        for rank in running:
            self.links[rank].stop()


def _logged(job: RunnerRankJob, key: str) -> list[Any]:
    """Every value of ``key`` in the rank's log lines, flattened."""
    found: list[Any] = []
    try:
        lines = job.path("jsonl").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            break
        if key in entry:
            found.extend(entry[key])
    return found


def lane_differences(
    simulated: SimResult, verdicts: Sequence[Verdict], lane: RunnerLaneRun
) -> tuple[str, ...]:
    """Where the real processes disagree with the simulator (a dpsim bug): the
    sync lane's comparison (:func:`dpsim.replay.disagreements`), plus any
    source a rank loaded with another hash."""
    return disagreements(
        simulated, tuple(verdicts), lane.result, lane.verdicts
    ) + tuple(f"source: {line}" for line in lane.source_mismatch)
