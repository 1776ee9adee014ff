"""One fuzzing worker: the suite's own Hypothesis tests, run again and again.

Each round runs one scenario's test (the very function pytest runs, under the
same database key; under ``--lane runner`` the runner lane's one test,
``runner-lane``, as ``pytest --dpsim-lane runner`` runs it) for a batch of examples with a fresh random seed, so every
round replays the shared database first and then explores new cases. A
scenario that fails is done for this campaign, as a failing test is done for
HypoFuzz: replaying a known failure forever would find nothing new.
"""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import ExampleDatabase

from dpsim.boundary import SearchStopped
from dpsim.collector import frozen_heap
from dpsim.coverage import suite as coverage_suite
from dpsim.database import open_database
from dpsim.lanes.runner.suite import runner_lane_test
from dpsim.properties import Verdict
from dpsim.suite.build import PropertyFailed, scenario_test
from dpsim.suite.config import SuiteConfig, SuiteOptions, resolve

#: Messages a worker sends, as tuples whose first item is one of these.
STARTED, EXAMPLES, FAILURE, ERROR, DONE, COVERAGE = (
    "started",
    "examples",
    "failure",
    "error",
    "done",
    "coverage",
)


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    suite: SuiteOptions
    database: str
    scenarios: tuple[str, ...]
    batch: int
    #: Measure target coverage (``fuzz --coverage``); sent once, at the end.
    coverage: bool = False


class _Stop(BaseException):
    """Raised inside a test to end a round early. A BaseException, so that
    Hypothesis lets it through instead of taking it for a failure."""


def run_worker(plan: WorkerPlan, queue: Queue[Any], stop: Event) -> None:
    """The body of a worker process (spawned; never returns an error)."""
    # Ctrl-C reaches the whole process group; the coordinator alone decides
    # when workers stop, so a shrink in progress can finish and be written.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _fuzz(plan, queue, stop)
    except BaseException as error:  # reported, never raised: the queue is the API
        queue.put((ERROR, plan.index, None, _describe(error)))
    finally:
        queue.put((DONE, plan.index))


def _fuzz(plan: WorkerPlan, queue: Queue[Any], stop: Event) -> None:
    suite = resolve(plan.suite)
    database = open_database(plan.database)
    queue.put((STARTED, plan.index, os.getpid()))
    if not (plan.coverage and suite.lane == "sync"):
        _rounds(plan, suite, database, queue, stop)
        return
    with coverage_suite.measuring(suite.target) as measurement:
        _rounds(plan, suite, database, queue, stop)
    version = suite.target.version
    queue.put((COVERAGE, plan.index, measurement.result(version).to_json()))


def _rounds(
    plan: WorkerPlan,
    suite: SuiteConfig,
    database: ExampleDatabase | None,
    queue: Queue[Any],
    stop: Event,
) -> None:
    live = list(plan.scenarios)
    # Workers start on different scenarios so that all are covered early.
    turn = plan.index
    while live and not stop.is_set():
        scenario = live[turn % len(live)]
        turn += 1
        outcome = _round(plan, suite, database, scenario, queue, stop)
        if outcome is not None:
            live.remove(scenario)


def _round(
    plan: WorkerPlan,
    suite: SuiteConfig,
    database: ExampleDatabase | None,
    scenario: str,
    queue: Queue[Any],
    stop: Event,
) -> str | None:
    """Run one batch of ``scenario``; the reason it is done, or None."""
    state = {"pending": 0, "failing": False}

    def observe(name: str, verdicts: tuple[Verdict, ...]) -> None:
        state["pending"] += 1
        if verdicts:
            state["failing"] = True
        if state["pending"] >= 10:
            queue.put((EXAMPLES, plan.index, name, state["pending"]))
            state["pending"] = 0
        # Stop between examples, but never once a failure is being shrunk:
        # its counterexample file is written only at the end.
        if stop.is_set() and not state["failing"]:
            raise _Stop

    config = settings(
        max_examples=plan.batch,
        database=database,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        # The file and the table are the report; explaining costs ~100 runs.
        phases=(Phase.reuse, Phase.generate, Phase.shrink),
        # The coordinator reports failures; Hypothesis' own printing would
        # interleave N workers' output with the status line.
        verbosity=Verbosity.quiet,
    )
    test = (
        runner_lane_test(
            config, lambda: suite, plan.suite.database_key(scenario), observe=observe
        )
        if suite.lane == "runner"
        else scenario_test(
            scenario,
            config,
            lambda: suite,
            plan.suite.database_key(scenario),
            observe=observe,
        )
    )
    try:
        # A round searches like a check: the heap it starts with is kept out
        # of the collector's full collections (dpsim.collector).
        with frozen_heap():
            test()
    except _Stop:
        return None
    except SearchStopped as stopped:
        # dpsim could not drive a case: no verdict, and the next would not either.
        queue.put((ERROR, plan.index, scenario, str(stopped.error)))
        return "error"
    except PropertyFailed as failure:
        verdict = failure.verdicts[0]
        queue.put(
            (
                FAILURE,
                plan.index,
                scenario,
                verdict.property,
                str(failure.written) if failure.written else None,
                str(verdict),
            )
        )
        return "failed"
    except Exception as error:
        queue.put((ERROR, plan.index, scenario, _describe(error)))
        return "error"
    finally:
        if state["pending"]:
            queue.put((EXAMPLES, plan.index, scenario, state["pending"]))
    return None


def _describe(error: BaseException) -> str:
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip().splitlines()[-1][:300]
