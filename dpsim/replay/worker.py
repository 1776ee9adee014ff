"""One rank of the replay lane: a real process, launched like a vLLM worker.

Started as ``python -m dpsim.replay.worker JOB.json``, one process per rank,
the way ``torchrun`` starts workers (a fresh interpreter; nothing depends on
the parent's ``__main__``, unlike multiprocessing's spawn). It loads the
target itself (from the spec, as a worker imports vLLM), joins
real process groups through a file rendezvous in the run directory (no ports
to race for), installs a :class:`~dpsim.replay.world.RealWorld` and runs the
scenario's own per-rank program. Everything it has to say goes to
``rank-N.jsonl`` in the run directory, flushed line by line, so the parent can
read it even after killing the process. Marker files (``rank-N.ready``,
``rank-N.done``) let the parent watch progress with a ``stat``.

A rank that finished stays alive until the parent releases it, as a real
worker would stay in its serving loop: a peer stuck in a collective then
really hangs (until the group's timeout), instead of failing fast on a closed
connection. It asks the kernel to kill it if the parent dies, so no rank
outlives the lane; it ends with ``os._exit`` so that no teardown (of process
groups whose peers may be gone) can hang it.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, Self

#: Exit statuses the parent tells apart.
EXIT_DONE, EXIT_SETUP = 0, 3
_PR_SET_PDEATHSIG = 1


class JobFile:
    """A rank's job as a JSON file in the run directory, beside its log: the
    parent writes it, the rank's process reads it back (both lanes' jobs)."""

    rank: int
    run_dir: str

    def path(self, suffix: str) -> Path:
        return Path(self.run_dir) / f"rank-{self.rank}.{suffix}"

    def write(self) -> Path:
        path = self.path("job.json")
        path.write_text(json.dumps(asdict(self)))  # type: ignore[call-overload]
        return path

    @classmethod
    def load(cls, path: Path) -> Self:
        made: Self = cls(**json.loads(path.read_text()))
        return made


@dataclass(frozen=True)
class RankJob(JobFile):
    rank: int
    ranks: int
    backend: str  # "gloo" or "nccl"
    vllm: str | None
    target_file: str | None
    case: dict[str, Any]
    run_dir: str
    timeout_s: float
    #: Bounds the rendezvous: ranks start minutes apart on a loaded host.
    startup_s: float
    step_budget: int
    parent_pid: int
    #: The runner whose sync runs (None: the target's default) and, V1 only,
    #: the file its caller method comes from.
    runner: str | None = None
    caller_file: str | None = None


def main(argv: list[str]) -> None:
    job = RankJob.load(Path(argv[1]))
    run_rank(job)


def run_rank(job: RankJob) -> None:
    die_with_parent(job.parent_pid)
    with job.path("jsonl").open("w") as stream:
        code = _run(job, stream)
    os._exit(code)


def _run(job: RankJob, stream: Any) -> int:
    # Imports here, not at module level: the parent imports this module too,
    # and the heavy part belongs to the child's start-up.
    from dpsim.replay.world import RankLog

    log = RankLog(stream)
    try:
        setup = _set_up(job, log)
    except BaseException as error:
        log.write(setup_error=f"{type(error).__name__}: {error}"[:1000])
        job.path("done").touch()
        return EXIT_SETUP
    program, setting, case, world = setup
    from dpsim.sim.scheduler import StepBudgetExceeded, describe_exception
    from dpsim.targets import runtime

    with runtime.installed(world):
        try:
            returned = program(setting, case, job.rank)
        except StepBudgetExceeded:
            log.write(budget=world.steps)
        except BaseException as error:
            log.write(raised=describe_exception(error).to_dict(), steps=world.steps)
        else:
            log.write(finished=returned, steps=world.steps)
    job.path("done").touch()
    linger(job)
    return EXIT_DONE


def _set_up(job: RankJob, log: Any) -> tuple[Any, Any, Any, Any]:
    warnings.filterwarnings("ignore")  # torch's deprecation notes, once per rank
    import torch

    from dpsim.records.case import Case
    from dpsim.scenarios.programs import PROGRAMS
    from dpsim.scenarios.run import setting_for
    from dpsim.targets import load_target

    torch.set_num_threads(1)  # N ranks share the host's cores
    target = load_target(
        job.vllm, job.target_file, runner=job.runner, caller_file=job.caller_file
    )
    case = Case.from_dict(job.case)
    setting = setting_for(target, case)
    world = join_groups(job, log)
    log.write(
        ready={
            "pid": os.getpid(),
            "files": {loaded.module: loaded.sha256 for loaded in target.files},
        }
    )
    job.path("ready").touch()
    return PROGRAMS[case.scenario], setting, case, world


class GroupJob(Protocol):
    """What joining the lane's process groups needs to know of a rank's job."""

    @property
    def rank(self) -> int: ...
    @property
    def ranks(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def startup_s(self) -> float: ...
    @property
    def step_budget(self) -> int: ...


def join_groups(job: GroupJob, log: Any, extra: tuple[str, ...] = ()) -> Any:
    """Join the default process groups (and the ``extra`` ones, all members,
    on gloo) through the run directory's file store; the rank's
    :class:`~dpsim.replay.world.RealWorld` over them."""
    import torch
    import torch.distributed as dist

    from dpsim.records.groups import (
        DP_CPU_GROUP,
        DP_DEVICE_GROUP,
        EP_GROUP,
        WORLD_GROUP,
    )
    from dpsim.replay.world import RealWorld
    from dpsim.sim import DEFAULT_STEP_BUDGET

    timeout = datetime.timedelta(seconds=job.timeout_s)
    cpu = torch.device("cpu")
    if job.backend == "nccl":
        torch.cuda.set_device(job.rank)
        device = torch.device("cuda", job.rank)
        world_backend, device_backend = "cpu:gloo,cuda:nccl", "nccl"
    else:
        device, world_backend, device_backend = cpu, "gloo", "gloo"
    # The store's waits take the default group's timeout: the start-up
    # allowance, since the hang timeout can be shorter than a rank's start-up.
    # The groups collectives run on get the hang timeout.
    dist.init_process_group(
        world_backend,
        init_method=f"file://{Path(job.run_dir) / 'store'}",
        rank=job.rank,
        world_size=job.ranks,
        timeout=datetime.timedelta(seconds=job.startup_s),
    )
    members = list(range(job.ranks))
    groups = {}
    devices = {}
    # As vLLM: the DP sync's cpu_group is gloo whatever the device backend.
    # "world" is a group of everyone with the hang timeout; targets asking
    # for dist.group.WORLD get it (RecordingDist.group).
    for name, backend, where in (
        (WORLD_GROUP, "gloo", cpu),
        (DP_CPU_GROUP, "gloo", cpu),
        (DP_DEVICE_GROUP, device_backend, device),
        (EP_GROUP, device_backend, device),
        *((name, "gloo", cpu) for name in extra),
    ):
        groups[name] = dist.new_group(members, backend=backend, timeout=timeout)
        devices[name] = where
    return RealWorld(
        job.rank,
        job.ranks,
        groups,
        devices,
        log,
        job.step_budget or DEFAULT_STEP_BUDGET,
    )


def linger(job: Any) -> None:
    release = Path(job.run_dir) / "release"
    # Bounded, should the parent never release us; it kills us before then.
    deadline = time.monotonic() + job.timeout_s + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def die_with_parent(parent_pid: int) -> None:
    """Linux: be SIGKILLed when the parent dies, so no rank is ever orphaned."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the parent's reaping is the only guard
    if os.getppid() != parent_pid:
        os._exit(EXIT_SETUP)  # the parent died before we could ask


if __name__ == "__main__":
    main(sys.argv)
