"""Run a runner-lane case: every rank's real engine loop, worker, model runner
and speculator on the simulator, and the trace they leave.

Per rank, :func:`run_runner_case` builds the modelled scheduler over the
rank's request stream, the speculator the options select, the worker (the
real ``Worker`` over the real ``GPUModelRunner``) and the real
``DPEngineCoreProc`` with its input mailbox, all sharing one coordinator
model; the rank's sync recorder (:func:`~dpsim.lanes.runner.syncs.recording_sync`)
is what the runner's and the speculator's ``dispatch_cg_and_sync_dp`` is. It
then simulates the ranks with the engines' own DP group (``engine_dp``)
declared beside the default groups, the coordinator delivering shutdowns when
every engine is idle. This module judges nothing; properties judge the trace.

Everything runs inside :func:`~dpsim.lanes.runner.strict.collect_gaps`: a
stand-in asked something it was not written for logs a gap, and any gap
refuses the run (:class:`~dpsim.errors.TargetError`, one line naming the
first) whatever vLLM did with the exception, so a case the lane cannot model
never gets a verdict. The result carries, for every rank that did not finish,
the vLLM stack it stood at when the run ended (innermost first), which
reports print beside a verdict.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dpsim import allowances
from dpsim.boundary import fault_of
from dpsim.errors import BoundaryError, TargetError
from dpsim.records.groups import ENGINE_DP_GROUP
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import RUNNER_EVENT
from dpsim.records.trace import SimResult
from dpsim.scenarios.ranks import record
from dpsim.sim import simulate
from dpsim.sim.mailbox import Mailbox, Quiescence
from dpsim.targets.load import Target
from dpsim.targets.spec import TargetSpec
from dpsim.terminal import printable

from . import heap
from .case import RunnerCase
from .stream import EngineOptions, RankStream, RequestScript
from .strict import ModelGap, collect_gaps
from .syncs import Phases, recording_sync
from .where import vllm_stack

#: The mailbox an engine's input queue reads, as a parked rank's trace names it.
INPUT_MAILBOX = "input queue"
#: Steps (ticks plus collectives) a rank may take per engine-loop iteration
#: the case can need, far above what the real loop takes: over 300 drawn
#: 4-rank cases a whole run took at most 335 steps per rank on 0.33.0 and 717
#: on 0.29.0 (whose engine steps until its fixed 32-step all-reduce).
STEPS_PER_ITERATION = 100
#: Iterations after the last work before a wave must have ended: every rank
#: all-reduces its unfinished state at least every 32 steps (0.29's fixed
#: interval; later releases' ``dp_sync_interval`` is checked too).
WAVE_END_ITERATIONS = 32
#: The least budget a rank gets, whatever its case: 14 times the most a
#: drawn case's whole run took.
MIN_STEP_BUDGET = 10_000


def step_budget_for(case: RunnerCase) -> int:
    """The steps a rank of ``case`` may take before it is stopped as spinning.

    Scaled to the case, so a large hand-written stream is never cut short
    while a loop that never ends (an engine whose wave never completes) is
    stopped in seconds rather than minutes: one iteration per prompt token,
    output token and KV-wait step of every request a rank serves (more than
    the real loop needs: prompts are chunked), plus its last arrival and the
    end of a wave.
    """
    wave_end = 2 * max(WAVE_END_ITERATIONS, case.options.dp_sync_interval)
    iterations = max(
        sum(
            request.prompt_len + request.output_len + request.kv_wait
            for request in stream.requests
        )
        + max((request.arrival for request in stream.requests), default=0)
        for stream in case.streams
    )
    return MIN_STEP_BUDGET + STEPS_PER_ITERATION * (iterations + wave_end)


def v2_recorder(target: Target) -> Any:
    """A rank's sync recorder on the V2 runner: the release's real
    ``dispatch_cg_and_sync_dp``, recorded (shared by the rank's runner and
    speculator, it numbers that rank's forward steps)."""
    return recording_sync(target, _real_sync(target), Phases())


@dataclass(frozen=True)
class Builders:
    """How a run builds each rank's parts: the lane's own modules by default
    (:func:`default_builders`); tests put small fakes in their place.

    ``sync(target)`` makes a rank's sync recorder, handed to its
    ``speculator`` and ``worker`` builders (None where the worker records
    its own, as the V1 runner's does).
    """

    sources: Callable[[Target], Any]
    scheduler: Callable[..., Any]
    speculator: Callable[..., Any]
    worker: Callable[..., Any]
    engine: Callable[..., Any]
    run_engine: Callable[[Any], None]
    coordinator: Callable[[Any, Sequence[Mailbox]], Any]
    sync: Callable[[Target], Any] = v2_recorder


def default_builders(runner: str = "v2") -> Builders:
    """The lane's parts for ``runner``'s model runner: the modelled
    scheduler, the real engine loop and the coordinator model are the same
    for both; the worker, model runner and drafter are V2's
    (:mod:`.worker`, :mod:`.speculators`) or V1's (:mod:`.v1`)."""
    from .engine import build_engine, coordinator_for, run_engine
    from .scheduler import ModelledScheduler
    from .speculators import build_speculator
    from .worker import build_worker

    shared = Builders(
        sources=sources_for,
        scheduler=ModelledScheduler,
        speculator=build_speculator,
        worker=build_worker,
        engine=build_engine,
        run_engine=run_engine,
        coordinator=coordinator_for,
    )
    if runner == "v1":
        return replace(
            shared, speculator=_v1_proposer_factory, worker=_v1_worker, sync=_no_sync
        )
    return shared


def _no_sync(target: Target) -> None:
    """The V1 worker makes its rank's recorder itself (V1's sync is
    ``coordinate_batch_across_dp``, called by its runner and drafter)."""
    return None


def _v1_proposer_factory(
    sources: Any,
    options: Any,
    policy: Any,
    rank: int,
    dp_size: int,
    *,
    target: Target,
    sync: Any,
) -> Callable[[Any], Any]:
    """What the V1 worker calls with its runner's kit to make the rank's
    drafter (:func:`~dpsim.lanes.runner.v1.proposer.build_v1_proposer`,
    None without a speculator)."""
    from .v1.proposer import build_v1_proposer

    return functools.partial(build_v1_proposer, sources, options, policy, rank, dp_size)


def _v1_worker(
    sources: Any,
    options: Any,
    policy: Any,
    rank: int,
    dp_size: int,
    *,
    speculator: Callable[[Any], Any],
    sync: Any,
) -> Any:
    """Rank ``rank``'s real V1 ``Worker`` over its real V1 ``GPUModelRunner``
    (:func:`~dpsim.lanes.runner.v1.build_v1_worker`), its drafter made by
    ``speculator``."""
    from .v1 import build_v1_worker

    return build_v1_worker(sources, options, policy, rank, dp_size, speculator)


@functools.lru_cache(maxsize=16)
def _sources_of(spec: TargetSpec) -> Any:
    from .sources import RunnerSources

    return RunnerSources.for_spec(spec)


def sources_for(target: Target) -> Any:
    """The target's runner-lane sources, made once per target spec: the
    classes the parts rebuild from them are cached on them, and a campaign
    runs thousands of cases on one target."""
    sources = _sources_of(target.spec)
    if sources.loaded_target is None:
        sources.loaded_target = target  # the parts share this target's enums
    return sources


@dataclass(frozen=True)
class RunnerResult:
    """A runner-lane run: the simulator's trace and where each rank stood."""

    result: SimResult
    #: Per rank, the vLLM stack (innermost first, "file:line in function")
    #: it stood at when the run ended; empty for a rank that finished.
    stood_at: tuple[tuple[str, ...], ...] = field(default=())

    def where(self, rank: int) -> str | None:
        """The innermost vLLM line rank ``rank`` stood at, if it stood in vLLM."""
        stack = self.stood_at[rank] if rank < len(self.stood_at) else ()
        return stack[0] if stack else None


def run_runner_case(
    target: Target,
    case: RunnerCase,
    *,
    builders: Builders | None = None,
    step_budget: int | None = None,
) -> RunnerResult:
    """Simulate ``case`` on ``target`` through the release's real callers.

    Raises :class:`~dpsim.errors.BoundaryError` (a :class:`TargetError`)
    when the lane cannot drive the target (a part refuses the release, any
    stand-in was asked what it does not know, or a rank raised from dpsim's
    side of the boundary, :mod:`dpsim.boundary`): never a verdict on a run
    the lane could not model.
    """
    if target.runner != case.runner:
        raise TargetError(
            f"runner lane: the case drives the {case.runner.upper()} model runner, "
            f"but {target.label} was loaded for the {target.runner.upper()} runner"
        )
    parts = builders or default_builders(case.runner)
    allowances.case_started()
    dp_size = case.dp_size
    stood: dict[int, tuple[str, ...]] = {}
    with collect_gaps() as gaps, torch.random.fork_rng(devices=[]):
        # The CPU generator only (the lane runs CPU tensors): torch.manual_seed
        # also queues a lazy seeding of every accelerator, with a formatted
        # stack each, on every case.
        torch.default_generator.manual_seed(case.seed)
        try:
            programs, on_quiescent = _programs(target, case, parts, stood)
            result = simulate(
                programs,
                ranks=dp_size,
                groups={ENGINE_DP_GROUP: tuple(range(dp_size))},
                step_budget=step_budget or step_budget_for(case),
                on_quiescent=on_quiescent,
            )
        except (TargetError, ModelGap) as refused:
            # A part refused the release, or a stand-in was asked something
            # while the ranks' parts were being built.
            raise _refusal(target, str(refused), gaps) from refused
        except Exception as error:
            # Building a rank's parts is dpsim calling vLLM with what it made:
            # whatever raised there, the lane could not drive the release.
            said = str(fault_of(error) or _raised(error))
            raise _refusal(target, said, gaps) from error
    heap.settle()
    if gaps:
        raise _refusal(target, gaps[0], gaps)
    for trace in result.ranks:
        if trace.error is not None and trace.error.type in _REFUSALS:
            # A part refused the release from inside a rank's program.
            raise _refusal(target, trace.error.message, gaps)
        if trace.error is not None and trace.error.fault is not None:
            # dpsim's side of the boundary raised in a rank (dpsim.boundary).
            raise _refusal(
                target, f"rank {trace.rank} raised {trace.error.fault}", gaps
            )
    return RunnerResult(result, tuple(stood.get(rank, ()) for rank in range(dp_size)))


def preflight(target: Target) -> None:
    """Drive ``target`` once before any case is generated: two ranks' parts
    built for a plain engine and policy, one serving a short request while
    the other idles. A release whose code does not fit what the lane knows is
    then refused in one line (:class:`~dpsim.errors.BoundaryError`) before a
    search starts; the run's verdict is not looked at."""
    from .check import fitted

    options = EngineOptions()
    streams = (
        RankStream(
            (RequestScript("preflight", arrival=0, prompt_len=2, output_len=2),)
        ),
        RankStream(()),
    )
    policy = fitted(CapturePolicy(capture_sizes=(1, 2, 4, 8)), options)
    run_runner_case(target, RunnerCase(policy, options, streams, runner=target.runner))


#: Exceptions that, raised in a rank, mean the lane could not drive vLLM.
_REFUSALS = frozenset({"TargetError", "ModelGap", "BoundaryError"})


def _raised(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def _refusal(target: Target, first: str, gaps: Sequence[str]) -> BoundaryError:
    """The one-line refusal of a run: ``first`` and how many gaps more. A
    :class:`~dpsim.errors.BoundaryError`, so a search stops at it at once."""
    more = len(gaps) - 1 if gaps and gaps[0] == first else len(gaps)
    tail = f" (and {more} more gaps)" if more > 0 else ""
    text = first.removeprefix("runner lane: ")
    return BoundaryError(
        printable(f"runner lane cannot drive {target.label}: {text}{tail}")
    )


def _programs(
    target: Target,
    case: RunnerCase,
    parts: Builders,
    stood: dict[int, tuple[str, ...]],
) -> tuple[list[Callable[[int], Any]], Callable[[Quiescence], bool]]:
    """One program per rank (each rank's parts built before the run starts),
    and the run's quiescence callback, which also notes where ranks stood."""
    sources = parts.sources(target)
    mailboxes = [Mailbox(rank, INPUT_MAILBOX) for rank in range(case.dp_size)]
    coordinator = parts.coordinator(sources, mailboxes)
    engines = [
        build_rank(target, case, rank, mailboxes[rank], coordinator, parts, sources)
        for rank in range(case.dp_size)
    ]

    def program(rank: int) -> None:
        mark_runner(case.runner)
        parts.run_engine(engines[rank])

    def on_quiescent(now: Quiescence) -> bool:
        if coordinator.on_quiescent(now):
            return True
        for rank in now.blocked:
            stood[rank] = vllm_stack(now.frame(rank))
        return False

    return [program] * case.dp_size, on_quiescent


def mark_runner(runner: str) -> None:
    """Say first in the running rank's trace that the V1 runner made it, as
    the sync lane's V1 ranks do: properties judge a trace without the mark
    as V2's (V1's eager descriptors, for one, carry no request count)."""
    if runner == "v1":
        record(RUNNER_EVENT, {"runner": "v1"})


def build_rank(
    target: Target,
    case: RunnerCase,
    rank: int,
    mailbox: Any,
    coordinator: Any,
    parts: Builders,
    sources: Any,
) -> Any:
    """Rank ``rank``'s engine over its scheduler, speculator and worker, its
    input read from ``mailbox``, its outputs going to ``coordinator``: the
    simulator's and the real-process lane's (:mod:`dpsim.lanes.runner.processes`)
    one way of making a rank."""
    options, policy, dp_size = case.options, case.policy, case.dp_size
    stream = case.streams[rank]
    # One recorder per rank, shared by its runner and its speculator: it
    # numbers that rank's forward steps.
    sync = parts.sync(target)
    speculator = parts.speculator(
        sources, options, policy, rank, dp_size, target=target, sync=sync
    )
    worker = parts.worker(
        sources, options, policy, rank, dp_size, speculator=speculator, sync=sync
    )
    scheduler = parts.scheduler(stream, options, sources)
    return parts.engine(
        sources,
        options,
        scheduler,
        worker,
        rank,
        dp_size,
        mailbox,
        coordinator,
        stream=stream,
    )


def _real_sync(target: Target) -> Callable[..., Any]:
    """The release's real ``dispatch_cg_and_sync_dp``, as the sync lane loaded it."""
    api = target.api
    if api.entry != "dispatch_cg_and_sync_dp":
        raise TargetError(
            f"runner lane: {target.label}'s dp_utils has no dispatch_cg_and_sync_dp "
            f"(it has {api.entry}), which the V2 runner lane's callers call"
        )
    return api._sync  # type: ignore[attr-defined]
