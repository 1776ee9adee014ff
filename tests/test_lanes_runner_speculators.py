"""The real V2 speculators per virtual rank (dpsim.lanes.runner.speculators).

Release tests drive two virtual ranks, each calling the real ``propose`` of
its own speculator after a real target sync (the agreement the model runner
would hand over) with a hand-built decode batch, or on an idle rank the
release's own ``InputBatch.make_dummy``, and count what each rank did: syncs,
drafter forwards (EP collectives), collectives. Planted bugs are textual
edits of the cached release's own speculator file in a tmp tree.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpsim.errors import TargetError, UsageError
from dpsim.lanes.runner import speculators
from dpsim.lanes.runner.forward import HIDDEN_SIZE
from dpsim.lanes.runner.model_runner import runner_kit
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.speculators import build_speculator
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.strict import ModelGap, collect_gaps, standin
from dpsim.lanes.runner.syncs import DRAFTER_FORWARD_EVENT, Phases, recording_sync
from dpsim.lanes.runner.where import LineCoverage
from dpsim.records.groups import EP_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import SYNC_EVENT
from dpsim.records.trace import Outcome, RankState, SimResult
from dpsim.scenarios.run import manager_for, tables_for
from dpsim.sim import simulate

RELEASES = ("0.29.0", "0.33.0", "0.34.0")
#: Where each release keeps its autoregressive speculator.
AR_FILE = {
    "0.29.0": "v1/worker/gpu/spec_decode/autoregressive/speculator.py",
    "0.33.0": "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
    "0.34.0": "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
}
AR_CLASS = {
    "0.29.0": "AutoRegressiveSpeculator",
    "0.33.0": "TargetDependentARSpeculator",
    "0.34.0": "TargetDependentARSpeculator",
}
#: 0.34's shared base of the autoregressive speculators, which holds the
#: multi-step decode.
SHARED_FILE = "v1/worker/gpu/spec_decode/autoregressive/speculator.py"
#: Planted caller bugs, per release: (old text, new text, k, per-rank loads).
#: ``idle-skips-decode``: an idle rank's propose returns after the prefill
#: (vLLM 35294's class: an idle rank not drafting what busy ranks draft).
#: ``own-count-loop``: the decode loop runs as many steps as the rank has
#: requests, a rank's own value where the agreed one belongs.
PLANTS: dict[str, dict[str, tuple[str, str, int, tuple[int, int]]]] = {
    "idle-skips-decode": {
        "0.29.0": (
            "if self.num_speculative_steps == 1:\n            # Early exit.",
            "if self.num_speculative_steps == 1 or dummy_run:\n            # Early exit.",
            3,
            (2, 0),
        ),
        "0.33.0": (
            "if num_speculative_tokens <= 1:",
            "if num_speculative_tokens <= 1 or dummy_run:",
            3,
            (2, 0),
        ),
        "0.34.0": (
            "if num_speculative_tokens <= 1:",
            "if num_speculative_tokens <= 1 or dummy_run:",
            3,
            (2, 0),
        ),
    },
    "own-count-loop": {
        "0.29.0": (
            "for step in range(1, self.num_speculative_steps):\n            # Rebuild",
            "for step in range(1, min(self.num_speculative_steps, num_reqs + 1)):\n"
            "            # Rebuild",
            4,
            (3, 1),
        ),
        "0.33.0": (
            "for step in range(1, num_speculative_steps):\n            # Rebuild",
            "for step in range(1, min(num_speculative_steps, num_reqs + 1)):\n"
            "            # Rebuild",
            4,
            (3, 1),
        ),
        "0.34.0": (
            "for step in range(1, num_speculative_steps):\n            if not skip",
            "for step in range(1, min(num_speculative_steps, num_reqs + 1)):\n"
            "            if not skip",
            4,
            (3, 1),
        ),
    },
}
#: A plant's file where it is not the release's AR_FILE.
PLANT_FILE = {("own-count-loop", "0.34.0"): SHARED_FILE}
SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


# -- fast: the stand-ins and what is read off a class body ---------------------


def test_a_launcher_called_as_it_was_not_written_for_is_a_gap() -> None:
    launch = speculators._launcher("update_draft_inputs", lambda tokens, step: None)
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        launch(1, 2, 3)
    assert len(gaps) == 1
    assert gaps[0].startswith(
        "update_draft_inputs called with arguments its stand-in does not take "
        "(too many positional arguments) at "
    )


def test_a_type_error_inside_a_launcher_is_not_a_gap() -> None:
    def broken(tokens: int) -> None:
        raise TypeError("a bug in the stand-in itself")

    launch = speculators._launcher("update_draft_inputs", broken)
    with collect_gaps() as gaps, pytest.raises(TypeError, match="a bug in the"):
        launch(1)
    assert gaps == []
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        launch(tokens=1, step=2)
    assert gaps[0].startswith(
        "update_draft_inputs called with arguments its stand-in does not take "
        "(got an unexpected keyword argument 'step') at "
    )


def test_a_sync_through_an_unknown_manager_is_a_gap() -> None:
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        speculators._route_sync(None, 1, 2)
    assert gaps and "dispatch_cg_and_sync_dp with an unknown manager" in gaps[0]


def test_a_stand_in_asked_what_it_does_not_hold_is_a_gap() -> None:
    batch = _batch(2, 3, 6)
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        _ = batch.num_computed_tokens
    assert gaps == [
        "InputBatch.num_computed_tokens read at (no vLLM frame on the stack)"
    ]


def test_prefill_inputs_point_at_each_requests_last_accepted_token() -> None:
    # Nothing a GPU kernel writes for the stood-in model is written: an
    # empty stand-in, so any read of it would be a gap.
    buffers = standin("InputBuffers")
    last = torch.full((4,), 7, dtype=torch.int64)
    step = torch.tensor(3)
    speculators._prepare_prefill_inputs(
        last,
        step,
        buffers,
        _batch(2, 3, 8),
        torch.ones(2, dtype=torch.int32),
        torch.tensor([0, 2], dtype=torch.int32),
        torch.zeros(4),
        torch.zeros(4),
        4,
    )
    assert last.tolist() == [2, 3, 0, 0]
    assert int(step) == 0


def test_each_draft_step_writes_its_own_column() -> None:
    # Nothing a GPU kernel writes for the stood-in model is written: an
    # empty stand-in, so any read of it would be a gap.
    buffers = standin("InputBuffers")
    drafts = torch.zeros(4, 3, dtype=torch.int64)
    for step in (1, 2):
        speculators._update_draft_inputs(
            torch.tensor([10 + step, 20 + step]),
            torch.tensor(step),
            torch.ones(2, HIDDEN_SIZE),
            drafts,
            torch.zeros(4, HIDDEN_SIZE),
            buffers,
            torch.zeros(4, dtype=torch.int64),
            2,
            100,
            3,
        )
    assert drafts.tolist() == [[0, 11, 12], [0, 21, 22], [0, 0, 0], [0, 0, 0]]


def test_assigned_attributes_and_present_methods_come_from_the_class_body() -> None:
    import ast

    tree = ast.parse(
        "class Spec(Base):\n"
        "    width: int = 2\n"
        "    shared = False\n"
        "    def __init__(self):\n"
        "        self.a = 1\n"
        "        self.b: int = 2\n"
        "        other.c = 3\n"
        "    def propose(self):\n"
        "        self.d = 4\n"
    )
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    assert speculators._assigned([node]) == {"a", "b"}
    assert speculators._present(node, ("propose", "capture"), ("run",)) == ["propose"]


def test_no_speculator_is_none_and_a_mismatched_policy_is_refused() -> None:
    nowhere: Any = object()
    assert (
        build_speculator(nowhere, EngineOptions(), _policy(1), 0, 2, sync=print) is None
    )
    with pytest.raises(
        UsageError,
        match=r"decode_query_len \(1\) must be 1 \+ num_speculative_tokens \(3\)",
    ):
        build_speculator(
            nowhere,
            EngineOptions(speculator="ar", num_speculative_tokens=2),
            _policy(1),
            0,
            2,
            sync=print,
        )


# -- releases: two virtual ranks through the real propose ------------------------


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(("kind", "k"), [("ar", 1), ("mtp", 2), ("ar", 4)])
@pytest.mark.parametrize("loads", [(3, 1), (2, 0), (0, 5)])
def test_ranks_draft_in_step_busy_or_idle(
    version: str, kind: str, k: int, loads: tuple[int, int]
) -> None:
    """Unequal and idle ranks run the same syncs and drafter forwards: one
    prefill forward and k - 1 decode forwards each (an idle rank, given no
    count, drafts the full k)."""
    result, gaps = _run(_release(version), kind, k, loads)
    assert gaps == []
    assert result.outcome == Outcome.OK
    counts = [_counts(result, rank) for rank in range(2)]
    assert counts[0] == counts[1]
    syncs, forwards, ep = counts[0]
    assert forwards == ep == k
    assert syncs == (2 if k == 1 else 3)  # target, drafter prefill, drafter decode
    returned = [result.ranks[rank].returned for rank in range(2)]
    assert all(shape[1] == k for shape in returned)


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.30.0", "0.31.0", "0.32.0"])
def test_the_releases_between_draft_in_step_too(version: str) -> None:
    """0.30-0.32 (0.30 reuses the agreement for the decode dispatch, 0.32
    renamed the package) run with no adaptation."""
    for kind in ("ar", "mtp"):
        result, gaps = _run(_release(version), kind, 3, (2, 0))
        assert gaps == []
        assert result.outcome == Outcome.OK
        assert _counts(result, 0) == _counts(result, 1)


@pytest.mark.release
# 0.26-0.28: their decode-input kernels take no sample_src_positions (0.29 added
# it), so their launchers get those releases' stand-ins (with 0.29's: a gap);
# 0.26-0.27's runner has no gather_batch_req_state (its prepare_inputs gathers).
@pytest.mark.parametrize("version", (*RELEASES, "0.28.0", "0.27.0", "0.26.0"))
@pytest.mark.parametrize("kind", ["ar", "mtp"])
def test_behind_the_real_engine_loop_every_step_drafts_alike(
    version: str, kind: str
) -> None:
    """A whole lane run (engine loop, worker, runner, speculator): a rank that
    decodes and a rank that idles (dummy batches) run the drafter's syncs and
    forwards step for step."""
    from dpsim.lanes.runner.case import RunnerCase
    from dpsim.lanes.runner.run import run_runner_case
    from dpsim.lanes.runner.stream import RankStream, RequestScript

    k = 2
    streams = (
        RankStream(
            (
                RequestScript("a", 0, 5, 4),
                RequestScript("b", 1, 3, 6, accepted=(0, 1)),
            )
        ),
        RankStream(()),
    )
    case = RunnerCase(
        _policy(1 + k),
        EngineOptions(speculator=kind, num_speculative_tokens=k),
        streams,
        seed=1,
    )
    result = run_runner_case(_release(version).target, case).result
    assert result.outcome == Outcome.OK
    phases = [
        [event.payload["phase"] for event in trace.events if event.kind == SYNC_EVENT]
        for trace in result.ranks
    ]
    assert phases[0] == phases[1]
    assert "iter 1 drafter prefill" in phases[0]
    steps = sum(phase.endswith(" model") for phase in phases[0])
    # Each forward step: one drafter prefill forward and k - 1 decode ones.
    assert [_counts(result, rank)[1] for rank in range(2)] == [k * steps] * 2


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_the_drafters_tables_are_the_ones_the_sync_lane_derives(version: str) -> None:
    """The real init_cudagraph_manager builds the drafter's prefill and
    decode tables the sync lane's drafter scenario models (0.34: the prefill
    table; its decode table is the drafter's own grid, next test)."""
    sources = _release(version)
    target = sources.target
    policy = _policy(3, mode="FULL_AND_PIECEWISE")
    options = EngineOptions(speculator="ar", num_speculative_tokens=2)
    speculator = build_speculator(sources, options, policy, 0, 2, sync=print)
    tables = tables_for(target, policy, 2)
    pairs = [(speculator.prefill_cudagraph_manager, tables.drafter_prefill)]
    if version != "0.34.0":
        pairs.append((speculator.decode_cudagraph_manager, tables.drafter_decode))
    for real, modelled in pairs:
        expected = manager_for(target, modelled)
        assert real.cudagraph_mode == expected.cudagraph_mode
        assert real.decode_query_len == expected.decode_query_len
        for tokens in range(1, 40):
            for uniform in (None, 1, 3):
                reqs = tokens // uniform if uniform else tokens
                assert real.dispatch(reqs, tokens, uniform, 0) == expected.dispatch(
                    reqs, tokens, uniform, 0
                )


@pytest.mark.release
@pytest.mark.parametrize(("kind", "k"), [("ar", 2), ("mtp", 3), ("ar", 1)])
def test_from_034_the_drafters_decode_graphs_are_its_own_request_grid(
    kind: str, k: int
) -> None:
    """0.34's EAGLE and MTP drafters with k >= 2 capture one-token decode
    graphs for the request-count grid up to max_num_seqs
    (``get_draft_decode_cudagraph_request_sizes``), whatever the shared
    capture sizes; with k = 1 there are no draft decode steps, and none."""
    sources = _release("0.34.0")
    policy = _policy(1 + k, mode="FULL_AND_PIECEWISE")
    options = EngineOptions(speculator=kind, num_speculative_tokens=k)
    decode = build_speculator(
        sources, options, policy, 0, 2, sync=print
    ).decode_cudagraph_manager
    grid = sources.target.compilation.decode_cudagraph_capture_grid(8)
    captured = sorted(
        (desc.num_reqs, desc.num_tokens, desc.uniform_token_count)
        for desc in decode._capture_descs.get(sources.target.CUDAGraphMode.FULL, [])
    )
    assert captured == ([(n, n, 1) for n in grid] if k >= 2 else [])
    if k >= 2:
        # 5 is no shared size, yet five drafting requests replay a graph of
        # exactly five (the shared sizes would pad them to 6).
        assert 5 in grid and 5 not in SIZES
        assert decode.dispatch(5, 5, 1, 0).num_tokens == 5


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_what_runs_for_real_is_vllms_own_code(version: str) -> None:
    """The rebuilt classes carry the release's file and lines, and one
    busy/idle pair runs three quarters of propose, the decode loop, and
    init_cudagraph_manager."""
    sources = _release(version)
    classes = speculators.real_classes(sources)
    names = [cls.__name__ for cls in classes]
    assert names[:3] == ["DraftModelSpeculator", AR_CLASS[version], "MTPSpeculator"]
    codes = [code for cls in classes for code in cls.DPSIM_ORIGIN.codes()]
    assert {Path(code.co_filename).name for code in codes} >= {"speculator.py"}
    with LineCoverage(codes) as coverage:
        _run(sources, "ar", 3, (2, 0))
    covered = {f.name.rsplit(".", 1)[-1]: f for f in coverage.functions()}
    propose = covered["propose"]
    assert len(propose.executed) >= 0.75 * len(propose.executable)
    assert covered["_multi_step_decode"].executed
    # 0.34 builds the decode manager in the shared base's, after the prefill's.
    inits = [
        f
        for f in coverage.functions()
        if f.name.rsplit(".", 1)[-1] == "init_cudagraph_manager"
    ]
    assert len(inits) == (2 if version == "0.34.0" else 1)
    # All but the branch for modes without FULL decodes.
    assert sum(len(init.executable - init.executed) for init in inits) == 1


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    ("mode", "k"),
    [("PIECEWISE", 2), ("FULL", 1)],
)
def test_vllm_asserts_on_an_idle_ranks_dummy_padded_out_of_uniform(
    version: str, mode: str, k: int
) -> None:
    """What the lane finds in vLLM itself (every step real): an idle rank's
    dummy batch is made from the agreed descriptor (``make_dummy``), whose
    padding (PIECEWISE: 1 + k is no capture size; FULL: a mixed graph's
    request count) turns the 1 + k uniform decode the rank voted into
    another uniform count, and the drafter's prefill dispatch, reusing the
    agreement, asserts. A busy rank with the same vote drafts fine."""
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16, 32),
        cudagraph_mode=mode,  # type: ignore[arg-type]
        decode_query_len=1 + k,
        max_num_seqs=8,
    )
    result, gaps = _run(_release(version), "ar", k, (1, 0), policy=policy)
    assert gaps == []
    assert result.outcome == Outcome.CRASH
    busy, idle = result.ranks
    assert busy.state == RankState.WAITING  # in the drafter's prefill forward
    assert idle.error is not None
    assert idle.error.message == "reusing a DP sync taken over a different batch"
    assert idle.error.where.startswith("dp_utils.py:")
    # With the decode graphs FULL_AND_PIECEWISE adds, the same ranks draft alike.
    fine = dataclasses.replace(policy, cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE)
    assert _run(_release(version), "ar", k, (1, 0), policy=fine)[0].outcome == (
        Outcome.OK
    )


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_drafter_bug_hangs(version: str, plant: str, tmp_path: Path) -> None:
    """Each planted bug leaves a rank waiting in the drafter's decode (0.33's
    decode forward, 0.29's decode sync) while the other has finished, where
    the unplanted release drafts in step (test_ranks_draft_in_step...)."""
    old, new, k, loads = PLANTS[plant][version]
    relative = PLANT_FILE.get((plant, version), AR_FILE[version])
    sources = _planted(version, tmp_path, relative, old, new)
    result, gaps = _run(sources, "ar", k, loads)
    assert gaps == []
    assert result.outcome in (Outcome.HANG, Outcome.MISMATCH)
    assert [trace.state for trace in result.ranks] == [
        RankState.WAITING,
        RankState.FINISHED,
    ]
    # The finished rank drafted less than the waiting one set out to.
    assert _counts(result, 1)[1] < k
    unplanted, _ = _run(_release(version), "ar", k, loads)
    assert unplanted.outcome == Outcome.OK


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_a_new_attribute_read_by_propose_is_a_gap(version: str, tmp_path: Path) -> None:
    """vLLM's propose reading an attribute the lane never set is refused
    (a gap naming it and the line), not answered."""
    marker = "        num_tokens = input_batch.num_tokens\n"
    sources = _planted(
        version,
        tmp_path,
        AR_FILE[version],
        marker,
        marker + "        _ = self.draft_schedule\n",
    )
    result, gaps = _run(sources, "ar", 2, (1, 1))
    assert len(gaps) == 1
    assert gaps[0].startswith(
        f"{AR_CLASS[version]}.draft_schedule read at {AR_FILE[version]}:"
    )
    assert gaps[0].endswith(" in propose")
    assert result.outcome == Outcome.CRASH


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_a_launcher_called_with_a_new_argument_is_a_gap(
    version: str, tmp_path: Path
) -> None:
    # 0.34 launches the kernel itself, from the speculator's own method.
    launcher, caller = (
        ("_prepare_decode_inputs_kernel[(num_reqs + 1,)]", "_prepare_decode_inputs")
        if version == "0.34.0"
        else ("prepare_decode_inputs", "propose")
    )
    call = launcher + "(\n            self.draft_tokens[:num_reqs, 0],\n"
    sources = _planted(
        version,
        tmp_path,
        AR_FILE[version],
        call,
        call.replace("(\n", "(\n            None,\n"),
    )
    _, gaps = _run(sources, "ar", 2, (1, 1))
    name = launcher.split("[")[0]
    assert gaps and gaps[0].startswith(
        f"{name} called with arguments its stand-in does not take"
    )
    assert f"in {caller}" in gaps[0]


@pytest.mark.release
def test_a_release_without_mtp_is_refused_for_mtp_only(tmp_path: Path) -> None:
    sources = _tree_copy("0.33.0", tmp_path)
    shutil.rmtree(sources.package_dir / "v1/worker/gpu/spec_decode/mtp")
    options = EngineOptions(speculator="mtp", num_speculative_tokens=2)
    with pytest.raises(TargetError, match="has no MTP speculator the lane can drive"):
        build_speculator(sources, options, _policy(3), 0, 2, sync=print)
    options = EngineOptions(speculator="ar", num_speculative_tokens=2)
    assert build_speculator(sources, options, _policy(3), 0, 2, sync=print)


@pytest.mark.release
def test_a_release_without_the_autoregressive_speculator_is_refused(
    tmp_path: Path,
) -> None:
    sources = _tree_copy("0.33.0", tmp_path)
    shutil.rmtree(sources.package_dir / "v1/worker/gpu/spec_decode/target_dependent_ar")
    options = EngineOptions(speculator="ar", num_speculative_tokens=2)
    with pytest.raises(TargetError) as refused:
        build_speculator(sources, options, _policy(3), 0, 2, sync=print)
    assert "no target-dependent autoregressive speculator" in str(refused.value)
    assert "\n" not in str(refused.value)


# -- helpers -----------------------------------------------------------------


@functools.cache
def _release(version: str) -> RunnerSources:
    """One sources object per release for the module: what the parts build
    from it is cached on it, as in a campaign."""
    return RunnerSources.for_release(version)


def _policy(decode_query_len: int, mode: str = "FULL_AND_PIECEWISE") -> CapturePolicy:
    return CapturePolicy(
        capture_sizes=SIZES,
        cudagraph_mode=mode,  # type: ignore[arg-type]
        decode_query_len=decode_query_len,
        max_num_seqs=8,
    )


def _batch(num_reqs: int, per_request: int, padded: int) -> Any:
    """A uniform-decode input batch holding exactly what propose reads."""
    tokens = num_reqs * per_request
    return standin(
        "InputBatch",
        num_reqs=num_reqs,
        num_tokens=tokens,
        num_tokens_after_padding=padded,
        num_scheduled_tokens=np.full(num_reqs, per_request, dtype=np.int32),
        seq_lens_cpu_upper_bound=torch.full((num_reqs,), 20, dtype=torch.int32),
        seq_lens=torch.full((num_reqs,), 20, dtype=torch.int32),
        idx_mapping=torch.arange(num_reqs, dtype=torch.int32),
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32) * per_request,
        positions=torch.arange(max(padded, tokens), dtype=torch.int64),
        decode_graph_eligible=True,
        has_prefill=False,
    )


def _run(
    sources: RunnerSources,
    kind: str,
    k: int,
    loads: tuple[int, ...],
    *,
    policy: CapturePolicy | None = None,
) -> tuple[SimResult, list[str]]:
    """Each rank syncs its target batch for real (``loads[rank]`` decoding
    requests; 0: an idle rank's one-request dummy batch of 1 + k tokens, as
    ``_dummy_run`` makes it), then calls its speculator's propose with the
    agreement, as the model runner's ``sample_tokens`` and ``_dummy_run`` do.
    An idle rank's input batch is the release's own ``InputBatch.make_dummy``
    of the agreed descriptor, as ``execute_model`` makes it."""
    target = sources.target
    dp_size = len(loads)
    options = EngineOptions(speculator=kind, num_speculative_tokens=k)
    policy = policy or _policy(1 + k)
    kit = runner_kit(sources, target)
    manager = manager_for(target, tables_for(target, policy, dp_size).target)
    syncs = [
        recording_sync(target, target.api._sync, Phases())  # type: ignore[attr-defined]
        for _ in loads
    ]
    ranks = [
        build_speculator(sources, options, policy, rank, dp_size, sync=syncs[rank])
        for rank in range(dp_size)
    ]
    parameters = inspect.signature(ranks[0].propose).parameters
    reuse = "dp_sync_state" if "dp_sync_state" in parameters else "dp_sync"
    slots = options.max_num_seqs

    def program(rank: int) -> list[int]:
        dummy = loads[rank] == 0
        requests = loads[rank] or 1
        desc, agreed = syncs[rank](
            manager,
            requests,
            requests * (1 + k),
            1 + k,
            dp_size=dp_size,
            dp_rank=rank,
        )
        if dummy:
            buffers = kit.InputBuffers(slots, max(SIZES), "cpu")
            batch = kit.InputBatch.make_dummy(
                desc.num_reqs or requests,
                desc.num_tokens,
                buffers,
                max_query_len=desc.max_query_len,
            )
        else:
            batch = _batch(requests, 1 + k, desc.num_tokens)
        extra: dict[str, Any] = {reuse: agreed}
        if dummy:
            extra["dummy_run"] = True
        elif "num_speculative_tokens" in parameters:
            extra["num_speculative_tokens"] = k
        drafts = ranks[rank].propose(
            batch,
            {},
            {},
            torch.zeros(desc.num_tokens, HIDDEN_SIZE),
            None,
            torch.ones(batch.num_reqs, dtype=torch.int32),
            torch.zeros(batch.num_reqs, dtype=torch.int32),
            torch.zeros(slots, dtype=torch.int64),
            torch.zeros(slots, dtype=torch.int32),
            torch.zeros(slots),
            torch.zeros(slots, dtype=torch.int64),
            **extra,
        )
        return list(drafts.shape)

    with collect_gaps() as gaps:
        result = simulate(program, ranks=dp_size)
    return result, gaps


def _counts(result: SimResult, rank: int) -> tuple[int, int, int]:
    """A rank's syncs, drafter forwards and EP collectives."""
    trace = result.ranks[rank]
    kinds = [event.kind for event in trace.events]
    ep = sum(1 for record in trace.collectives if record.group == EP_GROUP)
    return kinds.count(SYNC_EVENT), kinds.count(DRAFTER_FORWARD_EVENT), ep


def _tree_copy(version: str, tmp_path: Path) -> RunnerSources:
    """A source tree copied from the cached release (its runner-lane files)."""
    package = tmp_path / "vllm"
    shutil.copytree(_release(version).package_dir, package)
    return RunnerSources.for_tree(package)


def _planted(
    version: str, tmp_path: Path, relative: str, old: str, new: str
) -> RunnerSources:
    """The release as a tree, with ``old`` replaced by ``new`` once in one file."""
    sources = _tree_copy(version, tmp_path)
    path = sources.package_dir / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative} no longer has {old!r} once"
    path.write_text(text.replace(old, new))
    return sources
