"""The real V2 Worker and GPUModelRunner on two virtual ranks (0.29.0, 0.33.0, 0.34.0).

A busy rank runs real steps (``Worker.execute_model`` then ``sample_tokens``)
on hand-built ``SchedulerOutput``s of the release's own class; an idle rank
runs the real ``execute_dummy_batch``. Planted bugs are textual edits of the
cached release's ``model_runner.py`` in a temporary tree.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpsim.lanes.runner.model_runner import MODEL_RUNNER_MODULE
from dpsim.lanes.runner.run import _real_sync
from dpsim.lanes.runner.scheduler import scheduler_types
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import collect_gaps
from dpsim.lanes.runner.syncs import Phases, recording_sync
from dpsim.lanes.runner.worker import build_worker
from dpsim.records.groups import DP_CPU_GROUP, EP_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import SYNC_EVENT
from dpsim.records.trace import Outcome, SimResult
from dpsim.sim import simulate

pytestmark = pytest.mark.release
RELEASES = ("0.29.0", "0.33.0", "0.34.0")
OPTIONS = EngineOptions(max_num_seqs=8, max_num_batched_tokens=64)
PIECEWISE = CapturePolicy(
    capture_sizes=(1, 2, 4, 8),
    cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
    max_num_seqs=8,
)


class Steps:
    """Hand-built scheduler outputs of the release's own classes."""

    def __init__(self, sources: RunnerSources, num_spec_tokens: int = 0) -> None:
        self.types: Any = scheduler_types(sources)
        # What 0.33's scheduler asks the drafter for (its K, every step).
        self.num_spec_tokens = num_spec_tokens

    def _output(self) -> Any:
        output = self.types.SchedulerOutput.make_empty()
        if "num_spec_tokens_to_schedule" in self.types.output_fields:
            output.num_spec_tokens_to_schedule = self.num_spec_tokens
        return output

    def prefill(self, ids: list[str], prompt: int) -> Any:
        types = self.types
        names = {f.name for f in dataclasses.fields(types.NewRequestData)}
        given = {
            "prompt_token_ids": [1] * prompt,
            "prefill_token_ids": [1] * prompt,
            "mm_features": [],
            "sampling_params": None,
            "pooling_params": None,
            "block_ids": ([0],),
            "num_computed_tokens": 0,
            "lora_request": None,
        }
        output = self._output()
        output.scheduled_new_reqs = [
            types.NewRequestData(
                req_id=req_id, **{k: v for k, v in given.items() if k in names}
            )
            for req_id in ids
        ]
        output.num_scheduled_tokens = dict.fromkeys(ids, prompt)
        output.total_num_scheduled_tokens = prompt * len(ids)
        return output

    def decode(self, ids: list[str], computed: int) -> Any:
        output = self._output()
        cached = output.scheduled_cached_reqs
        cached.req_ids = list(ids)
        cached.num_computed_tokens = [computed] * len(ids)
        cached.new_block_ids = [None] * len(ids)
        output.num_scheduled_tokens = dict.fromkeys(ids, 1)
        output.total_num_scheduled_tokens = len(ids)
        return output

    def empty(self) -> Any:
        return self._output()


def _run(
    sources: RunnerSources,
    programs: dict[int, Callable[[Any, Steps], Any]],
    policy: CapturePolicy = PIECEWISE,
) -> tuple[SimResult, list[str]]:
    """Each rank's program gets its own real worker; the run's gaps too."""
    target = sources.target
    steps = Steps(sources)
    workers = [
        build_worker(
            sources,
            OPTIONS,
            policy,
            rank,
            len(programs),
            speculator=None,
            sync=recording_sync(target, _real_sync(target), Phases()),
        )
        for rank in range(len(programs))
    ]
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
        sampled.append(worker.sample_tokens(None).get_output().sampled_token_ids)
    return sampled


def _idle(worker: Any, steps: Steps) -> None:
    for _ in range(3):
        worker.execute_dummy_batch()


def _collectives(result: SimResult, rank: int, group: str) -> list[Any]:
    return [
        (c.signature.kind, c.signature.shape)
        for c in result.ranks[rank].collectives
        if c.group == group
    ]


@pytest.mark.parametrize("version", RELEASES)
def test_a_busy_rank_and_an_idle_ranks_dummy_batches_agree(version: str) -> None:
    sources = RunnerSources.for_release(version)
    result, gaps = _run(sources, {0: _busy, 1: _idle})
    assert gaps == []
    assert result.outcome == Outcome.OK, result.ranks
    assert result.returns()[0] == [[[0], [0]]] * 3
    for group in (DP_CPU_GROUP, EP_GROUP):
        assert _collectives(result, 0, group) == _collectives(result, 1, group)
    assert len(_collectives(result, 0, DP_CPU_GROUP)) == 3
    # The syncs the real code made are recorded, the idle rank's as dummies.
    syncs = [e.payload for e in result.ranks[1].events if e.kind == SYNC_EVENT]
    assert [s["phase"] for s in syncs] == [
        "iter 1 model",
        "iter 2 model",
        "iter 3 model",
    ]
    assert {s["inputs"]["kind"] for s in syncs} == {"dummy"}


@pytest.mark.parametrize("version", RELEASES)
def test_the_real_early_return_leaves_a_peer_waiting_without_the_engine(
    version: str,
) -> None:
    # execute_model returns before the DP all-reduce on a 0-token step; only
    # the engine loop's dummy batch keeps the ranks paired (RUNNER_LANE.md).
    sources = RunnerSources.for_release(version)

    def zero_tokens(worker: Any, steps: Steps) -> Any:
        return worker.execute_model(steps.empty())

    result, gaps = _run(sources, {0: _busy, 1: zero_tokens})
    assert gaps == []
    assert result.outcome == Outcome.HANG
    assert _collectives(result, 1, DP_CPU_GROUP) == []


def test_the_worker_probes_a_v1_attribute_the_v2_runner_lacks() -> None:
    sources = RunnerSources.for_release("0.33.0")
    worker = build_worker(
        sources,
        OPTIONS,
        PIECEWISE,
        0,
        1,
        speculator=None,
        sync=lambda *args, **kwargs: None,
    )
    with collect_gaps() as gaps:
        assert getattr(worker.model_runner, "uniform_decode_query_len", 1) == 1
    assert gaps == []


def _planted(tmp_path: Path, version: str, old: str, new: str) -> RunnerSources:
    """A copy of the cached release with one edit to its model_runner.py."""
    base = RunnerSources.for_release(version)
    tree = tmp_path / "vllm"
    shutil.copytree(base.package_dir, tree)
    path = tree / "v1/worker/gpu/model_runner.py"
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {version}'s model_runner.py"
    path.write_text(text.replace(old, new))
    sources = RunnerSources.for_tree(tree)
    assert sources.path(MODEL_RUNNER_MODULE) == path
    return sources


@pytest.mark.parametrize("version", RELEASES)
def test_a_dummy_batch_run_at_its_local_count_is_caught(
    version: str, tmp_path: Path
) -> None:
    # Bug class of vLLM 25906: the dummy batch runs its own count, not the
    # agreed padded one, so its forward's shape differs from its peers'.
    sources = _planted(
        tmp_path,
        version,
        "input_batch = InputBatch.make_dummy(\n                dummy_num_reqs,\n"
        "                batch_desc.num_tokens,",
        "input_batch = InputBatch.make_dummy(\n                dummy_num_reqs,\n"
        "                num_toks,",
    )
    result, gaps = _run(sources, {0: _busy, 1: _idle})
    assert gaps == []
    # vLLM's own check in the forward context (DPMetadata.make): this rank's
    # count is not its entry in the agreed counts. Its peer waits in the EP
    # collective of the forward.
    assert result.outcome == Outcome.CRASH
    error = result.ranks[1].error
    assert error is not None and error.type == "AssertionError"
    assert error.message == "8 1"


@pytest.mark.parametrize("version", RELEASES)
def test_a_stand_in_asked_what_it_was_not_written_for_is_a_gap(
    version: str, tmp_path: Path
) -> None:
    sources = _planted(
        tmp_path,
        version,
        "self.step_timing.forward_end()",
        "self.step_timing.forward_finished()",
    )
    result, gaps = _run(sources, {0: _busy, 1: _idle})
    assert len(gaps) == 1
    assert gaps[0].startswith(
        "StepTimingCollector.forward_finished read at v1/worker/gpu/model_runner.py:"
    )
    assert gaps[0].endswith(" in _dummy_run")
    assert result.outcome != Outcome.OK


@pytest.mark.parametrize("version", RELEASES)
def test_an_attribute_the_runner_was_not_given_is_a_gap(version: str) -> None:
    sources = RunnerSources.for_release(version)

    def forgetful(worker: Any, steps: Steps) -> None:
        del worker.model_runner.block_tables
        worker.execute_model(steps.prefill(["a"], 2))

    result, gaps = _run(sources, {0: forgetful})
    assert gaps and gaps[0].startswith(
        "GPUModelRunner.block_tables read at v1/worker/gpu/model_runner.py:"
    )
    assert result.outcome == Outcome.CRASH
