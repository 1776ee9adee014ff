"""One rank of the runner lane on real processes: a real process, one real engine.

Started as ``python -m dpsim.lanes.runner.rank_process JOB.json`` by
:mod:`dpsim.lanes.runner.processes`, as the sync lane's ranks are
(:mod:`dpsim.replay.worker`, whose group set-up, log, markers and lingering
this shares). It loads the target, builds its rank's parts with the very
builders the simulator uses (:func:`~dpsim.lanes.runner.run.build_rank`), its
input mailbox and coordinator relayed to the parent over a pipe
(:mod:`dpsim.lanes.runner.relay`; its looks at its input follow the
simulated rank's, :mod:`dpsim.lanes.runner.schedule`), joins real gloo groups (the sync lane's
four plus the engines' own ``engine_dp``) and runs the release's real
``DPEngineCoreProc.run_busy_loop`` until it exits on shutdown.

Its log line ``gaps`` lists what any stand-in was asked and did not know: the
parent refuses such a run, as the simulator does. The parent's ``stop`` (the
run ended while this rank waited for input) leaves the ``parked`` event the
simulator leaves, and no ending: the rank is waiting.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from dpsim.replay.worker import (
    EXIT_DONE,
    EXIT_SETUP,
    JobFile,
    die_with_parent,
    linger,
)


@dataclass(frozen=True)
class RunnerRankJob(JobFile):
    """What one rank's process is told (a JSON file in the run directory)."""

    rank: int
    ranks: int
    backend: str
    #: The target as ``parse_target`` takes it (``--vllm``, ``--target``).
    vllm: str
    dp_utils_file: str | None
    case: dict[str, Any]
    run_dir: str
    timeout_s: float
    startup_s: float
    step_budget: int
    parent_pid: int
    #: This process's end of its duplex pipe to the parent (an inherited
    #: file descriptor).
    relay_fd: int
    #: The simulated rank's looks at its input queue (see
    #: :mod:`dpsim.lanes.runner.schedule`): this rank's looks follow them.
    looks: list[int]


def main(argv: list[str]) -> None:
    job = RunnerRankJob.load(Path(argv[1]))
    die_with_parent(job.parent_pid)
    with job.path("jsonl").open("w") as stream:
        code = _run(job, stream)
    os._exit(code)


def _run(job: RunnerRankJob, stream: Any) -> int:
    import torch

    from dpsim.lanes.runner.strict import collect_gaps
    from dpsim.replay.world import RankLog

    log = RankLog(stream)
    with collect_gaps() as gaps, torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.case["seed"])
        try:
            engine, world = _set_up(job, log)
        except BaseException as error:
            log.write(setup_error=f"{type(error).__name__}: {error}"[:1000])
            job.path("done").touch()
            return EXIT_SETUP
        _run_engine(engine, world, log, job.case.get("runner", "v2"))
        if gaps:
            log.write(gaps=list(gaps))
    job.path("done").touch()
    linger(job)
    return EXIT_DONE


def _set_up(job: RunnerRankJob, log: Any) -> tuple[Any, Any]:
    warnings.filterwarnings("ignore")  # torch's deprecation notes, once per rank
    import torch

    from dpsim.lanes.runner.case import RunnerCase
    from dpsim.lanes.runner.engine import engine_classes
    from dpsim.lanes.runner.relay import RelayCoordinator, RelayMailbox
    from dpsim.lanes.runner.run import INPUT_MAILBOX, build_rank, default_builders
    from dpsim.records.groups import ENGINE_DP_GROUP
    from dpsim.replay.worker import join_groups
    from dpsim.targets import load_spec, parse_target

    torch.set_num_threads(1)  # N ranks share the host's cores
    case = RunnerCase.from_dict(job.case)
    target = load_spec(parse_target(job.vllm, job.dp_utils_file, runner=case.runner))
    parts = default_builders(case.runner)
    sources = parts.sources(target)
    mailbox = RelayMailbox(Connection(job.relay_fd), INPUT_MAILBOX, job.looks)
    coordinator = RelayCoordinator(
        mailbox, front_end_wakes=engine_classes(sources).front_end_wakes
    )
    engine = build_rank(target, case, job.rank, mailbox, coordinator, parts, sources)
    world = join_groups(job, log, extra=(ENGINE_DP_GROUP,))
    engine.dp_group = world.group(ENGINE_DP_GROUP)
    log.write(
        ready={
            "pid": os.getpid(),
            "files": {loaded.module: loaded.sha256 for loaded in target.files},
        }
    )
    job.path("ready").touch()
    return engine, world


def _run_engine(engine: Any, world: Any, log: Any, runner: str) -> None:
    """The engine's real busy loop, as :func:`~dpsim.lanes.runner.engine.run_engine`
    runs it (its ``SystemExit`` after a requested shutdown is the normal end),
    on this process's groups, the trace marked with ``runner`` as the
    simulator's is."""
    from dpsim.lanes.runner.relay import Stopped
    from dpsim.lanes.runner.run import INPUT_MAILBOX, mark_runner
    from dpsim.sim.mailbox import PARKED_EVENT
    from dpsim.sim.scheduler import StepBudgetExceeded, describe_exception
    from dpsim.targets import runtime

    with runtime.installed(world):
        mark_runner(runner)
        try:
            with contextlib.suppress(SystemExit):
                engine.run_busy_loop()
        except Stopped:
            world.record(PARKED_EVENT, {"mailbox": INPUT_MAILBOX})
        except StepBudgetExceeded:
            log.write(budget=world.steps)
        except BaseException as error:
            log.write(raised=describe_exception(error).to_dict(), steps=world.steps)
        else:
            log.write(finished=None, steps=world.steps)


if __name__ == "__main__":
    main(sys.argv)
