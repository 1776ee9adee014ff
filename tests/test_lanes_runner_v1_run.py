"""run_runner_case for a V1 runner case: the V1 builders per rank, the
shared engine/scheduler/coordinator, the trace marked as V1's.

The fast tests check the wiring with small fakes (written here) in place of
the V1 worker and proposer builders; the release-marked ones run the shared
fake engine of ``test_lanes_runner_run`` on a V1-loaded target, and a real
V1 case end to end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_lanes_runner_run import _builders

from dpsim.errors import TargetError
from dpsim.lanes.runner import run as run_module
from dpsim.lanes.runner import v1 as v1_package
from dpsim.lanes.runner.case import RunnerCase
from dpsim.lanes.runner.run import default_builders, run_runner_case
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.v1 import proposer as v1_proposer
from dpsim.lanes.runner.worker import build_worker
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import RUNNER_EVENT
from dpsim.records.trace import Outcome


def _case(runner: str = "v1", speculator: str | None = None, k: int = 0) -> RunnerCase:
    options = EngineOptions(speculator=speculator, num_speculative_tokens=k)
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        max_num_seqs=options.max_num_seqs,
        decode_query_len=options.decode_query_len,
    )
    busy = RankStream((RequestScript("a", 0, 5, 3),))
    return RunnerCase(policy, options, (busy, RankStream()), runner=runner)


def test_the_v2_builders_are_as_they_were() -> None:
    parts = default_builders()
    assert parts.worker is build_worker
    assert parts.sync is run_module.v2_recorder
    assert default_builders("v2") == parts


def test_a_v1_rank_gets_the_v1_worker_with_its_drafter_factory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The V1 worker builder is called with the rank's own arguments and a
    factory that makes the rank's drafter from the runner's kit; the engine,
    scheduler and coordinator builders are the V2 lane's."""
    calls: list[tuple[Any, ...]] = []

    def worker(*arguments: Any) -> str:
        calls.append(("worker", *arguments[:5]))
        factory = arguments[5]
        return f"worker with {factory('kit')}"

    def proposer(*arguments: Any) -> str:
        calls.append(("proposer", *arguments))
        return "drafter"

    monkeypatch.setattr(v1_package, "build_v1_worker", worker, raising=False)
    monkeypatch.setattr(v1_proposer, "build_v1_proposer", proposer)
    v1, v2 = default_builders("v1"), default_builders("v2")
    assert (v1.engine, v1.scheduler, v1.coordinator, v1.run_engine) == (
        v2.engine,
        v2.scheduler,
        v2.coordinator,
        v2.run_engine,
    )
    assert v1.sync("target") is None  # the V1 worker records its own syncs
    case = _case()
    factory = v1.speculator(
        "sources", case.options, case.policy, 1, 2, target="target", sync=None
    )
    made = v1.worker(
        "sources", case.options, case.policy, 1, 2, speculator=factory, sync=None
    )
    assert made == "worker with drafter"
    assert calls == [
        ("worker", "sources", case.options, case.policy, 1, 2),
        ("proposer", "sources", case.options, case.policy, 1, 2, "kit"),
    ]


def _fake_builders(tmp_path: Path) -> Any:
    # The shared fake engine calls its sync; here it records nothing.
    return replace(
        _builders(tmp_path, lambda rank: 1),
        sync=lambda target: lambda *arguments, **keywords: None,
    )


@pytest.mark.release
def test_every_v1_rank_marks_its_trace_as_v1s(
    release: Callable[..., Any], tmp_path: Path
) -> None:
    run = run_runner_case(
        release("0.33.0", runner="v1"), _case(), builders=_fake_builders(tmp_path)
    )
    assert run.result.outcome == Outcome.OK
    for trace in run.result.ranks:
        assert trace.events[0].kind == RUNNER_EVENT
        assert trace.events[0].payload == {"runner": "v1"}
    v2 = run_runner_case(
        release("0.33.0"),
        _case("v2"),
        builders=_fake_builders(tmp_path / "v2"),
    )
    assert all(
        event.kind != RUNNER_EVENT
        for trace in v2.result.ranks
        for event in trace.events
    )


@pytest.mark.release
def test_a_v1_case_on_a_v2_loaded_target_is_refused(
    release: Callable[..., Any],
) -> None:
    with pytest.raises(TargetError) as refused:
        run_runner_case(release("0.33.0"), _case())
    assert "the case drives the V1 model runner, but " in str(refused.value)
