"""The runner lane's engine: vLLM's real DP engine loop per virtual rank, its
stand-ins (executor, input/output queues) and the DP coordinator model.

Fast tests exercise the stand-ins and the coordinator model on their own;
release tests (0.29.0, 0.33.0, 0.34.0) run the real ``DPEngineCoreProc`` busy loop
with C's modelled scheduler and a tiny fake worker that records its calls and
makes the model runner's DP all-reduce on ``dp_cpu``.
"""

from __future__ import annotations

import functools
import queue
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from dpsim.errors import TargetError
from dpsim.lanes.runner import engine as engine_module
from dpsim.lanes.runner.coordinator import (
    REQUEST_TYPES,
    Coordinator,
    EngineCoreOutputs,
    front_end_wake_marks_running,
    front_end_wakes_engines,
)
from dpsim.lanes.runner.engine import (
    Arrivals,
    Executor,
    InputQueue,
    build_engine,
    coordinator_for,
    run_engine,
)
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import ModelGap, collect_gaps, gap, standin
from dpsim.records.groups import DP_CPU_GROUP, ENGINE_DP_GROUP
from dpsim.records.sync import WORKER_ERROR_EVENT
from dpsim.records.trace import Outcome, RankState, SimResult
from dpsim.sim import current_world, simulate
from dpsim.sim.mailbox import Mailbox
from dpsim.targets import runtime

# -- the coordinator model ------------------------------------------------------


def _drain(box: Mailbox) -> list[Any]:
    got = []
    while not box.empty():
        got.append(box.get_nowait())
    return got


def test_an_engines_start_wave_is_broadcast_naming_it() -> None:
    boxes = [Mailbox(rank) for rank in range(3)]
    coordinator = Coordinator(boxes, front_end_wakes=False)

    coordinator.output(1, (-1, EngineCoreOutputs(start_wave=0)))

    for box in boxes:
        assert _drain(box) == [(REQUEST_TYPES.START_DP_WAVE, (0, 1))]
    assert coordinator.engines_running and coordinator.current_wave == 0
    # The same wave again while running: nothing new to start.
    coordinator.output(2, (-1, EngineCoreOutputs(start_wave=0)))
    assert all(box.empty() for box in boxes)


def test_wave_complete_moves_the_wave_and_requests_carry_it() -> None:
    boxes = [Mailbox(rank) for rank in range(2)]
    coordinator = Coordinator(boxes, front_end_wakes=False)
    coordinator.output(0, (-1, EngineCoreOutputs(start_wave=0)))
    _drain(boxes[0]), _drain(boxes[1])

    coordinator.output(0, (-1, EngineCoreOutputs(wave_complete=0)))
    coordinator.send_request(1, "req")

    assert coordinator.current_wave == 1 and not coordinator.engines_running
    # 0.33: the front-end only sends; the engine starts the wave itself.
    assert _drain(boxes[1]) == [(REQUEST_TYPES.ADD, ("req", 1))]
    assert boxes[0].empty()
    assert coordinator.log == [("start", 0, 0), ("complete", 0, 0)]


def test_a_front_end_that_wakes_engines_broadcasts_once_per_pause() -> None:
    boxes = [Mailbox(rank) for rank in range(2)]
    coordinator = Coordinator(boxes, front_end_wakes=True)

    coordinator.send_request(0, "a")
    coordinator.send_request(0, "b")

    assert _drain(boxes[0]) == [
        (REQUEST_TYPES.ADD, ("a", 0)),
        (REQUEST_TYPES.START_DP_WAVE, (0, 0)),
        (REQUEST_TYPES.ADD, ("b", 0)),
    ]
    assert _drain(boxes[1]) == [(REQUEST_TYPES.START_DP_WAVE, (0, 0))]


@pytest.mark.parametrize("marks", [False, True])
def test_a_wake_that_marks_engines_running_ignores_their_start_wave(
    marks: bool,
) -> None:
    """0.26-0.28's coordinator marks the engines running when a front-end's
    request wakes them: an engine's start_wave of the same wave is then not
    broadcast again (0.29+: it is, as the engines are not marked)."""
    boxes = [Mailbox(rank) for rank in range(2)]
    coordinator = Coordinator(boxes, front_end_wakes=True, wake_marks_running=marks)

    coordinator.send_request(0, "a")
    coordinator.output(1, (-1, EngineCoreOutputs(start_wave=0)))

    again = [] if marks else [(REQUEST_TYPES.START_DP_WAVE, (0, 1))]
    assert _drain(boxes[1]) == [(REQUEST_TYPES.START_DP_WAVE, (0, 0)), *again]
    assert coordinator.engines_running


def test_per_request_outputs_are_not_the_coordinators() -> None:
    boxes = [Mailbox(0)]
    coordinator = Coordinator(boxes, front_end_wakes=False)
    coordinator.output(0, (0, EngineCoreOutputs(wave_complete=3)))
    assert coordinator.current_wave == 0 and coordinator.log == []


def test_engine_core_outputs_with_an_unknown_field_is_a_gap() -> None:
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        EngineCoreOutputs(wave_complete=1, finished_requests={"r"})
    assert gaps and gaps[0].startswith("EngineCoreOutputs(finished_requests=...) made")
    made = EngineCoreOutputs(start_wave=2)
    assert (made.start_wave, made.wave_complete, made.engine_index) == (2, None, 0)


def test_request_types_the_model_does_not_know_are_gaps() -> None:
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        _ = REQUEST_TYPES.SCALE_ELASTIC_EP
    assert gaps == [
        "EngineCoreRequestType.SCALE_ELASTIC_EP read at (no vLLM frame on the stack)"
    ]


def _quiesce(coordinator: Coordinator, programs: Any, ranks: int) -> list[str]:
    shut: list[str] = []
    for rank in range(ranks):
        coordinator.attach(rank, functools.partial(shut.append, f"shutdown {rank}"))
    result = simulate(programs, ranks=ranks, on_quiescent=coordinator.on_quiescent)
    shut.append(result.outcome.value)
    return shut


def test_end_of_input_shuts_down_every_parked_engine_once() -> None:
    boxes = [Mailbox(rank) for rank in range(2)]
    coordinator = Coordinator(boxes, front_end_wakes=False)

    def program(rank: int) -> Any:
        return boxes[rank].get()

    assert _quiesce(coordinator, program, 2) == ["shutdown 0", "shutdown 1", "ok"]


def test_an_engine_parked_again_after_shutdown_is_left_where_it_stands() -> None:
    boxes = [Mailbox(0)]
    coordinator = Coordinator(boxes, front_end_wakes=False)

    def program(rank: int) -> None:
        while True:  # an engine that ignores its shutdown
            boxes[rank].get()

    assert _quiesce(coordinator, program, 1) == ["shutdown 0", "hang"]


def test_no_shutdown_while_a_rank_waits_in_a_collective() -> None:
    boxes = [Mailbox(rank) for rank in range(2)]
    coordinator = Coordinator(boxes, front_end_wakes=False)

    def program(rank: int) -> None:
        if rank == 0:
            runtime.DIST_PROXY.all_reduce(
                torch.tensor([1]), group=current_world().group(DP_CPU_GROUP)
            )
        else:
            boxes[rank].get()

    assert _quiesce(coordinator, program, 2) == ["hang"]


def test_who_starts_waves_is_read_from_the_coordinator_file(tmp_path: Path) -> None:
    def coordinator_file(calls: int) -> Path:
        path = tmp_path / f"coordinator{calls}.py"
        body = "".join("        self._send_start_wave(s, w, e)\n" for _ in range(calls))
        path.write_text(f"class C:\n    def run(self):\n        pass\n{body}")
        return path

    assert front_end_wakes_engines(coordinator_file(2), "9.9.9")
    assert not front_end_wakes_engines(coordinator_file(1), "9.9.9")
    with pytest.raises(TargetError, match="sends START_DP_WAVE from 0 places"):
        front_end_wakes_engines(coordinator_file(0), "9.9.9")


def test_whether_a_wake_marks_engines_running_is_read_from_the_file(
    tmp_path: Path,
) -> None:
    def coordinator_file(marks: int) -> Path:
        path = tmp_path / f"coordinator{marks}.py"
        body = "".join("    engines_running = True\n" for _ in range(marks))
        path.write_text(f"def run():\n    engines_running = False\n{body}")
        return path

    assert front_end_wake_marks_running(coordinator_file(2), "9.9.9")
    assert not front_end_wake_marks_running(coordinator_file(1), "9.9.9")
    with pytest.raises(TargetError, match="marks the engines running in 3 places"):
        front_end_wake_marks_running(coordinator_file(3), "9.9.9")


# -- the stand-ins ----------------------------------------------------------------


class _Output:
    def __init__(self, value: str) -> None:
        self.value = value
        self.resolved = 0

    def get_output(self) -> str:
        self.resolved += 1
        return self.value


def test_executor_answers_like_uniproc_and_refuses_the_rest() -> None:
    async_output = _Output("sampled")
    worker = standin(
        "Worker",
        execute_model=lambda so: None,
        sample_tokens=lambda grammar: async_output,
    )
    executor = Executor(worker)

    future = executor.execute_model("so", non_block=True)
    assert future.done() and future.result() is None
    sampled = executor.sample_tokens(None, non_block=True)
    assert async_output.resolved == 0  # resolved when asked, as AsyncOutputFuture
    assert sampled.result() == "sampled" and sampled.result() == "sampled"
    assert async_output.resolved == 1
    assert executor.sample_tokens(None) == "sampled"
    # A worker's error: in line from execute_model, from the future of
    # sample_tokens when its result is asked for (UniProcExecutor's way).
    failing = Executor(
        standin("Worker", execute_model=lambda so: 1 / 0, sample_tokens=lambda g: 1 / 0)
    )
    with pytest.raises(ZeroDivisionError):
        failing.execute_model("so", non_block=True)
    # Kept in the future, and said in the rank's trace (a worker_error event:
    # the engine may enter its next DP sync before it pops this batch).
    kept: list[Any] = []
    traced = simulate(
        lambda rank: kept.append(failing.sample_tokens(None, non_block=True)), ranks=1
    )
    with pytest.raises(ZeroDivisionError):
        kept[0].result()
    (event,) = traced.ranks[0].events
    assert (event.kind, event.payload) == (
        WORKER_ERROR_EVENT,
        {"error": "ZeroDivisionError: division by zero", "where": None},
    )
    assert executor.is_sleeping is False
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        executor.check_health()
    assert gaps == ["Executor.check_health read at (no vLLM frame on the stack)"]


def test_a_multiproc_executors_futures_keep_errors_and_poll_for_inputs() -> None:
    """MultiprocExecutor's futures: an execute_model error stays in the
    future (and in the trace), and a future polls ready only once no input
    is pending: the long step 0.34's _wait_for_output handles inputs in."""
    pending = [True]
    worker = standin(
        "Worker", execute_model=lambda so: 1 / 0, sample_tokens=lambda g: "sampled"
    )
    executor = Executor(worker, inputs_pending=lambda: pending[0])
    kept: list[Any] = []
    traced = simulate(
        lambda rank: kept.append(executor.execute_model("so", non_block=True)),
        ranks=1,
    )
    with pytest.raises(ZeroDivisionError):
        kept[0].result()
    assert [event.kind for event in traced.ranks[0].events] == [WORKER_ERROR_EVENT]
    sampled = executor.sample_tokens(None, non_block=True)
    assert sampled.done() and sampled.poll() is False
    pending[0] = False
    assert sampled.poll() is True and sampled.result() == "sampled"
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        sampled.wait_briefly([], 0.0)
    assert gaps and gaps[0].startswith("FutureWrapper.wait_briefly")
    # UniProcExecutor's futures cannot be polled: 0.34's engine only waits.
    assert not hasattr(Executor(worker).sample_tokens(None, non_block=True), "poll")


def test_arrivals_due_next_iteration_can_arrive_during_a_step() -> None:
    sent: list[str] = []
    coordinator = standin(
        "Coordinator",
        send_request=lambda rank, request: sent.append(request.request_id),
    )
    arrivals = Arrivals(
        0,
        [RequestScript("a", 0, 4, 1), RequestScript("b", 1, 4, 1)],
        coordinator,  # type: ignore[arg-type]
    )
    arrivals.start_iteration()
    assert sent == ["a"]
    arrivals.arrive_during_step()  # iteration 0's step outlasts the time to 1
    assert sent == ["a", "b"]
    arrivals.start_iteration()  # nothing is sent twice
    assert sent == ["a", "b"] and not arrivals.pending()


def test_input_queue_polls_refuses_a_timeout_and_fast_forwards() -> None:
    box = Mailbox(0)
    sent: list[tuple[int, str]] = []

    def send_request(rank: int, request: Any) -> None:
        sent.append((rank, request.request_id))
        box.put(request.request_id)

    coordinator = standin("Coordinator", send_request=send_request)
    arrivals = Arrivals(
        0,
        [
            RequestScript("a", 2, 4, 1),
            RequestScript("b", 2, 4, 1),
            RequestScript("c", 4, 4, 1),
        ],
        coordinator,  # type: ignore[arg-type]
    )
    inputs = InputQueue(box, arrivals)

    arrivals.start_iteration()  # iteration 0: nothing due
    assert inputs.empty() and sent == []
    with pytest.raises(queue.Empty):
        inputs.get_nowait()
    with pytest.raises(TargetError, match="no clock"):
        inputs.get(timeout=1.0)
    # Blocking with nothing queued but arrivals to come: time fast-forwards
    # to iteration 2, and both requests due then are sent.
    box.put("already")
    assert inputs.get() == "already"
    assert inputs.get(block=False) == "a"
    assert sent == [(0, "a"), (0, "b")] and inputs.get_nowait() == "b"
    # c keeps its spacing: two iterations after the fast-forwarded 2.
    arrivals.start_iteration()
    assert sent == [(0, "a"), (0, "b")]
    arrivals.start_iteration()
    assert sent[-1] == (0, "c") and not arrivals.pending()
    assert inputs.get_nowait() == "c"
    with pytest.raises(queue.Empty):
        inputs.get(block=False)


def test_a_signalled_input_queue_raises_system_exit_from_its_blocking_get() -> None:
    """0.12-0.17's signal handler raises SystemExit in the engine's thread,
    which at end of input waits in its input queue's get: the coordinator's
    shutdown signals it, then wakes the mailbox, and the get raises."""
    box = Mailbox(0)
    coordinator = Coordinator([box], front_end_wakes=False)
    inputs = InputQueue(box, Arrivals(0, [], coordinator))
    coordinator.attach(0, inputs.signal_exit)
    got: list[Any] = []

    def program(rank: int) -> None:
        box.put("before")
        got.append(inputs.get())
        with pytest.raises(SystemExit):
            inputs.get()
        got.append("exited")

    result = simulate(program, ranks=1, on_quiescent=coordinator.on_quiescent)
    assert result.outcome is Outcome.OK
    assert got == ["before", "exited"]


# -- the real engine loop (releases) ------------------------------------------------


class FakeWorker:
    """Records the calls the executor makes; a model step and a dummy batch make
    the model runner's DP all-reduce on ``dp_cpu`` (a step with no tokens
    returns early before it, as the real runner does)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _sync(self, tokens: int) -> None:
        tensor = torch.tensor([tokens])
        runtime.DIST_PROXY.all_reduce(tensor, group=current_world().group(DP_CPU_GROUP))

    def execute_model(self, scheduler_output: Any) -> Any:
        tokens = scheduler_output.total_num_scheduled_tokens
        self.calls.append(f"execute_model {tokens}")
        if tokens == 0:
            return standin("ModelRunnerOutput")
        self._sync(tokens)
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        self.calls.append("sample_tokens")
        return standin("ModelRunnerOutput")

    def execute_dummy_batch(self) -> None:
        self.calls.append("dummy")
        self._sync(0)

    def take_draft_token_ids(self) -> Any:
        return None


def _sources(version: str, core: Path | None = None) -> Any:
    from dpsim.lanes.runner.sources import RunnerSources

    sources = RunnerSources.for_release(version)
    if core is not None:
        sources.overrides[engine_module.ENGINE_CORE_MODULE] = core
    return sources


def _run(
    sources: Any,
    options: EngineOptions,
    streams: list[RankStream],
    scheduler: Any = None,
    chooser: Any = None,
    workers: list[FakeWorker] | None = None,
    schedulers: list[Any] | None = None,
) -> tuple[SimResult, list[FakeWorker], list[str], Coordinator, list[int]]:
    from dpsim.lanes.runner.scheduler import ModelledScheduler

    ranks = len(streams)
    boxes = [Mailbox(rank, "engine input") for rank in range(ranks)]
    coordinator = coordinator_for(sources, boxes)
    workers = workers or [FakeWorker() for _ in range(ranks)]
    engines = [
        build_engine(
            sources,
            options,
            (schedulers[rank] if schedulers else None)
            or scheduler
            or ModelledScheduler(stream, options, sources),
            worker,
            rank,
            ranks,
            boxes[rank],
            coordinator,
            stream=stream,
        )
        for rank, (stream, worker) in enumerate(zip(streams, workers, strict=True))
    ]
    iterations: list[int] = []

    def program(rank: int) -> None:
        run_engine(engines[rank])
        iterations.append(engines[rank]._dpsim_arrivals.iteration)

    with collect_gaps() as gaps:
        result = simulate(
            program,
            ranks=ranks,
            groups={ENGINE_DP_GROUP: range(ranks)},
            on_quiescent=coordinator.on_quiescent,
            chooser=chooser,
        )
    return result, workers, gaps, coordinator, iterations


def _engine_dp(result: SimResult, rank: int) -> list[list[int]]:
    return [
        record.contribution
        for record in result.ranks[rank].collectives
        if record.group == ENGINE_DP_GROUP
    ]


ONE_REQUEST = [RankStream((RequestScript("r0", 0, 4, 3),)), RankStream(())]


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "interval", "syncs_at"),
    [("0.34.0", 2, [1, 2, 4]), ("0.33.0", 2, [1, 2, 4]), ("0.29.0", 2, [32])],
)
def test_an_idle_rank_runs_dummy_batches_until_the_wave_ends(
    version: str, interval: int, syncs_at: list[int]
) -> None:
    options = EngineOptions(dp_sync_interval=interval)
    result, workers, gaps, coordinator, _ = _run(
        _sources(version), options, ONE_REQUEST
    )

    assert gaps == []
    assert result.outcome is Outcome.OK
    assert all(trace.state is RankState.FINISHED for trace in result.ranks)
    busy, idle = workers
    # Prefill (4 tokens), two decodes, then the finished request is reported
    # with 0 tokens scheduled: that step runs no model, so a dummy batch does.
    assert busy.calls[:7] == [
        "execute_model 4",
        "sample_tokens",
        "execute_model 1",
        "sample_tokens",
        "execute_model 1",
        "sample_tokens",
        "execute_model 0",
    ]
    steps = syncs_at[-1]
    assert set(busy.calls[7:]) == {"dummy"} and len(busy.calls) == 7 + steps - 3
    assert idle.calls == ["dummy"] * steps
    # The engines' unfinished-requests all-reduce: at the steps the release
    # syncs at, rank 0 unfinished until its request is done, then the wave ends.
    for rank in (0, 1):
        assert len(_engine_dp(result, rank)) == len(syncs_at)
    assert _engine_dp(result, 1)[-1] == [0, 0]
    assert coordinator.log[-1] == ("complete", 0, 0)
    assert coordinator.current_wave == 1 and not coordinator.engines_running
    origins = engine_module.engine_classes(_sources(version)).origins
    assert [origin.class_name for origin in origins] == [
        "DPEngineCoreProc",
        "EngineCoreProc",
        "EngineCore",
        "ParallelConfig",
    ]


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0", "0.29.0"])
def test_an_engine_skipping_its_dummy_batch_hangs_its_peer(
    version: str, tmp_path: Path
) -> None:
    sources = _sources(version)
    core = sources.path(engine_module.ENGINE_CORE_MODULE)
    text = core.read_text()
    real = "elif not self.model_executor.is_sleeping:"
    assert text.count(real) == 1
    planted = tmp_path / "core.py"
    # Planted bug: an engine with no local requests skips its dummy batch.
    planted.write_text(
        text.replace(
            real, "elif local_unfinished_reqs and not self.model_executor.is_sleeping:"
        )
    )

    result, workers, gaps, _, _ = _run(
        _sources(version, core=planted), EngineOptions(), ONE_REQUEST
    )

    assert gaps == []
    assert result.outcome is Outcome.HANG
    busy, idle = (trace.waiting for trace in result.ranks)
    assert busy is not None and busy.group == DP_CPU_GROUP and busy.missing == (1,)
    assert idle is not None and idle.group == ENGINE_DP_GROUP
    assert workers[1].calls == []


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "late"), [("0.34.0", 9), ("0.33.0", 9), ("0.29.0", 40)]
)
def test_an_arrival_on_an_idle_rank_starts_a_wave_that_wakes_the_other(
    version: str, late: int
) -> None:
    # Rank 1's request arrives after a first wave ended: the next wave starts
    # (0.33: the engine's start_wave through the coordinator; 0.29: the
    # front-end's FIRST_REQ, or the engine's start_wave for a stale wave).
    # ``late`` is past the first wave's end (0.29's waves last 32 steps).
    streams = [
        RankStream((RequestScript("a", 0, 2, 1),)),
        RankStream((RequestScript("b", late, 2, 1),)),
    ]
    result, workers, gaps, coordinator, _ = _run(
        _sources(version), EngineOptions(dp_sync_interval=1), streams
    )

    assert gaps == [] and result.outcome is Outcome.OK
    assert ("start", 1, 1) in coordinator.log
    assert coordinator.log[-1] == ("complete", 1, 0)
    assert "dummy" in workers[0].calls and "execute_model 2" in workers[1].calls


@pytest.mark.release
def test_a_scheduler_asked_what_it_was_not_written_for_refuses() -> None:
    scheduler = standin("Scheduler", has_requests=lambda: False)
    _, _, gaps, _, _ = _run(
        _sources("0.33.0"), EngineOptions(), [RankStream(())], scheduler=scheduler
    )
    assert gaps and gaps[0].startswith(
        "Scheduler.has_unfinished_requests read at v1/engine/core.py:"
    )
    assert gaps[0].endswith("in run_busy_loop")


def _dp_cpu_count(result: SimResult, rank: int) -> int:
    return sum(
        1 for record in result.ranks[rank].collectives if record.group == DP_CPU_GROUP
    )


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0", "0.29.0"])
def test_async_scheduling_runs_the_batch_queue_in_step(version: str) -> None:
    options = EngineOptions(async_scheduling=True, dp_sync_interval=2)
    result, workers, gaps, _, _ = _run(_sources(version), options, ONE_REQUEST)

    assert gaps == [] and result.outcome is Outcome.OK
    busy, idle = workers
    assert busy.calls[:6] == [
        "execute_model 4",
        "sample_tokens",
        "execute_model 1",
        "sample_tokens",
        "execute_model 1",
        "sample_tokens",
    ]
    assert set(idle.calls) == {"dummy"}
    assert _dp_cpu_count(result, 0) == _dp_cpu_count(result, 1) == len(idle.calls)


class _RaisingWorker(FakeWorker):
    """A FakeWorker whose first sample_tokens raises what ``error`` makes."""

    def __init__(self, error: Callable[[], Exception]) -> None:
        super().__init__()
        self.error: Callable[[], Exception] | None = error

    def sample_tokens(self, grammar_output: Any) -> Any:
        error, self.error = self.error, None
        if error is not None:
            raise error()
        return super().sample_tokens(grammar_output)


@pytest.mark.release
@pytest.mark.parametrize(
    ("error", "is_gap"),
    [(lambda: IndexError("planted"), False), (lambda: gap("planted gap"), True)],
)
def test_a_worker_error_kept_in_a_future_is_traced_and_a_gap_stays_a_gap(
    error: Callable[[], Exception], is_gap: bool
) -> None:
    """Under async scheduling the busy rank's sample_tokens raises: the error
    goes into the future (as UniProcExecutor does) AND into the rank's trace
    as a worker_error event, so no-error names it instead of the run reading
    as a plain hang; a ModelGap is no worker error (the run is refused)."""
    options = EngineOptions(async_scheduling=True, dp_sync_interval=2)
    workers = [_RaisingWorker(error), FakeWorker()]
    result, _, gaps, _, _ = _run(
        _sources("0.33.0"), options, ONE_REQUEST, workers=workers
    )
    assert gaps == (["planted gap"] if is_gap else [])
    events = [e for e in result.ranks[0].events if e.kind == WORKER_ERROR_EVENT]
    if is_gap:
        assert events == []
        return
    (event,) = events
    assert event.payload["error"] == "IndexError: planted"
    assert "in step_with_batch_queue" in event.payload["where"]
    assert event.payload["where"].startswith("v1/engine/core.py:")


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0", "0.29.0"])
def test_a_kv_wait_steps_without_a_model_and_runs_dummy_batches(version: str) -> None:
    # A request held for a remote KV transfer: steps schedule 0 tokens (the
    # real loop "sleeps" to let transfers progress, a no-op here) and the
    # rank keeps its peers company with dummy batches meanwhile.
    streams = [
        RankStream((RequestScript("r0", 0, 4, 2, kv_wait=2),)),
        RankStream((RequestScript("r1", 1, 4, 2),)),
    ]
    result, workers, gaps, _, _ = _run(
        _sources(version), EngineOptions(dp_sync_interval=2), streams
    )

    assert gaps == [] and result.outcome is Outcome.OK
    held = workers[0].calls
    assert held[:4] == ["execute_model 0", "dummy", "execute_model 0", "dummy"]
    assert _dp_cpu_count(result, 0) == _dp_cpu_count(result, 1)


@pytest.mark.release
def test_from_034_a_multiproc_step_adds_the_request_that_arrives_meanwhile() -> None:
    """0.34's _wait_for_output with MultiprocExecutor's futures: the request
    due at iteration 1 reaches the queue during iteration 0's step and is
    added then, so iteration 1 schedules it at once; with UniProcExecutor it
    is added at iteration 1's input poll, to the same effect one poll later.
    Either way both ranks make the same syncs and the run ends clean."""
    from dpsim.lanes.runner.scheduler import ModelledScheduler

    class Told(ModelledScheduler):
        """Says, in order, what the engine told the scheduler."""

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.told: list[str] = []

        def add_request(self, request: Any) -> None:
            self.told.append(f"add {request.request_id}")
            super().add_request(request)

        def update_from_output(self, *args: Any) -> Any:
            self.told.append("update")
            return super().update_from_output(*args)

    streams = [
        RankStream((RequestScript("a", 0, 4, 3), RequestScript("b", 1, 2, 1))),
        RankStream(()),
    ]
    sources = _sources("0.34.0")
    calls = {}
    for executor in ("uni", "mp"):
        options = EngineOptions(dp_sync_interval=2, executor=executor)
        told = Told(streams[0], options, sources)
        result, workers, gaps, _, _ = _run(
            sources, options, streams, schedulers=[told, None]
        )
        assert gaps == [] and result.outcome is Outcome.OK
        assert _dp_cpu_count(result, 0) == _dp_cpu_count(result, 1)
        calls[executor] = workers[0].calls
        # b is added during iteration 0's step (before its output is
        # applied) only by the polled future.
        assert told.told[:3] == (
            ["add a", "add b", "update"]
            if executor == "mp"
            else ["add a", "update", "add b"]
        )
    # Both requests reach the scheduler before the second step either way:
    # b's 2-token prefill runs beside a's first decode.
    assert (
        calls["mp"][:4]
        == calls["uni"][:4]
        == [
            "execute_model 4",
            "sample_tokens",
            "execute_model 3",
            "sample_tokens",
        ]
    )


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0"])
def test_fault_tolerance_is_off_as_without_the_flag(version: str) -> None:
    """The engine's DP fault tolerance (0.33+) is off: its flag and its
    parallel config's are False and it has no ft_sentinel, so a loop asking
    the sentinel anything would be a gap, never a silent answer."""
    options = EngineOptions()
    box = Mailbox(0, "engine input")
    sources = _sources(version)
    engine = build_engine(
        sources,
        options,
        standin("Scheduler"),
        FakeWorker(),
        0,
        2,
        box,
        coordinator_for(sources, [box, Mailbox(1, "engine input")]),
    )
    assert engine.enable_fault_tolerance is False
    assert engine.vllm_config.parallel_config.enable_fault_tolerance is False
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        engine.ft_sentinel  # noqa: B018
    assert gaps == ["DPEngineCoreProc.ft_sentinel read at (no vLLM frame on the stack)"]


@pytest.mark.release
def test_a_release_without_a_method_the_loop_needs_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    sources = _sources("0.33.0")
    text = sources.path(engine_module.ENGINE_CORE_MODULE).read_text()
    renamed = tmp_path / "core.py"
    renamed.write_text(
        text.replace("def _has_global_unfinished_reqs(", "def _has_global_unfinished(")
    )
    with pytest.raises(TargetError) as refused:
        engine_module.engine_classes(_sources("0.33.0", core=renamed))
    assert str(refused.value) == (
        "runner lane: vLLM 0.33.0's core.py has no "
        "DPEngineCoreProc._has_global_unfinished_reqs"
    )


class _SeededChooser:
    """Picks a random runnable rank, reproducibly."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def choose(self, runnable: Sequence[int]) -> int:
        return self._random.choice(list(runnable))


THREE_RANKS = [
    RankStream((RequestScript("a", 0, 4, 3),)),
    RankStream((RequestScript("b", 2, 6, 2), RequestScript("c", 9, 2, 2))),
    RankStream(()),
]


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.34.0", "0.33.0", "0.29.0"])
def test_any_interleaving_of_the_real_loop_is_ok_and_replays_byte_for_byte(
    version: str,
) -> None:
    sources = _sources(version)
    options = EngineOptions(dp_sync_interval=3)
    for seed in range(12):
        first = _run(sources, options, THREE_RANKS, chooser=_SeededChooser(seed))
        again = _run(sources, options, THREE_RANKS, chooser=_SeededChooser(seed))
        assert first[2] == [] and first[0].outcome is Outcome.OK, seed
        assert first[0].to_json() == again[0].to_json()
        assert first[3].log == again[3].log
