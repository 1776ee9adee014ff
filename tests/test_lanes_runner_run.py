"""run_runner_case: builds every rank's parts, simulates, refuses on any gap.

The fast tests put tiny fakes (written here, not vLLM's) in place of the
lane's parts: an "engine" whose loop is compiled under a model runner's file
name, so the sync recorder and the where-registry see it as they see vLLM.
The release-marked test runs a real 0.33.0 case end to end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dpsim.errors import TargetError
from dpsim.lanes.runner.case import RunnerCase
from dpsim.lanes.runner.run import (
    Builders,
    RunnerResult,
    run_runner_case,
    step_budget_for,
)
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import standin
from dpsim.lanes.runner.where import register_file
from dpsim.properties import RUNNER_LANE_PROPERTIES, judge
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import sync_records
from dpsim.records.trace import Outcome
from dpsim.sim.mailbox import Mailbox, Quiescence

POLICY = CapturePolicy(capture_sizes=(1, 2, 4, 8))
OPTIONS = EngineOptions()

_LOOP = """
def busy_loop(engine):
    for step in range(engine.steps):
        engine.sync(None, 1, engine.tokens, None, engine.dp_size, engine.rank,
                    need_eager=True)
    engine.ask()
    return engine.mailbox.get()
"""


class _Coordinator:
    """Shuts every parked engine down once, as the lane's coordinator does."""

    def __init__(self, mailboxes: Sequence[Mailbox]) -> None:
        self.mailboxes = mailboxes
        self.done = False

    def on_quiescent(self, now: Quiescence) -> bool:
        if self.done or set(now.parked) != set(now.blocked):
            return False
        self.done = True
        for rank in now.parked:
            self.mailboxes[rank].put("shutdown")
        return True


def _builders(
    tmp_path: Path,
    steps: Callable[[int], int],
    ask: Callable[[], Any] = lambda: None,
) -> Builders:
    path = tmp_path / "vllm" / "v1" / "worker" / "gpu" / "model_runner.py"
    path.parent.mkdir(parents=True)
    path.write_text(_LOOP)
    register_file(path)
    namespace: dict[str, Any] = {}
    exec(compile(_LOOP, str(path), "exec"), namespace)

    def engine(
        sources: Any,
        options: Any,
        scheduler: Any,
        worker: Any,
        rank: int,
        dp_size: int,
        mailbox: Mailbox,
        coordinator: Any,
        stream: Any = None,
    ) -> Any:
        return standin(
            "Engine",
            steps=steps(rank),
            tokens=len(stream.requests) + 1,
            sync=worker.sync,
            rank=rank,
            dp_size=dp_size,
            mailbox=mailbox,
            ask=ask,
        )

    return Builders(
        sources=lambda target: None,
        scheduler=lambda stream, options, sources: None,
        speculator=lambda *args, target, sync: None,
        worker=lambda *args, speculator, sync: standin("Worker", sync=sync),
        engine=engine,
        run_engine=lambda engine: namespace["busy_loop"](engine),
        coordinator=lambda sources, mailboxes: _Coordinator(mailboxes),
    )


def _case(dp_size: int = 2) -> RunnerCase:
    streams = [RankStream()] * dp_size
    streams[0] = RankStream((RequestScript("a", 0, 4, 2),))
    return RunnerCase(POLICY, OPTIONS, tuple(streams), seed=3)


def _run(release: Callable[[str], Any], builders: Builders) -> RunnerResult:
    return run_runner_case(release("0.33.0"), _case(), builders=builders)


@pytest.mark.release
def test_every_rank_runs_and_its_syncs_are_recorded(
    release: Callable[[str], Any], tmp_path: Path
) -> None:
    run = _run(release, _builders(tmp_path, lambda rank: 2))
    result = run.result
    assert result.outcome == Outcome.OK
    phases = [[r.phase for r in sync_records(t.events)] for t in result.ranks]
    assert phases == [["iter 1 model", "iter 2 model"]] * 2
    assert run.stood_at == ((), ())
    assert judge(_case(), result, RUNNER_LANE_PROPERTIES.values()) == []
    # engine_dp is declared beside the default groups.
    assert "engine_dp" in dict(result.groups)


@pytest.mark.release
def test_a_hang_says_where_each_rank_stood_in_vllm(
    release: Callable[[str], Any], tmp_path: Path
) -> None:
    run = _run(release, _builders(tmp_path, lambda rank: 2 if rank == 0 else 1))
    assert run.result.outcome == Outcome.HANG
    # The innermost vLLM frame is the sync's own once the release's dp_utils
    # counts as vLLM's (it does after a real run in the same process).
    assert run.where(0) is not None
    assert any(
        line.startswith("v1/worker/gpu/model_runner.py:")
        and line.endswith("in busy_loop")
        for line in run.stood_at[0]
    )
    verdicts = judge(_case(), run.result, RUNNER_LANE_PROPERTIES.values())
    assert [v.property for v in verdicts][:1] == ["no-hang"]


@pytest.mark.release
def test_a_gap_refuses_the_run_even_when_swallowed(
    release: Callable[[str], Any], tmp_path: Path
) -> None:
    def ask() -> None:
        # A stand-in asked something unknown, the exception swallowed (as
        # vLLM's `except Exception` or getattr(x, n, default) would).
        with contextlib.suppress(Exception):
            standin("Scheduler").pause_state  # noqa: B018

    with pytest.raises(TargetError) as refused:
        _run(release, _builders(tmp_path, lambda rank: 1, ask))
    text = str(refused.value)
    assert text.startswith("runner lane cannot drive vllm 0.33.0: ")
    assert "Scheduler.pause_state" in text and "\n" not in text


@pytest.mark.release
def test_a_target_loaded_for_the_other_runner_is_refused(
    release: Callable[..., Any],
) -> None:
    v1 = release("0.33.0", runner="v1")
    with pytest.raises(TargetError) as refused:
        run_runner_case(v1, _case())
    assert "the case drives the V2 model runner, but " in str(refused.value)
    assert str(refused.value).endswith(" was loaded for the V1 runner")


# -- the real lane, end to end ----------------------------------------------------


def _real_case(
    speculator: str | None = None, k: int = 0, idle: bool = True
) -> RunnerCase:
    options = EngineOptions(speculator=speculator, num_speculative_tokens=k)
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        max_num_seqs=options.max_num_seqs,
        decode_query_len=options.decode_query_len,
    )
    busy = RankStream((RequestScript("a", 0, 5, 3),))
    other = RankStream() if idle else RankStream((RequestScript("b", 2, 3, 2),))
    return RunnerCase(policy, options, (busy, other))


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "speculator", "k"),
    [
        ("0.34.0", None, 0),
        ("0.34.0", "mtp", 2),
        ("0.33.0", None, 0),
        ("0.29.0", None, 0),
        ("0.29.0", "ar", 2),
    ],
)
def test_a_real_case_runs_end_to_end(
    release: Callable[[str], Any], version: str, speculator: str | None, k: int
) -> None:
    """A busy rank and an idle one through the release's real engine loop,
    worker, model runner (and speculator): the idle rank runs dummy batches
    in lockstep, every rank shuts down, no property fails."""
    case = _real_case(speculator, k)
    run = run_runner_case(release(version), case)
    result = run.result
    assert result.outcome == Outcome.OK
    busy, idle = (sync_records(trace.events) for trace in result.ranks)
    assert [r.phase for r in busy] == [r.phase for r in idle]
    assert busy[0].inputs.kind == "batch" and busy[0].inputs.num_tokens == 5
    assert {r.inputs.kind for r in idle} == {"dummy"}
    if speculator:
        assert "iter 1 drafter prefill" in {r.phase for r in idle}
    assert judge(case, result, RUNNER_LANE_PROPERTIES.values()) == []
    # Byte for byte the same on a second run.
    assert run_runner_case(release(version), case).result.to_json() == result.to_json()


def test_the_step_budget_grows_with_the_work_a_case_can_need() -> None:
    small = _real_case()
    longer = replace(
        small,
        streams=(RankStream((RequestScript("a", 0, 5, 300),)), RankStream()),
    )
    assert step_budget_for(longer) > step_budget_for(small)
    slower = replace(small, options=replace(small.options, dp_sync_interval=500))
    assert step_budget_for(slower) > step_budget_for(small)


@pytest.mark.release
def test_an_engine_whose_wave_never_ends_is_stopped_by_the_cases_budget(
    release: Callable[[str], Any],
    release_file: Callable[[str, str], Path],
    tmp_path: Path,
) -> None:
    """The engine loop dropping its unfinished-requests vote (a mutant
    ``dpsim mutate --lane runner`` makes) keeps every engine stepping dummy
    batches forever: the case's own step budget stops it (a ``budget``
    verdict), not the wall clock, and within that budget."""
    import shutil

    package = release_file("0.33.0", "v1/engine/core.py").parents[2]
    tree = tmp_path / "vllm"
    shutil.copytree(package, tree)
    core = tree / "v1" / "engine" / "core.py"
    text = core.read_text()
    vote = "self.engines_running = self._has_global_unfinished_reqs("
    assert text.count(vote) == 1
    core.write_text(text.replace(vote, "self._has_global_unfinished_reqs("))
    case = _real_case()
    run = run_runner_case(release(str(tree)), case)
    assert run.result.outcome == Outcome.BUDGET
    assert max(trace.steps for trace in run.result.ranks) <= step_budget_for(case) + 1


@pytest.mark.release
def test_a_planted_engine_bug_is_a_hang_located_in_vllm(
    release: Callable[[str], Any],
    release_file: Callable[[str, str], Path],
    tmp_path: Path,
) -> None:
    """An engine with no local requests skipping its dummy batch (a textual
    edit of the cached release's core.py, in a copied tree): the busy rank
    waits in the model runner's DP sync and the verdict says where."""
    import shutil

    package = release_file("0.33.0", "v1/engine/core.py").parents[2]
    tree = tmp_path / "vllm"
    shutil.copytree(package, tree)
    core = tree / "v1" / "engine" / "core.py"
    text = core.read_text()
    planted = text.replace(
        "elif not self.model_executor.is_sleeping:",
        "elif local_unfinished_reqs and not self.model_executor.is_sleeping:",
    )
    assert planted != text
    core.write_text(planted)
    case = _real_case()
    run = run_runner_case(release(str(tree)), case)
    assert run.result.outcome == Outcome.HANG
    verdicts = judge(case, run.result, RUNNER_LANE_PROPERTIES.values())
    assert [v.property for v in verdicts] == ["no-hang"]
    # The busy rank waits in its step's sync; the idle one skipped its dummy
    # batch and waits in the engines' unfinished-requests all-reduce.
    assert any(
        line.startswith("v1/worker/gpu/model_runner.py:")
        and line.endswith(" in execute_model")
        for line in run.stood_at[0]
    )
    assert any("in _has_global_unfinished_reqs" in line for line in run.stood_at[1])


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.29.0", "0.33.0", "0.34.0"])
def test_what_the_lane_finds_on_real_releases_full_graphs_and_a_dummy_drafter(
    release: Callable[[str], Any], version: str
) -> None:
    """Finding (examined on the code, not confirmed on GPUs): with
    cudagraph_mode FULL and a drafter, an engine whose step is a dummy batch
    (idle, or its one request waiting for KV) crashes in its drafter's
    prefill sync. FULL graphs pad requests (min(tokens, max_num_seqs)), the
    dummy input batch spreads 1 + k tokens over the padded requests (1 each),
    so the drafter's uniform decode length (1) is not the one the dummy's
    target sync agreed (1 + k): dp_utils' reuse assertion."""
    options = EngineOptions(
        max_num_seqs=2,
        max_num_batched_tokens=8,
        max_model_len=16,
        speculator="ar",
        num_speculative_tokens=1,
    )
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode="FULL",
        max_num_seqs=2,
        decode_query_len=2,
    )
    waiting = RankStream((RequestScript("r1-0", 0, 1, 1, kv_wait=1),))
    case = RunnerCase(policy, options, (RankStream(), waiting))
    run = run_runner_case(release(version), case)
    verdicts = judge(case, run.result, RUNNER_LANE_PROPERTIES.values())
    assert verdicts[0].property == "no-error"
    assert verdicts[0].phase is not None and "drafter prefill" in verdicts[0].phase
    assert "reusing a DP sync taken over a different batch" in verdicts[0].message
    # Not FULL: the same engines run clean.
    piecewise = RunnerCase(
        CapturePolicy(
            capture_sizes=(1, 2, 4, 8),
            cudagraph_mode="FULL_AND_PIECEWISE",
            max_num_seqs=2,
            decode_query_len=2,
        ),
        options,
        case.streams,
    )
    clean = run_runner_case(release(version), piecewise)
    assert judge(piecewise, clean.result, RUNNER_LANE_PROPERTIES.values()) == []


@pytest.mark.release
def test_a_gap_while_building_a_rank_refuses_the_run(
    release: Callable[[str], Any], tmp_path: Path
) -> None:
    def worker(*args: Any, speculator: Any, sync: Any) -> Any:
        return standin("Worker").model_runner  # asked while building: a gap

    builders = _builders(tmp_path, lambda rank: 1)
    with pytest.raises(TargetError, match=r"Worker\.model_runner"):
        _run(release, replace(builders, worker=worker))


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "crashes"), [("0.30.0", False), ("0.33.0", True), ("0.34.0", True)]
)
def test_what_the_lane_finds_on_real_releases_an_idle_drafter_beside_two_decodes(
    release: Callable[[str], Any], version: str, crashes: bool
) -> None:
    """Finding (examined on the code, not confirmed on GPUs), 0.31 to 0.34:
    PIECEWISE graphs and a drafter; one rank idle while its peer decodes two
    requests uniformly (1 + k tokens each). The idle rank's dummy batch is
    padded to the agreed 2(1 + k) tokens and built as ONE request
    (make_dummy(batch_desc.num_reqs or num_reqs)), so its drafter's prefill
    finds a uniform length of 2(1 + k) where the ranks agreed 1 + k: the
    reuse assertion ends the idle rank, its peer waits in the drafter's MoE
    collective. 0.30 runs the same case clean."""
    options = EngineOptions(
        max_num_seqs=2,
        max_num_batched_tokens=8,
        max_model_len=16,
        speculator="ar",
        num_speculative_tokens=1,
    )
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode="PIECEWISE",
        max_num_seqs=2,
        decode_query_len=2,
    )
    busy = RankStream(
        (RequestScript("r1-0", 0, 1, 2), RequestScript("r1-1", 0, 9, 1, kv_wait=1))
    )
    case = RunnerCase(policy, options, (RankStream(), busy))
    run = run_runner_case(release(version), case)
    verdicts = judge(case, run.result, RUNNER_LANE_PROPERTIES.values())
    if not crashes:
        assert verdicts == []
        return
    assert verdicts[0].property == "no-error" and verdicts[0].ranks == (0,)
    assert verdicts[0].phase == "iter 2 drafter prefill"
    assert "reusing a DP sync taken over a different batch" in verdicts[0].message
