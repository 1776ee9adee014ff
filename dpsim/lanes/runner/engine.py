"""vLLM's real DP engine loop on a virtual rank.

Each rank runs the release's own ``DPEngineCoreProc.run_busy_loop``
(``vllm/v1/engine/core.py``, every release 0.12.0 to 0.34.0), rebuilt by
:func:`~dpsim.lanes.runner.extract.real_class` from three real classes chained
as in vLLM (``EngineCore`` <- ``EngineCoreProc`` <- ``DPEngineCoreProc``), so
``super()`` reaches the real parent methods. What runs for real:

* ``DPEngineCoreProc``: ``run_busy_loop`` (the dummy-batch decision, the wave
  bookkeeping; ``while True`` through 0.17, ``while self._handle_shutdown()``
  from 0.18), ``_has_global_unfinished_reqs`` over the real
  ``ParallelConfig.sync_dp_state`` (0.21+; 0.30+: at step 1 and every
  ``dp_sync_interval`` steps, before: every 32 steps; through 0.32 a
  staticmethod calling ``torch.distributed.all_reduce``, 0.33 a method of the
  engine's ``parallel_config`` calling ``cpu_all_reduce_``) or, 0.12-0.20,
  ``ParallelConfig.has_unfinished_dp`` (a MAX all-reduce every 32 steps),
  ``add_request`` and
  ``_handle_client_request`` (START_DP_WAVE), ``_maybe_publish_request_counts``
  (``publish_dp_lb_stats`` is False), ``_should_throttle_prefills``;
* ``EngineCoreProc``: ``has_work`` (0.17+), ``is_running`` (0.18+),
  ``_process_input_queue`` (0.34: the inputs deferred during the last step
  first), ``_process_engine_step``, ``_handle_shutdown``
  (0.18+), ``_handle_client_request`` (ADD, WAKEUP), its checks whether to
  reject a request (0.18+: shutting down; 0.33+: paused),
  ``_notify_idle_state_callbacks`` (0.17+), ``_wait_for_output`` (0.34+: a
  step's wait for its model output, which with a pollable future handles
  ADD, ABORT and WAKEUP inputs meanwhile and defers the others);
* ``EngineCore``: ``step``, ``step_with_batch_queue`` (async scheduling: a
  batch queue of 2, as ``VllmConfig.max_concurrent_batches`` gives without
  PP), ``post_step``, ``add_request``, ``execute_dummy_batch``,
  ``_process_aborts_queue`` (0.13+), ``_log_err_callback`` (0.12-0.13),
  ``log_iteration_details`` (0.14-0.25) or ``capture_iteration_details``
  (0.26+), context managers that only yield with stats logging off, and the
  ``_attach_*`` helpers (0.26+).

Which of these a release has is read from its files; a method the kept code
calls that the release lacks would be a gap (the engine is strict).

The unfinished-requests all-reduce runs on the sim group
:data:`~dpsim.records.groups.ENGINE_DP_GROUP`, the engine's own stateless DP
group in vLLM (``stateless_init_dp_group``), apart from the model runner's
``dp_cpu``. 0.33's ``cpu_all_reduce_`` (recursive doubling over gloo
point-to-point) is stood in for by one SUM all-reduce on that group: the
same in-place result on every member, which is what the function promises.

Stood in (strict: anything else they are asked is a gap):

* the executor (:class:`Executor`): vLLM's ``UniProcExecutor`` calls the
  rank's worker synchronously and wraps the result in a completed
  ``Future``; so does this, calling the lane's worker (D's
  ``build_worker``); ``is_sleeping`` is False. With ``executor="mp"``
  (``MultiprocExecutor``, a DP deployment's default backend) its futures
  keep the worker's errors and can be polled: a step lasts until the
  requests due at the next iteration have arrived (sent then, not at that
  iteration's input poll), so 0.34's ``_wait_for_output`` adds them mid-step;
  before 0.34 the engine only asks for the result, as with ``uni``;
* the input queue (:class:`InputQueue`): a ``queue.Queue`` look-alike over the
  rank's :class:`~dpsim.sim.mailbox.Mailbox`, fed by the coordinator model
  (START_DP_WAVE, shutdown) and by the rank's request stream. Arrival rule: a
  request due at rank-local loop iteration ``k`` (counted from 0 at each
  pass of the loop's ``while self._handle_shutdown()``) is sent before that
  iteration's input poll; a rank that would block with nothing in its queue
  but arrivals still to come gets the next one (and every one due with it)
  at once: time fast-forwards, and later arrivals keep their spacing;
* the output queue (:class:`OutputQueue`): feeds the coordinator model;
* the aborts queue is a real, empty ``queue.Queue`` (the lane sends no
  aborts); ``time.sleep`` is a no-op (a rank with requests but nothing
  scheduled, e.g. a KV wait, loops without sleeping; the step budget bounds
  one that never makes progress); ``time.monotonic`` (0.34's spin
  deadline) stands still, the spin it times being one the polled futures
  never reach; the logger and the watchdog
  (``get_watch_dog``, 0.33+) do nothing; ``log_error_detail`` only lets the
  error through (vLLM's dumps diagnostics first, then re-raises);
* ``@fault_tolerant_wrapper`` on ``run_busy_loop`` is dropped: with
  ``enable_fault_tolerance`` off (vLLM's default, and the lane's: the
  engine's ``parallel_config`` and its own flag are False, and it has no
  ``ft_sentinel``) it only re-raises what the loop raises, and the loop's FT
  branches (0.34: ``_has_global_unfinished_reqs`` never keeps stepping for
  a disabled coordinator) are not taken;
* the scheduler is C's :class:`~dpsim.lanes.runner.scheduler.ModelledScheduler`.

Shutdown: from 0.18 vLLM's signal handler sets ``shutdown_state = REQUESTED``
and puts a WAKEUP into the input queue; the coordinator model does the same
at end of input, and the real ``_handle_shutdown`` ends the loop
(``SystemExit``, which :func:`run_engine` takes as the normal end). Through
0.17 the handler raises ``SystemExit`` in the engine's thread wherever it
is; at end of input every engine waits in its input queue's ``get``, which
raises it (:meth:`InputQueue.signal_exit`). ``shutdown_timeout`` (0.18+) is
taken as nonzero ("drain"): engines are shut down only once idle, where vLLM's
abort and drain modes do the same.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import logging
import queue
import typing
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from dpsim.boundary import fault_of, modelled
from dpsim.errors import TargetError
from dpsim.lanes.runner.coordinator import (
    REQUEST_TYPES,
    Coordinator,
    EngineCoreOutputs,
    front_end_wake_marks_running,
    front_end_wakes_engines,
)
from dpsim.lanes.runner.extract import Origin, class_methods, real_class
from dpsim.lanes.runner.scheduler import make_request, scheduler_types
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import (
    ModelGap,
    StrictObject,
    asked_at,
    gap,
    instance,
    standin,
)
from dpsim.lanes.runner.where import register_file, vllm_location
from dpsim.records.groups import ENGINE_DP_GROUP
from dpsim.records.sync import WORKER_ERROR_EVENT
from dpsim.scenarios.ranks import record
from dpsim.sim.mailbox import Mailbox
from dpsim.sim.world import current_world
from dpsim.targets import runtime
from dpsim.targets.shim import TORCH_VIEW, parse_source

ENGINE_CORE_MODULE = "vllm.v1.engine.core"
PARALLEL_CONFIG_MODULE = "vllm.config.parallel"
COORDINATOR_MODULE = "vllm.v1.engine.coordinator"
#: The modules this part of the lane reads (:data:`.sources.RUNNER_LANE_MODULES` lists them).
ENGINE_MODULES = (ENGINE_CORE_MODULE, PARALLEL_CONFIG_MODULE, COORDINATOR_MODULE)

#: Per real class: the methods kept, in order, and those of them kept only
#: where the release defines them (they came or went between 0.12 and 0.33;
#: when absent, nothing in the kept methods of that release calls them, and
#: a call to one a release lacks would be a gap: the engine is strict).
#: Methods DPEngineCoreProc overrides are not kept from its parents, nor
#: those only an abort-mode shutdown or a rejected request reaches (the lane
#: takes neither path; reaching one is a gap).
_ENGINE_CORE = (
    (
        "add_request",
        "abort_requests",
        "step",
        "post_step",
        "step_with_batch_queue",
        "_process_aborts_queue",
        "execute_dummy_batch",
        "_attach_weight_version",
        "capture_iteration_details",
        "_make_iteration_details_stats",
        "_attach_iteration_details",
        "_log_err_callback",
        "log_iteration_details",
    ),
    frozenset(
        {
            "_process_aborts_queue",  # 0.13+
            "_attach_weight_version",  # 0.26+ (before, step names none of these)
            "capture_iteration_details",
            "_make_iteration_details_stats",
            "_attach_iteration_details",
            # 0.12-0.13: step_with_batch_queue's done-callback on execute_model.
            "_log_err_callback",
            # 0.14-0.25: step's iteration logging (off: it only yields).
            "log_iteration_details",
        }
    ),
)
_ENGINE_CORE_PROC = (
    (
        "has_work",
        "is_running",
        "_process_input_queue",
        "_process_engine_step",
        "_wait_for_output",
        "_notify_idle_state_callbacks",
        "_handle_shutdown",
        "_handle_client_request",
        "_reject_add_in_shutdown",
        "_reject_add_while_paused",
    ),
    frozenset(
        {
            "has_work",  # 0.17+
            "_notify_idle_state_callbacks",  # 0.17+
            # 0.18+: the loop asks _handle_shutdown each pass (before, while True).
            "is_running",
            "_handle_shutdown",
            "_reject_add_in_shutdown",
            "_reject_add_while_paused",  # 0.33+
            # 0.34+: handles inputs while the step's future is pending, when
            # the future can be polled (MultiprocExecutor's); UniProcExecutor's
            # cannot, so it only waits.
            "_wait_for_output",
        }
    ),
)
_DP_ENGINE_CORE_PROC = (
    (
        "add_request",
        "_handle_client_request",
        "_maybe_publish_request_counts",
        "run_busy_loop",
        "_has_global_unfinished_reqs",
        "_should_throttle_prefills",
    ),
    # 0.24+ (before, the scheduler is not asked to throttle prefills).
    frozenset({"_should_throttle_prefills"}),
)
#: ``sync_dp_state`` (0.21+) replaced ``has_unfinished_dp`` (0.12-0.20 call
#: it; 0.21-0.25 still define it, unused): exactly one of them is kept.
_DP_STATE_SYNCS = ("sync_dp_state", "has_unfinished_dp")
_PARALLEL_CONFIG = (
    (*_DP_STATE_SYNCS, "cpu_distributed_timeout"),
    frozenset({*_DP_STATE_SYNCS, "cpu_distributed_timeout"}),
)

#: The decorators of kept methods the lane replaces, and why (see the module
#: docstring): fault tolerance is off, so its wrapper only re-raises.
_DECORATORS: dict[str, Callable[..., Any] | None] = {"fault_tolerant_wrapper": None}

#: vLLM's ``EngineShutdownState`` (an IntEnum in core.py) by the values it has.
SHUTDOWN_STATE = standin("EngineShutdownState", RUNNING=0, REQUESTED=1, SHUTTING_DOWN=2)


class Worker(Protocol):
    """What the executor stand-in calls on the lane's worker (D's)."""

    def execute_model(self, scheduler_output: Any) -> Any: ...

    def sample_tokens(self, grammar_output: Any) -> Any: ...

    def execute_dummy_batch(self) -> None: ...

    def take_draft_token_ids(self) -> Any: ...


# -- the stand-ins --------------------------------------------------------------


def _do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


#: vLLM's module logger: logging decides nothing the lane judges.
LOGGER = standin(
    "logger",
    debug=_do_nothing,
    info=_do_nothing,
    warning=_do_nothing,
    error=_do_nothing,
    isEnabledFor=lambda level: False,
)
#: 0.33's engine watchdog: the lane has no wall clock to watch.
WATCH_DOG = standin(
    "WatchDog", feed=_do_nothing, disable=lambda: contextlib.nullcontext()
)
#: ``time`` as the engine loop uses it: ``sleep``, which yields the GIL to
#: transfer threads the lane does not have, and 0.34's ``monotonic``, read
#: only for the spin deadline of ``_wait_for_output``, whose spin the lane's
#: polled futures never reach (:class:`_PolledFuture`): a clock standing
#: still. Anything else is a gap.
TIME = standin("time", sleep=_do_nothing, monotonic=lambda: 0.0)


def cpu_all_reduce_(
    tensor: torch.Tensor, group: Any, timeout: Any = None
) -> torch.Tensor:
    """vLLM's ``cpu_all_reduce_`` (0.33): an in-place SUM over ``group``,
    bitwise identical on every member. One fake all-reduce gives the same."""
    runtime.DIST_PROXY.all_reduce(tensor, group=group)
    return tensor


class _CompletedFuture(Future):
    """A ``Future`` holding a worker call's result; an async model-runner output
    is resolved on first ``result()``, as ``UniProcExecutor``'s
    ``AsyncOutputFuture`` does."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self._pending = value if _is_async_output(value) else None
        if self._pending is None:
            self.set_result(value)

    def result(self, timeout: float | None = None) -> Any:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self.set_result(pending.get_output())
        return super().result(timeout)


def _is_async_output(value: Any) -> bool:
    # Looked up on the type: a strict output must not log a gap for the probe.
    return callable(getattr(type(value), "get_output", None))


class _PolledFuture(Future):
    """``MultiprocExecutor``'s ``FutureWrapper`` as 0.34's engine polls it
    (``EngineCoreProc._wait_for_output``): the worker's call has run (the
    lane calls it synchronously); its output counts as ready once no input
    is pending in the engine's queue (``inputs_pending``: a long step, which
    the requests due next iteration reach while it runs, beside what peers'
    waves put there). The other timing, a step done before any input
    arrives, is ``UniProcExecutor``'s (``executor="uni"``)."""

    def __init__(self, inner: Future, inputs_pending: Callable[[], bool]) -> None:
        super().__init__()
        self._inner = inner
        self._inputs_pending = inputs_pending

    def result(self, timeout: float | None = None) -> Any:
        return self._inner.result(timeout)

    def done(self) -> bool:
        return self._inner.done()

    def poll(self) -> bool:
        return not self._inputs_pending()

    def wait_briefly(self, pending: Any, deadline: float) -> None:
        # Only a poll that is False with nothing pending reaches it, which
        # the model above never answers.
        raise gap(f"FutureWrapper.wait_briefly (no clock to spin on) at {asked_at()}")


class Executor(StrictObject):
    """vLLM's executor for one rank: ``UniProcExecutor`` (``executor="uni"``)
    or ``MultiprocExecutor`` (``"mp"``), either calling the worker
    synchronously.

    As ``UniProcExecutor.collective_rpc`` does with ``non_block``, a call's
    error goes into the returned future; ``execute_model`` then raises it at
    once (the future is done), ``sample_tokens`` when the engine asks for the
    result. ``MultiprocExecutor`` keeps either error in its future until the
    engine asks, and its futures can be polled (:class:`_PolledFuture`, over
    ``inputs_pending``). A kept error is also recorded in the rank's trace at
    once (a ``worker_error`` event, judged by no-error), since the engine may
    enter its next DP sync before it asks and leave its peers waiting.
    """

    OWNER = "Executor"

    def __init__(
        self, worker: Worker, inputs_pending: Callable[[], bool] | None = None
    ) -> None:
        self.worker = worker
        self.is_sleeping = False
        self._inputs_pending = inputs_pending

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        multiproc = self._inputs_pending is not None
        output = self._call(
            self.worker.execute_model, scheduler_output, non_block, kept=multiproc
        )
        if non_block and not multiproc and output.done():
            output.result()  # surfaces the worker's error in line, as vLLM does
        return output

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        return self._call(
            self.worker.sample_tokens, grammar_output, non_block, kept=True
        )

    def execute_dummy_batch(self) -> None:
        self.worker.execute_dummy_batch()

    def take_draft_token_ids(self) -> Any:
        return self.worker.take_draft_token_ids()

    def _call(
        self,
        method: Callable[[Any], Any],
        argument: Any,
        non_block: bool,
        *,
        kept: bool,
    ) -> Any:
        """The worker's answer (``non_block``: in a future, its error too).
        ``kept``: an error stays in the future until the engine asks for it."""
        if not non_block:
            value = method(argument)
            return value.get_output() if _is_async_output(value) else value
        future: Future[Any]
        try:
            future = _CompletedFuture(method(argument))
        except Exception as error:
            fault = None if isinstance(error, ModelGap) else fault_of(error)
            if fault is not None:
                # dpsim's side of the boundary raised: logged as a gap, it
                # refuses the run whatever the engine does with the future.
                gap(f"the worker raised {fault}")
            elif kept and not isinstance(error, ModelGap):
                # The engine re-raises it only when it pops this batch and
                # may first enter its next DP sync while peers wait: the
                # trace must say this rank raised (no-error judges it). A
                # gap is logged already and refuses the run.
                record(WORKER_ERROR_EVENT, _worker_error(error))
            future = Future()
            future.set_exception(error)
        if self._inputs_pending is None:
            return future
        return _PolledFuture(future, self._inputs_pending)


def _worker_error(error: BaseException) -> dict[str, Any]:
    """A ``worker_error`` event's payload: the error and the innermost vLLM
    frame it was raised under."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return {
        "error": f"{type(error).__name__}: {error}",
        "where": vllm_location(tb.tb_frame) if tb is not None else None,
    }


class Arrivals:
    """One rank's request stream, sent as its requests fall due (see the
    module docstring for the rule)."""

    def __init__(
        self, rank: int, requests: Iterable[RequestScript], coordinator: Coordinator
    ) -> None:
        self._rank = rank
        self._due: deque[RequestScript] = deque(requests)
        self._coordinator = coordinator
        #: Iterations skipped by fast-forwarding: stream time = iteration + skipped.
        self._skipped = 0
        #: The loop iteration now running, from 0 (-1 before the loop starts).
        self.iteration = -1

    def start_iteration(self) -> None:
        self.iteration += 1
        self._send_until(self.iteration + self._skipped)

    def pending(self) -> bool:
        return bool(self._due)

    def arrive_during_step(self) -> None:
        """Send the requests due at the next iteration now: a step long
        enough to outlast the time until then (``MultiprocExecutor``'s
        steps, which 0.34's engine polls, handling them mid-step)."""
        self._send_until(self.iteration + 1 + self._skipped)

    def fast_forward(self) -> None:
        """Send the next arrival now, and every one due with it."""
        due = self._due[0].arrival
        self._skipped = due - max(self.iteration, 0)
        self._send_until(due)

    def _send_until(self, now: int) -> None:
        due = self._due
        while due and due[0].arrival <= now:
            self._coordinator.send_request(self._rank, make_request(due.popleft()))


class InputQueue(StrictObject):
    """The engine's ``input_queue`` (a ``queue.Queue``) over the rank's mailbox."""

    OWNER = "input_queue"

    def __init__(self, mailbox: Mailbox, arrivals: Arrivals) -> None:
        self._mailbox = mailbox
        self._arrivals = arrivals
        self._signalled = False

    def signal_exit(self) -> None:
        """A signal raising ``SystemExit`` in the engine's thread (0.12-0.17's
        handler) while it waits in :meth:`get`, the one place an idle engine
        waits: the get raises it instead of returning."""
        self._signalled = True

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if timeout is not None:
            # A timeout would need a clock; the engine loop uses none.
            raise TargetError(
                "runner lane: the engine's input_queue.get was given a timeout; "
                "the lane has no clock"
            )
        mailbox = self._mailbox
        if mailbox.empty():
            if self._arrivals.pending():
                self._arrivals.fast_forward()
            elif not block:
                raise modelled(queue.Empty())
        item = mailbox.get()
        if self._signalled:
            raise modelled(SystemExit())
        return item

    def get_nowait(self) -> Any:
        if self._mailbox.empty():
            raise modelled(queue.Empty())
        return self._mailbox.get_nowait()

    def empty(self) -> bool:
        return self._mailbox.empty()

    @property
    def queue(self) -> _Pending:
        """``queue.Queue.queue`` as 0.34's ``_wait_for_output`` reads it:
        only whether anything is pending (each test a look at the mailbox)."""
        return _Pending(self._mailbox)


class _Pending:
    """The input queue's pending items, as far as the engine asks: whether
    there are any."""

    def __init__(self, mailbox: Mailbox) -> None:
        self._mailbox = mailbox

    def __bool__(self) -> bool:
        return not self._mailbox.empty()

    def __len__(self) -> int:
        return int(bool(self))


class OutputQueue(StrictObject):
    """The engine's ``output_queue``: what it puts goes to the coordinator model."""

    OWNER = "output_queue"

    def __init__(self, rank: int, coordinator: Coordinator) -> None:
        self._rank = rank
        self._coordinator = coordinator

    def put_nowait(self, item: Any) -> None:
        self._coordinator.output(self._rank, item)


# -- the real classes -------------------------------------------------------------


@dataclass(frozen=True)
class EngineClasses:
    """One release's rebuilt engine and config classes."""

    engine: type
    parallel_config: type
    front_end_wakes: bool
    #: 0.12-0.28's coordinator marks the engines running on a front-end's wake.
    wake_marks_running: bool = False
    #: 0.18+: the loop asks ``_handle_shutdown`` each pass, and a shutdown is
    #: a state the signal handler sets; 0.12-0.17: the loop is ``while
    #: True`` and the signal handler raises ``SystemExit`` where the engine is.
    checks_shutdown: bool = True

    @property
    def origins(self) -> tuple[Origin, ...]:
        """Where each rebuilt class came from (for line coverage), outermost
        vLLM class first: DPEngineCoreProc, EngineCoreProc, EngineCore,
        ParallelConfig."""
        found = [
            klass.__dict__["DPSIM_ORIGIN"]
            for klass in (*self.engine.__mro__, self.parallel_config)
            if "DPSIM_ORIGIN" in klass.__dict__
        ]
        return tuple(found)


@functools.lru_cache(maxsize=16)
def engine_classes(sources: RunnerSources) -> EngineClasses:
    """The release's engine classes: built once per set of files, looked up
    once per sources object (hashed by identity; every rank of every case
    asks, and finding the files costs a stat each)."""
    for module in ENGINE_MODULES:
        if not sources.has(module):
            raise TargetError(
                f"runner lane: vLLM {sources.version or '(this tree)'} has no "
                f"{module.replace('.', '/')}.py, which the engine loop needs"
            )
    return _engine_classes(
        sources.path(ENGINE_CORE_MODULE),
        sources.path(PARALLEL_CONFIG_MODULE),
        sources.path(COORDINATOR_MODULE),
        sources.version,
        # The scheduler's pause_state is the release's PauseState; compared as such.
        scheduler_types(sources).PauseState,
    )


@functools.lru_cache(maxsize=16)
def _engine_classes(
    core: Path, parallel: Path, coordinator: Path, version: str | None, pause_state: Any
) -> EngineClasses:
    config_methods = _methods(parallel, "ParallelConfig", _PARALLEL_CONFIG, version)
    syncs = [name for name in _DP_STATE_SYNCS if name in config_methods]
    if not syncs:
        raise TargetError(
            f"runner lane: vLLM {version or '(this tree)'}'s "
            f"{register_file(parallel)} has no ParallelConfig."
            f"{' or '.join(_DP_STATE_SYNCS)}, one of which the engine loop calls"
        )
    config_methods = [name for name in config_methods if name not in syncs[1:]]
    parallel_config = real_class(
        parallel,
        "ParallelConfig",
        config_methods,
        version=version,
        globals_={
            "torch": TORCH_VIEW,
            "ReduceOp": torch.distributed.ReduceOp,
            "cpu_all_reduce_": cpu_all_reduce_,
        },
    )
    globals_ = {
        "Any": Any,
        "Generator": typing.Generator,
        "cast": typing.cast,
        "contextmanager": contextlib.contextmanager,
        "Future": Future,
        "defaultdict": defaultdict,
        "queue": queue,
        "time": TIME,
        "DEBUG": logging.DEBUG,
        "logger": LOGGER,
        "get_watch_dog": lambda: WATCH_DOG,
        # Only a type argument to typing.cast in step_with_batch_queue.
        "ModelRunnerOutput": object,
        "EngineCoreOutputs": EngineCoreOutputs,
        "EngineCoreRequestType": REQUEST_TYPES,
        "EngineShutdownState": SHUTDOWN_STATE,
        "ParallelConfig": parallel_config,
        "PauseState": pause_state,
        # 0.34+: which inputs _wait_for_output handles during a step, and
        # how long it spins; the release's own module-level values.
        **_module_constants(
            core,
            ("_INPUTS_HANDLED_DURING_STEP", "_INPUT_SPIN_DURATION_S"),
            {"EngineCoreRequestType": REQUEST_TYPES},
        ),
    }
    core_cls = real_class(
        core,
        "EngineCore",
        _methods(core, "EngineCore", _ENGINE_CORE, version),
        version=version,
        globals_=globals_,
        decorators=_DECORATORS,
    )
    proc_cls = real_class(
        core,
        "EngineCoreProc",
        _methods(core, "EngineCoreProc", _ENGINE_CORE_PROC, version),
        version=version,
        globals_=globals_,
        bases=(core_cls,),
        decorators=_DECORATORS,
    )
    dp_cls = real_class(
        core,
        "DPEngineCoreProc",
        _methods(core, "DPEngineCoreProc", _DP_ENGINE_CORE_PROC, version),
        version=version,
        globals_=globals_,
        bases=(proc_cls,),
        decorators=_DECORATORS,
    )
    checks_shutdown = "_handle_shutdown" in proc_cls.__dict__
    hooks = _IterationAtShutdownCheck if checks_shutdown else _IterationAtInputPoll
    lane_cls = type("DPEngineCoreProc", (hooks, dp_cls), {"OWNER": "DPEngineCoreProc"})
    return EngineClasses(
        engine=lane_cls,
        parallel_config=parallel_config,
        front_end_wakes=front_end_wakes_engines(coordinator, version),
        wake_marks_running=front_end_wake_marks_running(coordinator, version),
        checks_shutdown=checks_shutdown,
    )


def _module_constants(
    path: Path, names: tuple[str, ...], namespace: dict[str, Any]
) -> dict[str, Any]:
    """The values of the file's top-level assignments to ``names`` (those it
    has), evaluated over ``namespace`` with the file's name and lines."""
    _, tree = parse_source(path)
    found: dict[str, Any] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in names
        ):
            expression = ast.Expression(body=node.value)
            code = compile(expression, str(path), "eval", dont_inherit=True)
            found[node.targets[0].id] = eval(code, dict(namespace))
    return found


def _methods(
    path: Path,
    class_name: str,
    wanted: tuple[tuple[str, ...], frozenset[str]],
    version: str | None,
) -> list[str]:
    """The kept methods, in order, less the optional ones ``class_name`` does
    not define (a required one it lacks is refused by ``real_class``)."""
    names, optional = wanted
    defined = class_methods(path, class_name, version=version)
    return [name for name in names if name not in optional or name in defined]


class _LaneHooks(StrictObject):
    """The lane's one stood-in method of the real engine; its subclasses are
    the lane's hook into the real loop (one per loop form).

    At each pass of ``run_busy_loop`` a rank-local iteration starts, at
    which the requests due are sent, before that pass's input poll."""

    _dpsim_arrivals: Arrivals

    @contextlib.contextmanager
    def log_error_detail(self, scheduler_output: Any) -> Iterator[None]:
        """Stands in for ``EngineCore.log_error_detail``: vLLM's dumps the
        failing step's inputs and scheduler stats, then re-raises. Only the
        re-raise matters here, and asking the modelled scheduler for stats
        would hide the error behind a gap."""
        yield


class _IterationAtShutdownCheck(_LaneHooks):
    """0.18+: each pass starts at ``while self._handle_shutdown()``, which
    then runs unchanged."""

    def _handle_shutdown(self) -> bool:
        self._dpsim_arrivals.start_iteration()
        handled: bool = super()._handle_shutdown()  # type: ignore[misc]
        return handled


class _IterationAtInputPoll(_LaneHooks):
    """0.12-0.17: the loop is ``while True:`` and each pass starts with
    ``self._process_input_queue()``, which then runs unchanged."""

    def _process_input_queue(self) -> None:
        self._dpsim_arrivals.start_iteration()
        super()._process_input_queue()  # type: ignore[misc]


# -- building and running an engine -----------------------------------------------


def build_engine(
    sources: RunnerSources,
    options: EngineOptions,
    scheduler: Any,
    worker: Worker,
    rank: int,
    dp_size: int,
    mailbox: Mailbox,
    coordinator: Coordinator,
    stream: RankStream | None = None,
) -> Any:
    """Rank ``rank``'s engine: the real ``DPEngineCoreProc``, built without its
    ``__init__`` (ZMQ handshakes, executor start-up, KV-cache profiling) and
    given the attributes its kept methods read, each as vLLM's ``__init__``
    would set it for this deployment. ``stream`` (default: none) is the
    rank's requests, sent as they fall due."""
    classes = engine_classes(sources)
    if classes.front_end_wakes != coordinator.front_end_wakes:
        raise ValueError(
            "the coordinator model was made for another release's wave protocol"
        )
    # DP fault tolerance (0.33+) is off, as in a deployment started without
    # --enable-fault-tolerance: the engine then has no ft_sentinel, and the
    # loop's FT branches (0.34: _has_global_unfinished_reqs' coordinator_disabled
    # test) are never taken.
    config_fields: dict[str, Any] = {"enable_fault_tolerance": False}
    if "cpu_distributed_timeout" in classes.parallel_config.__dict__:
        config_fields["cpu_distributed_timeout_seconds"] = None  # vLLM's default
    parallel_config: Any = instance(classes.parallel_config, **config_fields)
    vllm_config = standin(
        "VllmConfig",
        parallel_config=parallel_config,
        observability_config=standin(
            "ObservabilityConfig", enable_logging_iteration_details=False
        ),
        # Nonzero: drain mode (see the module docstring).
        shutdown_timeout=1,
    )
    arrivals = Arrivals(rank, stream.requests if stream else (), coordinator)
    input_queue = InputQueue(mailbox, arrivals)
    batch_queue_size = 2 if options.async_scheduling else 1
    engine: Any = instance(
        classes.engine,
        _dpsim_arrivals=arrivals,
        vllm_config=vllm_config,
        scheduler=scheduler,
        model_executor=Executor(
            worker,
            inputs_pending=(
                functools.partial(_inputs_arrived, arrivals, mailbox)
                if options.executor == "mp"
                else None
            ),
        ),
        # EngineCore.__init__
        log_stats=False,
        _weight_version="default",
        batch_queue_size=batch_queue_size,
        batch_queue=deque(maxlen=batch_queue_size) if batch_queue_size > 1 else None,
        is_mm_encoder_only=False,  # 0.31+: a text MoE model
        # 0.18-0.30: True without an EC transfer config (EngineCore.__init__); it
        # gates step_with_batch_queue's model_executed (0.12-0.17: the
        # opposite flag, is_ec_producer, False without one).
        is_ec_consumer=True,
        is_ec_producer=False,
        # 0.16: the scheduler-pause flag (pause_scheduler is a utility call
        # the lane never sends).
        _scheduler_paused=False,
        is_pooling_model=False,
        async_scheduling=options.async_scheduling,
        check_for_draft_tokens=options.speculator is not None,
        # 0.12-0.25's post_step asks it (speculative_config is not None).
        use_spec_decode=options.speculator is not None,
        aborts_queue=queue.Queue(),
        _idle_state_callbacks=[],
        # EngineCoreProc.__init__
        input_queue=input_queue,
        output_queue=OutputQueue(rank, coordinator),
        # 0.34+: inputs taken during a step and handled after it; only a
        # pollable future (not UniProcExecutor's) defers any.
        _deferred_inputs=deque(),
        enable_fault_tolerance=parallel_config.enable_fault_tolerance,
        engine_index=rank,
        engines_running=False,
        shutdown_state=SHUTDOWN_STATE.RUNNING,
        reject_new_requests=False,
        # A DP deployment of a MoE model runs a coordinator (internal LB).
        has_coordinator=True,
        # Load-balancing stats decide nothing the lane judges.
        publish_dp_lb_stats=False,
        last_counts=(0, 0),
        process_input_queue_block=True,
        # DPEngineCoreProc.__init__ / _init_data_parallel
        prefill_schedule_interval=options.prefill_schedule_interval,
        dp_sync_interval=options.dp_sync_interval,  # 0.30+ reads it
        step_counter=0,
        current_wave=0,
        pending_pause=False,
        ignore_start_dp_wave=False,
        eep_scaling_state=None,
        dp_rank=rank,
        dp_size=dp_size,
    )
    engine.step_fn = (
        engine.step if engine.batch_queue is None else engine.step_with_batch_queue
    )
    shutdown = _request_shutdown if classes.checks_shutdown else _raise_exit
    coordinator.attach(rank, functools.partial(shutdown, engine))
    return engine


def _inputs_arrived(arrivals: Arrivals, mailbox: Mailbox) -> bool:
    """Whether inputs are pending while a ``MultiprocExecutor`` step runs:
    the step outlasts the time until the next iteration, so the requests due
    then have arrived, beside whatever peers' waves put in the queue."""
    arrivals.arrive_during_step()
    return not mailbox.empty()


def _request_shutdown(engine: Any) -> None:
    # What vLLM's signal handler does to the engine (run_engine_core, 0.18+).
    engine.shutdown_state = SHUTDOWN_STATE.REQUESTED


def _raise_exit(engine: Any) -> None:
    # What vLLM's signal handler does to the engine (run_engine_core,
    # 0.12-0.17): raise SystemExit in its thread, waiting in its input queue.
    engine.input_queue.signal_exit()


def run_engine(engine: Any) -> None:
    """Run the engine's real busy loop on the running rank until it exits.

    The engine's DP group is the running simulation's ``engine_dp`` group
    (taken here: a group handle belongs to a run). vLLM's loop ends by
    raising ``SystemExit`` after a requested shutdown; that is the normal
    end, and this returns.
    """
    engine.dp_group = current_world().group(ENGINE_DP_GROUP)
    with contextlib.suppress(SystemExit):
        engine.run_busy_loop()


def coordinator_for(
    sources: RunnerSources, mailboxes: Sequence[Mailbox]
) -> Coordinator:
    """The coordinator model for this release's wave protocol."""
    classes = engine_classes(sources)
    return Coordinator(
        mailboxes,
        front_end_wakes=classes.front_end_wakes,
        wake_marks_running=classes.wake_marks_running,
    )
