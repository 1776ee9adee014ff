"""The coordinator of a fuzzing campaign: N worker processes, one database.

The search itself is Hypothesis' (see :mod:`dpsim.fuzz.worker`); what is
added here is what a long run needs: one process per core, a shared example
database (so a failure one worker finds is replayed by all, and a fleet on
Redis shares it across machines), a live tally, and a clean stop at the
deadline or on Ctrl-C that lets a shrink in progress finish and write its
counterexample file before anything is killed.
"""

from __future__ import annotations

import queue as queues
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from dpsim import processes
from dpsim.database import open_database, probe
from dpsim.errors import UsageError
from dpsim.fuzz import worker
from dpsim.lanes.runner.suite import RUNNER_LANE_TEST
from dpsim.properties import PROPERTY_NAMES, RUNNER_LANE_PROPERTIES
from dpsim.scenarios.generate import scenarios_for
from dpsim.suite.config import SuiteConfig, SuiteOptions, resolve

#: Seconds a worker may take, once told to stop, to finish the shrink it is in.
DEFAULT_GRACE = 60.0
#: Seconds a worker that said it is done has to exit, and a worker has
#: between SIGTERM and SIGKILL.
_EXIT_WAIT_S = 5.0
DEFAULT_BATCH = 100


@dataclass(frozen=True)
class CampaignOptions:
    suite: SuiteOptions
    database: str
    workers: int
    #: Scenarios to fuzz; empty means every one the target runs.
    scenarios: tuple[str, ...] = ()
    #: Seconds to run; None runs until interrupted.
    duration: float | None = None
    batch: int = DEFAULT_BATCH
    grace: float = DEFAULT_GRACE
    #: Measure target coverage in every worker (``--coverage``).
    coverage: bool = False


@dataclass(frozen=True)
class Failure:
    scenario: str
    property: str
    message: str
    path: Path | None


@dataclass
class Tally:
    """What the campaign has done so far; the status line renders it."""

    target: str
    workers: int
    scenarios: tuple[str, ...]
    started: float = field(default_factory=time.monotonic)
    duration: float | None = None
    examples: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    #: Why the campaign is stopping: "deadline", "interrupted", "finished".
    stopping: str | None = None
    #: The properties each scenario's cases are judged by (the lane's).
    properties: int = len(PROPERTY_NAMES)
    #: Each worker's target coverage (``to_json`` objects), with --coverage.
    coverage: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.examples.values())

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def checks(self) -> tuple[int, int]:
        """(scenario x property pairs still holding, pairs exercised)."""
        exercised = sum(1 for name in self.scenarios if self.examples.get(name))
        pairs = exercised * self.properties
        broken = {(failure.scenario, failure.property) for failure in self.failures}
        return pairs - len(broken), pairs


#: Called with a line worth keeping (a worker started, a failure found).
Announce = Callable[[str], None]


def run_campaign(
    options: CampaignOptions,
    announce: Announce,
    redraw: Callable[[Tally], None],
) -> Tally:
    """Fuzz until the deadline, Ctrl-C, or every scenario has failed."""
    if options.workers < 1:
        raise UsageError("--workers must be at least 1")
    if options.suite.lane == "runner":
        _refuse_for_runner_lane(options)
    suite = resolve(options.suite)
    # A release whose code does not fit is refused now, in one line, not by
    # every worker in turn.
    preflight_suite(suite)
    probe(open_database(options.database), options.database)
    available = (
        (RUNNER_LANE_TEST,) if suite.lane == "runner" else scenarios_for(suite.target)
    )
    for name in options.scenarios:
        if name not in available:
            raise UsageError(
                f"{suite.target.label} has no {name!r} scenario; "
                f"it runs: {', '.join(available)}"
            )
    scenarios = options.scenarios or available
    tally = Tally(suite.target.label, options.workers, scenarios)
    if suite.lane == "runner":
        tally.properties = len(RUNNER_LANE_PROPERTIES)
    tally.duration = options.duration
    messages: Any = processes.SPAWN.Queue()
    stop = processes.SPAWN.Event()
    plans = [
        worker.WorkerPlan(
            index,
            options.suite,
            options.database,
            scenarios,
            options.batch,
            coverage=options.coverage,
        )
        for index in range(options.workers)
    ]
    interrupts: list[float] = []

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        interrupts.append(time.monotonic())

    # Workers inherit "ignore SIGINT" across exec, so a Ctrl-C while they are
    # still importing cannot kill one half-started.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    children = []
    forced = True  # an exception in here stops the workers without waiting
    try:
        for plan in plans:
            children.append(
                processes.start(
                    worker.run_worker,
                    plan,
                    messages,
                    stop,
                    name=f"dpsim-fuzz-{plan.index}",
                )
            )
        signal.signal(signal.SIGINT, on_interrupt)
        tally.started = time.monotonic()
        forced = _coordinate(
            options, tally, messages, stop, children, interrupts, announce, redraw
        )
    finally:
        stop.set()
        processes.reap(
            children, patience=0.0 if forced else _EXIT_WAIT_S, grace=_EXIT_WAIT_S
        )
        signal.signal(signal.SIGINT, previous)
    while True:
        # Whatever workers said while being reaped.
        try:
            _handle(messages.get_nowait(), tally, announce)
        except queues.Empty:
            break
    return tally


def preflight_suite(suite: SuiteConfig) -> None:
    """The lane's pre-flight on the suite's target (see
    :func:`dpsim.scenarios.run.preflight`)."""
    if suite.lane == "runner":
        from dpsim.lanes.runner.run import preflight as runner_preflight

        runner_preflight(suite.target)
    else:
        from dpsim.scenarios.run import preflight

        preflight(suite.target)


def _refuse_for_runner_lane(options: CampaignOptions) -> None:
    """Refuse, before any worker starts, what the runner lane cannot fuzz: a
    sync-lane option, or a release the lane does not drive (one line)."""
    from dpsim.lanes.runner.commands import refuse_unmodelled, refuse_unsupported
    from dpsim.targets import parse_target

    suite = options.suite
    for given, flag in (
        (options.scenarios, "--scenario"),
        (suite.target, "--target"),
        (suite.caller_file, "--caller-file"),
        (suite.profile != "caller", "--profile"),
    ):
        if given:
            raise UsageError(f"fuzz --lane runner: {flag} is the sync lane's")
    suite.validate()
    refuse_unsupported(parse_target(suite.vllm, runner=suite.runner or "v2"))
    if suite.policy:
        from dpsim.capture.policy_files import load_policy

        refuse_unmodelled(load_policy(Path(suite.policy)), "--policy")


def _coordinate(
    options: CampaignOptions,
    tally: Tally,
    messages: Any,
    stop: Any,
    processes: list[Any],
    interrupts: list[float],
    announce: Announce,
    redraw: Callable[[Tally], None],
) -> bool:
    """Relay messages until every worker is done; True when stopped by force."""
    done: set[int] = set()
    stopped_at: float | None = None
    while len(done) < len(processes):
        try:
            message = messages.get(timeout=0.2)
        except queues.Empty:
            message = None
        if message is not None:
            if message[0] == worker.DONE:
                done.add(message[1])
            _handle(message, tally, announce)
        now = time.monotonic()
        if stopped_at is None:
            reason = None
            if interrupts:
                reason = "interrupted"
            elif (
                options.duration is not None
                and len(tally.pids) == tally.workers
                and tally.elapsed >= options.duration
            ):
                reason = "deadline"
            if reason is not None:
                tally.stopping = reason
                stopped_at = now
                stop.set()
                announce(
                    f"stopping ({reason}): letting workers finish what they shrink"
                )
        elif len(interrupts) > 1 or now - stopped_at > options.grace:
            if interrupts:
                # A Ctrl-C during the grace after the deadline cut shrinks short.
                tally.stopping = "interrupted"
            announce("stopping now: workers terminated")
            return True
        # A worker that died without saying so (killed, out of memory).
        for index, process in enumerate(processes):
            if index not in done and not process.is_alive() and messages.empty():
                done.add(index)
                tally.errors.append(
                    f"worker {index} exited with status {process.exitcode}"
                )
        redraw(tally)
    if tally.stopping is None:
        tally.stopping = "finished"
    return False


def _handle(message: tuple[Any, ...], tally: Tally, announce: Announce) -> None:
    kind, index = message[0], message[1]
    if kind == worker.STARTED:
        tally.pids.append(message[2])
        if len(tally.pids) == tally.workers:
            # The clock starts once every worker is ready: --for is fuzzing
            # time, not the seconds spent importing torch.
            tally.started = time.monotonic()
            pids = " ".join(str(pid) for pid in sorted(tally.pids))
            announce(f"{tally.workers} workers started (pids {pids})")
    elif kind == worker.EXAMPLES:
        scenario, count = message[2], message[3]
        tally.examples[scenario] = tally.examples.get(scenario, 0) + count
    elif kind == worker.FAILURE:
        scenario, name, path, text = message[2:6]
        failure = Failure(scenario, name, text, Path(path) if path else None)
        known = {(known.scenario, known.path) for known in tally.failures}
        # Several workers replay the same failure from the shared database and
        # shrink it to the same case: one finding, one file.
        if (scenario, failure.path) not in known:
            tally.failures.append(failure)
            announce(f"found: {text} [{scenario}] -> {path or 'no file written'}")
    elif kind == worker.COVERAGE:
        tally.coverage.append(message[2])
    elif kind == worker.ERROR:
        scenario, text = message[2], message[3]
        where = f"worker {index}" + (f", {scenario}" if scenario else "")
        tally.errors.append(f"{where}: {text}")
        announce(f"error in {where}: {text}")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h`` or ``1h30m`` as seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    cleaned = text.strip().lower()
    try:
        for char in cleaned:
            if char.isdigit() or char == ".":
                number += char
            elif char in units and number:
                total += float(number) * units[char]
                number = ""
            else:
                raise ValueError(char)
        if number:
            total += float(number)
    except ValueError:
        total = 0.0
    if total <= 0:
        raise UsageError(f"--for {text!r}: expected a duration such as 90s, 15m or 2h")
    return total
