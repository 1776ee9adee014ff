"""The runner lane's engine on releases before 0.21: vLLM's real
``DPEngineCoreProc`` busy loop of 0.12.0-0.20 (``while True`` through 0.17,
``while self._handle_shutdown()`` from 0.18; ``has_unfinished_dp`` every 32
steps), with C's modelled scheduler and the engine tests' fake worker.

Each fact the engine builder reads from a release (loop form, which DP-state
sync, which coordinator protocol) is checked here against the release's own
files; the releases are the representative set 0.12.0, 0.13.0, 0.14.0,
0.17.0, 0.18.0 and 0.20.0 (cached).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from test_lanes_runner_engine import (
    ONE_REQUEST,
    _engine_dp,
    _run,
    _SeededChooser,
)

from dpsim.errors import TargetError
from dpsim.lanes.runner import engine as engine_module
from dpsim.lanes.runner.coordinator import (
    front_end_wake_marks_running,
    front_end_wakes_engines,
)
from dpsim.lanes.runner.extract import class_node
from dpsim.lanes.runner.scheduler import (
    INTERFACE_MODULE,
    OUTPUT_MODULE,
    ModelledScheduler,
)
from dpsim.lanes.runner.sources import RunnerSources, wheel_prefixes
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import ModelGap, collect_gaps, standin
from dpsim.records.groups import DP_CPU_GROUP, ENGINE_DP_GROUP
from dpsim.records.trace import Outcome, RankState
from dpsim.targets.cache import ensure_release
from dpsim.targets.spec import ReleaseSpec, TargetSpec

pytestmark = pytest.mark.release

#: The files the engine and the modelled scheduler read.
ENGINE_FILES = (
    *engine_module.ENGINE_MODULES,
    "vllm.v1.engine",
    OUTPUT_MODULE,
    INTERFACE_MODULE,
)
#: 0.12-0.17: ``while True``; 0.18-0.20: ``while self._handle_shutdown()``.
WHILE_TRUE = ["0.12.0", "0.13.0", "0.14.0", "0.17.0"]
CHECKS_SHUTDOWN = ["0.18.0", "0.20.0"]
OLDER = WHILE_TRUE + CHECKS_SHUTDOWN


def _sources(version: str, core: Path | None = None) -> RunnerSources:
    """The release's engine files, fetched as the V1 runner lane keeps them.

    Built directly, not through ``RunnerSources.for_release``: what the
    engine drives does not depend on how far down a model runner goes."""
    package_dir = ensure_release(
        version, runner="v1", extra=wheel_prefixes(ENGINE_FILES)
    )
    sources = RunnerSources(
        package_dir, version, spec=TargetSpec(ReleaseSpec(version), runner="v1")
    )
    if core is not None:
        sources.overrides[engine_module.ENGINE_CORE_MODULE] = core
    return sources


def _dp_method_source(sources: RunnerSources, name: str) -> str:
    path = sources.path(engine_module.ENGINE_CORE_MODULE)
    node = class_node(path, "DPEngineCoreProc", version=sources.version)
    (method,) = (m for m in node.body if getattr(m, "name", None) == name)
    source = ast.get_source_segment(path.read_text(), method)
    assert source is not None
    return source


def _kept(version: str, class_name: str) -> tuple[str, ...]:
    origins = engine_module.engine_classes(_sources(version)).origins
    (origin,) = (o for o in origins if o.class_name == class_name)
    return origin.methods


# -- what the builder reads from each release's files --------------------------------


@pytest.mark.parametrize("version", OLDER)
def test_the_loop_form_and_dp_state_sync_are_read_from_the_files(
    version: str,
) -> None:
    sources = _sources(version)
    core = sources.path(engine_module.ENGINE_CORE_MODULE).read_text()
    classes = engine_module.engine_classes(sources)

    checks = version in CHECKS_SHUTDOWN
    assert classes.checks_shutdown is checks
    loop = _dp_method_source(sources, "run_busy_loop")
    assert ("while self._handle_shutdown():" in loop) is checks
    assert ("while True:" in loop) is not checks
    assert loop.count("self._process_input_queue()") == 1
    # Before 0.21 the engines' unfinished-requests vote is has_unfinished_dp,
    # every 32 steps; sync_dp_state does not exist yet.
    assert _kept(version, "ParallelConfig") == ("has_unfinished_dp",)
    assert "ParallelConfig.has_unfinished_dp(self.dp_group" in core
    assert "self.step_counter % 32 != 0" in core
    kept = _kept(version, "EngineCoreProc")
    assert ("_handle_shutdown" in kept) is checks


def test_from_0_21_sync_dp_state_alone_is_kept() -> None:
    # 0.21 still defines has_unfinished_dp, unused: only what the loop calls.
    sources = _sources("0.21.0")
    parallel = sources.path(engine_module.PARALLEL_CONFIG_MODULE).read_text()
    assert "def has_unfinished_dp(" in parallel and "def sync_dp_state(" in parallel
    assert _kept("0.21.0", "ParallelConfig")[0] == "sync_dp_state"
    assert "has_unfinished_dp" not in _kept("0.21.0", "ParallelConfig")


@pytest.mark.parametrize("version", OLDER)
def test_the_older_coordinators_wake_and_mark_running_on_a_front_ends_request(
    version: str,
) -> None:
    # 0.12-0.28's DPCoordinatorProc: START_DP_WAVE from the front-end branch
    # and the engine branch, and engines_running = True in both.
    path = _sources(version).path(engine_module.COORDINATOR_MODULE)
    assert front_end_wakes_engines(path, version)
    assert front_end_wake_marks_running(path, version)


def test_a_release_with_no_dp_state_sync_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    sources = _sources("0.12.0")
    text = sources.path(engine_module.PARALLEL_CONFIG_MODULE).read_text()
    renamed = tmp_path / "parallel.py"
    renamed.write_text(text.replace("def has_unfinished_dp(", "def unfinished_dp("))
    sources.overrides[engine_module.PARALLEL_CONFIG_MODULE] = renamed
    with pytest.raises(TargetError) as refused:
        engine_module.engine_classes(sources)
    assert str(refused.value) == (
        "runner lane: vLLM 0.12.0's parallel.py has no ParallelConfig."
        "sync_dp_state or has_unfinished_dp, one of which the engine loop calls"
    )


# -- the real loop ------------------------------------------------------------------

#: Rank 0 busy from the start, rank 1's request arrives after the first wave
#: ended (32 steps), rank 2 idle throughout.
TWO_WAVES = [
    RankStream((RequestScript("a", 0, 4, 3),)),
    RankStream((RequestScript("b", 40, 2, 2),)),
    RankStream(()),
]


@pytest.mark.parametrize("version", OLDER)
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_waves_start_and_end_idle_ranks_run_dummy_batches_and_all_shut_down(
    version: str, async_scheduling: bool
) -> None:
    options = EngineOptions(async_scheduling=async_scheduling)
    result, workers, gaps, coordinator, iterations = _run(
        _sources(version), options, TWO_WAVES
    )

    assert gaps == []
    assert result.outcome is Outcome.OK
    # Every loop ended by its shutdown (0.12-0.17: SystemExit from the input
    # get; 0.18+: _handle_shutdown), once every engine was idle.
    assert all(trace.state is RankState.FINISHED for trace in result.ranks)
    assert len(iterations) == 3
    # Wave 0: rank 0's request; rank 1's late request is for the completed
    # wave 0 and wakes everyone into wave 1 (the front-end's FIRST_REQ).
    assert coordinator.log[:2] == [("start", 0, 0), ("complete", 0, 0)]
    assert ("start", 1, 1) in coordinator.log
    assert coordinator.log[-1] == ("complete", 1, 0)
    assert coordinator.current_wave == 2 and not coordinator.engines_running
    busy, late, idle = workers
    assert busy.calls[0] == "execute_model 4" and "execute_model 2" in late.calls
    assert set(idle.calls) == {"dummy"}
    # Two waves of 32 steps each: every rank votes twice, all 0 at the end.
    for rank in range(3):
        votes = _engine_dp(result, rank)
        assert len(votes) == 2 and votes[-1] == [0]
    # Every rank makes the model runner's DP all-reduce at every step it runs.
    counts = {
        sum(1 for r in trace.collectives if r.group == DP_CPU_GROUP)
        for trace in result.ranks
    }
    assert counts == {64}


@pytest.mark.parametrize("version", ["0.12.0", "0.18.0"])
def test_any_interleaving_is_ok_and_replays_byte_for_byte(version: str) -> None:
    sources = _sources(version)
    options = EngineOptions()
    for seed in range(6):
        first = _run(sources, options, TWO_WAVES, chooser=_SeededChooser(seed))
        again = _run(sources, options, TWO_WAVES, chooser=_SeededChooser(seed))
        assert first[2] == [] and first[0].outcome is Outcome.OK, seed
        assert first[0].to_json() == again[0].to_json()
        assert first[3].log == again[3].log


@pytest.mark.parametrize("version", OLDER)
def test_an_engine_skipping_its_dummy_batch_hangs_its_peers(
    version: str, tmp_path: Path
) -> None:
    sources = _sources(version)
    text = sources.path(engine_module.ENGINE_CORE_MODULE).read_text()
    real = "                self.execute_dummy_batch()\n"
    assert text.count(real) == 1
    planted = tmp_path / "core.py"
    # Planted bug: an engine with no local requests skips its dummy batch.
    planted.write_text(
        text.replace(
            real,
            "                if local_unfinished_reqs:\n"
            "                    self.execute_dummy_batch()\n",
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


# -- strictness ------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "line"), [("0.12.0", 295), ("0.18.0", 322)])
def test_a_scheduler_asked_what_it_was_not_written_for_refuses(
    version: str, line: int
) -> None:
    scheduler = standin("Scheduler", has_requests=lambda: False)
    stream = RankStream((RequestScript("r0", 0, 4, 1),))
    _, _, gaps, _, _ = _run(
        _sources(version), EngineOptions(), [stream], scheduler=scheduler
    )
    assert gaps and gaps[0].startswith(
        f"Scheduler.add_request read at v1/engine/core.py:{line} in add_request"
    ), gaps


def test_the_scheduler_has_no_pause_state_before_0_17() -> None:
    sources = _sources("0.12.0")
    interface = sources.path(INTERFACE_MODULE).read_text()
    assert "class PauseState" not in interface
    scheduler: Any = ModelledScheduler(RankStream(()), EngineOptions(), sources)
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        _ = scheduler.pause_state
    assert gaps == ["Scheduler.pause_state read at (no vLLM frame on the stack)"]
