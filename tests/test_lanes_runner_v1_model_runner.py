"""The real V1 Worker and GPUModelRunner on two virtual ranks.

A busy rank runs real steps (``Worker.execute_model`` then ``sample_tokens``)
on hand-built ``SchedulerOutput``s of the release's own class (the V2 lane's
test helper :class:`Steps`); an idle rank runs the real
``execute_dummy_batch``. Planted bugs are textual edits of the cached
release's ``v1/worker/gpu_model_runner.py`` in a temporary tree.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_lanes_runner_worker import OPTIONS, PIECEWISE, Steps, _collectives, _idle

from dpsim.errors import TargetError
from dpsim.lanes.runner.case import RunnerCase
from dpsim.lanes.runner.run import default_builders, run_runner_case
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import collect_gaps
from dpsim.lanes.runner.syncs import DRAFTER_FORWARD_EVENT
from dpsim.lanes.runner.v1.model_runner import MODEL_RUNNER_MODULE
from dpsim.lanes.runner.v1.worker import build_v1_worker
from dpsim.records.groups import DP_DEVICE_GROUP, EP_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import SYNC_EVENT
from dpsim.records.trace import Outcome, SimResult
from dpsim.sim import simulate
from dpsim.targets.load import load_spec
from dpsim.targets.spec import ReleaseSpec, TargetSpec, TreeSpec

pytestmark = pytest.mark.release
#: The oldest the lane drives, the V2 lane's oldest, and a few on to the newest.
RELEASES = ("0.12.0", "0.21.0", "0.26.0", "0.29.0", "0.33.0")


def _sources(version: str) -> RunnerSources:
    return RunnerSources.for_release(version, "v1")


def _run(
    sources: RunnerSources,
    programs: dict[int, Callable[[Any, Steps], Any]],
    backend: str | None = None,
) -> tuple[SimResult, list[str]]:
    """Each rank's program gets its own real V1 worker (its parallel config's
    executor backend set to ``backend`` if given); the run's gaps too."""
    steps = Steps(sources)
    workers = [
        build_v1_worker(sources, OPTIONS, PIECEWISE, rank, len(programs))
        for rank in range(len(programs))
    ]
    if backend is not None:
        for worker in workers:
            worker.parallel_config.distributed_executor_backend = backend
    with collect_gaps() as gaps:
        result = simulate(
            lambda rank: programs[rank](workers[rank], steps), ranks=len(programs)
        )
    return result, gaps


def _busy(worker: Any, steps: Steps) -> list[Any]:
    """Two requests: a 3-token prefill, then two decodes."""
    ids = ["a", "b"]
    sampled = []
    for output in (steps.prefill(ids, 3), steps.decode(ids, 3), steps.decode(ids, 4)):
        assert worker.execute_model(output) is None
        sampled.append(worker.sample_tokens(None).sampled_token_ids)
    return sampled


def _syncs(result: SimResult, rank: int) -> list[dict[str, Any]]:
    return [e.payload for e in result.ranks[rank].events if e.kind == SYNC_EVENT]


@pytest.mark.parametrize("version", RELEASES)
def test_a_busy_rank_and_an_idle_ranks_dummy_batches_agree(version: str) -> None:
    result, gaps = _run(_sources(version), {0: _busy, 1: _idle})
    assert gaps == []
    assert result.outcome == Outcome.OK, result.ranks
    assert result.returns()[0] == [[[0], [0]]] * 3
    for group in (DP_DEVICE_GROUP, EP_GROUP):
        assert _collectives(result, 0, group) == _collectives(result, 1, group)
    # One real coordinate_batch_across_dp all-reduce per step, on the DP
    # device group (V1's default), and one forward each.
    assert len(_collectives(result, 0, DP_DEVICE_GROUP)) == 3
    assert len(_collectives(result, 0, EP_GROUP)) == 3
    busy, idle = _syncs(result, 0), _syncs(result, 1)
    assert [s["phase"] for s in idle] == [f"iter {n} model" for n in (1, 2, 3)]
    assert {s["inputs"]["kind"] for s in idle} == {"dummy"}
    assert [s["inputs"]["kind"] for s in busy] == ["batch", "decode", "decode"]
    # Both ranks read the same agreement off the same all-reduce.
    assert [s["agreement"] for s in busy] == [s["agreement"] for s in idle]
    assert busy[1]["descriptor"]["cg_mode"] == "FULL"


@pytest.mark.parametrize("version", RELEASES)
def test_the_real_early_return_leaves_a_peer_waiting_without_the_engine(
    version: str,
) -> None:
    # execute_model returns before the DP all-reduce on a 0-token step; only
    # the engine loop's dummy batch keeps the ranks paired.
    result, gaps = _run(_sources(version), {0: _busy, 1: _zero_tokens})
    assert gaps == []
    assert result.outcome == Outcome.HANG
    assert _collectives(result, 1, DP_DEVICE_GROUP) == []


def _planted(tmp_path: Path, version: str, old: str, new: str) -> RunnerSources:
    """A copy of the cached release with one edit to its gpu_model_runner.py."""
    base = _sources(version)
    tree = tmp_path / "vllm"
    shutil.copytree(base.package_dir, tree)
    path = tree / "v1/worker/gpu_model_runner.py"
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {version}'s runner"
    path.write_text(text.replace(old, new))
    sources = RunnerSources.for_spec(TargetSpec(TreeSpec(tree), runner="v1"))
    assert sources.path(MODEL_RUNNER_MODULE) == path
    return sources


def _prefill(worker: Any, steps: Steps) -> Any:
    assert worker.execute_model(steps.prefill(["a"], 3)) is None
    return worker.sample_tokens(None).sampled_token_ids


def _zero_tokens(worker: Any, steps: Steps) -> Any:
    return worker.execute_model(steps.empty())


#: execute_model's dummy run for a rank with nothing scheduled under torchrun.
EXTERNAL_LAUNCHER_DUMMY = "                    self._dummy_run(1)\n"


@pytest.mark.parametrize("version", ("0.12.0", "0.33.0"))
def test_under_an_external_launcher_the_early_return_runs_a_dummy_batch(
    version: str,
) -> None:
    # Without the engine loop's dummy batch, execute_model itself keeps a
    # rank with nothing scheduled in the DP sync (the real code's corner case).
    result, gaps = _run(
        _sources(version), {0: _prefill, 1: _zero_tokens}, "external_launcher"
    )
    assert gaps == []
    assert result.outcome == Outcome.OK, result.ranks
    assert _collectives(result, 0, DP_DEVICE_GROUP) == _collectives(
        result, 1, DP_DEVICE_GROUP
    )
    assert [s["inputs"]["kind"] for s in _syncs(result, 1)] == ["dummy"]


@pytest.mark.parametrize("version", ("0.12.0", "0.33.0"))
def test_an_early_return_without_its_dummy_run_is_caught(
    version: str, tmp_path: Path
) -> None:
    sources = _planted(
        tmp_path, version, EXTERNAL_LAUNCHER_DUMMY, "                    pass\n"
    )
    result, gaps = _run(sources, {0: _prefill, 1: _zero_tokens}, "external_launcher")
    assert gaps == []
    assert result.outcome == Outcome.HANG
    assert _collectives(result, 1, DP_DEVICE_GROUP) == []


@pytest.mark.parametrize("version", ("0.12.0", "0.33.0"))
def test_a_dummy_run_at_its_local_count_is_caught(version: str, tmp_path: Path) -> None:
    # Bug class of vLLM 25906 in the V1 runner: the dummy run forwards its
    # own count, not the agreed padded one.
    sources = _planted(
        tmp_path,
        version,
        "        num_tokens_padded = batch_desc.num_tokens\n        num_reqs_padded",
        "        num_tokens_padded = num_tokens_unpadded\n        num_reqs_padded",
    )
    result, gaps = _run(sources, {0: _busy, 1: _idle})
    assert gaps == []
    # vLLM's own count check in the forward context (DPMetadata.make) stops
    # the idle rank; its peer waits in the forward's EP collective.
    assert result.outcome == Outcome.CRASH
    error = result.ranks[1].error
    assert error is not None and error.type == "AssertionError"


@pytest.mark.parametrize("version", ("0.17.0", "0.33.0"))
def test_a_stand_in_asked_what_it_was_not_written_for_is_a_gap(
    version: str, tmp_path: Path
) -> None:
    sources = _planted(
        tmp_path,
        version,
        "if self.cache_config.kv_sharing_fast_prefill:\n"
        "                assert not self.num_prompt_logprobs",
        "if self.cache_config.kv_sharing_fast_prefill_v2:\n"
        "                assert not self.num_prompt_logprobs",
    )
    result, gaps = _run(sources, {0: _busy, 1: _idle})
    assert len(gaps) == 1
    assert gaps[0].startswith(
        "CacheConfig.kv_sharing_fast_prefill_v2 read at v1/worker/gpu_model_runner.py:"
    )
    assert gaps[0].endswith(" in execute_model")
    assert result.outcome != Outcome.OK


def _drafting_case(version: str, kind: str, max_model_len: int) -> SimResult:
    """A busy rank (a 20-token prompt, then decodes) and an idle one, with
    ``kind``'s drafter at k = 3, through the whole lane (engine, scheduler)."""
    k = 3
    options = EngineOptions(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        speculator=kind,
        num_speculative_tokens=k,
        max_model_len=max_model_len,
    )
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
        max_num_seqs=8,
        decode_query_len=1 + k,
    )
    busy = RankStream((RequestScript("a", 0, 20, 6), RequestScript("b", 1, 4, 5)))
    case = RunnerCase(policy, options, (busy, RankStream()), runner="v1")
    target = load_spec(TargetSpec(ReleaseSpec(version), runner="v1"))
    return run_runner_case(target, case, builders=default_builders("v1")).result


def _drafter_forwards(result: SimResult, rank: int) -> list[int]:
    return [
        e.payload["tokens"]
        for e in result.ranks[rank].events
        if e.kind == DRAFTER_FORWARD_EVENT
    ]


@pytest.mark.parametrize("kind", ("eagle", "mtp"))
@pytest.mark.parametrize("version", ("0.21.0", "0.33.0"))
def test_a_drafting_rank_and_an_idle_one_draft_in_step(version: str, kind: str) -> None:
    result = _drafting_case(version, kind, max_model_len=256)
    assert result.outcome == Outcome.OK, result.ranks
    busy, idle = _syncs(result, 0), _syncs(result, 1)
    assert [s["phase"] for s in busy] == [s["phase"] for s in idle]
    assert "iter 2 drafter prefill" in [s["phase"] for s in busy]
    assert [s["agreement"] for s in busy] == [s["agreement"] for s in idle]
    # The idle rank's dummy drafter forwards as often as the busy one's.
    assert len(_drafter_forwards(result, 0)) == len(_drafter_forwards(result, 1))


@pytest.mark.parametrize(
    ("version", "outcome"), [("0.21.0", Outcome.HANG), ("0.26.0", Outcome.OK)]
)
def test_a_rank_whose_batch_does_not_fit_the_drafter(
    version: str, outcome: Outcome
) -> None:
    # The busy rank's request nears max_model_len: the real fit check in
    # sample_tokens skips its drafter. Up to 0.24 nothing else runs, so the
    # idle rank's dummy drafter waits for it; 0.25 added a dummy drafter run
    # under DP for this rank ("Prevent hang when DP ranks disagree on
    # input_fits_in_drafter").
    result = _drafting_case(version, "eagle", max_model_len=27)
    assert result.outcome == outcome, result.ranks
    if outcome == Outcome.HANG:
        assert len(_drafter_forwards(result, 0)) < len(_drafter_forwards(result, 1))


#: _dummy_run's forward context, given the agreed counts.
DUMMY_COUNTS = (
    "                    num_tokens_across_dp=num_tokens_across_dp,\n"
    "                    cudagraph_runtime_mode=cudagraph_runtime_mode,"
)


@pytest.mark.parametrize("version", ("0.12.0", "0.33.0"))
def test_a_forward_context_without_the_agreed_counts_coordinates_afresh(
    version: str, tmp_path: Path
) -> None:
    # Bug class of vLLM 56281: a caller under DP that does not pass the
    # agreed counts makes set_forward_context coordinate again, one more DP
    # all-reduce that only this rank makes; here the idle rank's dummy run.
    sources = _planted(
        tmp_path,
        version,
        DUMMY_COUNTS,
        DUMMY_COUNTS.replace("=num_tokens_across_dp,", "=None,"),
    )
    result, gaps = _run(sources, {0: _busy, 1: _idle})
    assert gaps == []
    assert result.outcome != Outcome.OK
    # The extra all-reduce is the release's own sync, on the DP device group.
    assert len(_collectives(result, 1, DP_DEVICE_GROUP)) > len(
        _collectives(result, 0, DP_DEVICE_GROUP)
    )


def test_a_gap_in_a_whole_lane_run_refuses_it_in_one_line(tmp_path: Path) -> None:
    sources = _planted(
        tmp_path,
        "0.33.0",
        "if self.cache_config.kv_sharing_fast_prefill:\n"
        "                assert not self.num_prompt_logprobs",
        "if self.cache_config.kv_sharing_fast_prefill_v2:\n"
        "                assert not self.num_prompt_logprobs",
    )
    busy = RankStream((RequestScript("a", 0, 4, 2),))
    case = RunnerCase(PIECEWISE, OPTIONS, (busy, RankStream()), runner="v1")
    target = load_spec(TargetSpec(TreeSpec(sources.package_dir), runner="v1"))
    with pytest.raises(TargetError) as refused:
        run_runner_case(target, case, builders=default_builders("v1"))
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith("runner lane cannot drive ")
    assert "CacheConfig.kv_sharing_fast_prefill_v2 read at " in said
