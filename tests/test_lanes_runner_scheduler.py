"""The modelled scheduler: what it schedules, its real output classes, and its strictness.

Fast tests run it over scheduler output classes written here from scratch
(plain dataclasses with the field names the model fills); release-marked
tests run it over the release's real ``vllm/v1/core/sched/output.py`` on
0.29.0 and 0.33.0.
"""

from __future__ import annotations

import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from dpsim.errors import TargetError
from dpsim.lanes.runner.generate import workloads
from dpsim.lanes.runner.scheduler import (
    INTERFACE_MODULE,
    OUTPUT_MODULE,
    ModelledScheduler,
    SchedulerRules,
    make_request,
    rules_for,
)
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import ModelGap, collect_gaps
from dpsim.targets.shim import ModuleLoader

#: A from-scratch stand-in for a release's output module: the field names the
#: model fills, and ``skip_drafts`` only when ``new`` (0.33-style).
OUTPUT = """
from dataclasses import dataclass, field

@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple
    num_computed_tokens: int
    lora_request: object
    prefill_token_ids: list = None

@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: set = None
    num_spec_tokens_to_schedule: int = 0
    pending_structured_output_tokens: bool = False
EXTRA
"""
INTERFACE = """
import enum

class PauseState(enum.IntEnum):
    UNPAUSED = 0
    PAUSED_NEW = 1
"""


@dataclass(eq=False)
class Tree:
    """Sources over a directory playing ``vllm/`` (what the model needs of
    the lane's RunnerSources: a strict load through the shim)."""

    package_dir: Path
    version: str | None = None

    def path(self, module: str) -> Path:
        return self.package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")

    def has(self, module: str) -> bool:
        return self.path(module).is_file()

    def load_module(self, name: str, *, lenient: bool) -> types.ModuleType:
        assert not lenient
        loader = ModuleLoader(
            self.package_dir, executed=frozenset({name}), lenient=frozenset()
        )
        return loader.module(name)


def fake_tree(
    root: Path, extra: str = "    skip_drafts: bool = False", version: str | None = None
) -> Tree:
    tree = Tree(root / "vllm", version)
    for module, text in (
        (OUTPUT_MODULE, OUTPUT.replace("EXTRA", extra)),
        (INTERFACE_MODULE, INTERFACE),
    ):
        path = tree.path(module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tree


@pytest.fixture
def new_tree(tmp_path: Path) -> Tree:
    return fake_tree(tmp_path / "new")


@pytest.fixture
def old_tree(tmp_path: Path) -> Tree:
    return fake_tree(tmp_path / "old", extra="", version="0.29.0")


@dataclass
class Drafts:
    """What the worker's take_draft_token_ids returns (DraftTokenIds' fields)."""

    req_ids: list[str]
    draft_token_ids: list[list[int]]


def step_row(output: Any) -> tuple[Any, ...]:
    """One scheduled step, as the tests compare it."""
    return (
        output.num_scheduled_tokens,
        output.scheduled_spec_decode_tokens,
        sorted(output.finished_req_ids),
        [new.req_id for new in output.scheduled_new_reqs],
        output.scheduled_cached_reqs.num_computed_tokens,
        getattr(output, "skip_drafts", None),
    )


def drive(
    scheduler: ModelledScheduler, stream: RankStream, iterations: int, k: int
) -> list[tuple[Any, ...]]:
    """The engine's protocol, synchronous scheduling: arrivals, schedule,
    update_from_output, then the drafter's drafts (post_step)."""
    rows: list[tuple[Any, ...]] = []
    for iteration in range(iterations):
        for script in stream.requests:
            if script.arrival == iteration:
                scheduler.add_request(make_request(script))
        if not scheduler.has_requests():
            rows.append(("idle",))
            continue
        output = scheduler.schedule(False)
        rows.append(step_row(output))
        assert scheduler.update_from_output(output, object()) == {}
        if k and output.total_num_scheduled_tokens:
            ids = list(output.num_scheduled_tokens)
            scheduler.update_draft_token_ids(Drafts(ids, [[7] * k for _ in ids]))
    return rows


SPEC = EngineOptions(
    max_num_batched_tokens=16,
    max_model_len=24,
    speculator="ar",
    num_speculative_tokens=2,
)
MIXED = RankStream(
    (
        RequestScript("a", 0, 20, 8, accepted=(1, 0, 2)),
        RequestScript("b", 0, 3, 2, kv_wait=2),
        RequestScript("c", 1, 5, 3),
    )
)
#: Chunked prefill (a: 16 + 4), drafts scheduled (it 2), a clamped at
#: max_model_len (it 3: 1 token, no drafts), b held two steps for its KV
#: then padded to 1 + k with -1 drafts, finishes reported a step later.
MIXED_ROWS: list[tuple[Any, ...]] = [
    ({"a": 16}, {}, [], ["a"], [], True),
    ({"a": 4, "c": 5}, {}, [], ["c"], [16], False),
    ({"a": 3, "c": 3}, {"a": [7, 7], "c": [7, 7]}, [], [], [20, 5], False),
    ({"a": 1, "b": 3}, {"b": [-1, -1]}, ["c"], ["b"], [22], False),
    ({"b": 3}, {"b": [7, 7]}, ["a"], [], [3], True),
    ({}, {}, ["b"], [], [], True),
    ("idle",),
]


def test_mixed_stream_schedules_as_vllm_would(new_tree: Tree) -> None:
    with collect_gaps() as gaps:
        rows = drive(ModelledScheduler(MIXED, SPEC, new_tree), MIXED, 7, k=2)
    assert gaps == []
    assert rows == MIXED_ROWS


def test_old_release_has_no_skip_drafts(old_tree: Tree) -> None:
    rows = drive(ModelledScheduler(MIXED, SPEC, old_tree), MIXED, 7, k=2)
    assert [row[:5] for row in rows] == [row[:5] for row in MIXED_ROWS]
    assert {row[5] for row in rows if len(row) > 1} == {None}


def test_kv_wait_holds_the_request_with_zero_tokens(new_tree: Tree) -> None:
    stream = RankStream((RequestScript("a", 0, 4, 1, kv_wait=2),))
    scheduler = ModelledScheduler(stream, EngineOptions(), new_tree)
    scheduler.add_request(make_request(stream.requests[0]))
    totals = []
    for _ in range(3):
        assert scheduler.has_unfinished_requests()
        output = scheduler.schedule()
        totals.append(output.total_num_scheduled_tokens)
        scheduler.update_from_output(output, None)
    # Held twice, then its last prompt token (the rest came over the wire).
    assert totals == [0, 0, 1]
    assert not scheduler.has_unfinished_requests()
    assert scheduler.has_requests()  # finished, not yet reported
    assert scheduler.schedule().finished_req_ids == {"a"}
    assert not scheduler.has_requests()


def test_max_num_seqs_and_budget_bound_a_step(new_tree: Tree) -> None:
    options = EngineOptions(max_num_seqs=2, max_num_batched_tokens=8)
    stream = RankStream(tuple(RequestScript(f"r{i}", 0, 3, 2) for i in range(4)))
    scheduler = ModelledScheduler(stream, options, new_tree)
    for script in stream.requests:
        scheduler.add_request(make_request(script))
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"r0": 3, "r1": 3}
    scheduler.update_from_output(output, None)
    assert scheduler.schedule().num_scheduled_tokens == {"r0": 1, "r1": 1}


def test_long_prefill_threshold_only_with_company_on_new_releases(
    new_tree: Tree, old_tree: Tree
) -> None:
    options = EngineOptions(max_num_batched_tokens=32, long_prefill_token_threshold=5)
    stream = RankStream((RequestScript("a", 0, 20, 1),))
    firsts = []
    for tree in (new_tree, old_tree):
        scheduler = ModelledScheduler(stream, options, tree)
        scheduler.add_request(make_request(stream.requests[0]))
        firsts.append(scheduler.schedule().num_scheduled_tokens)
    assert firsts == [{"a": 20}, {"a": 5}]


def test_throttled_step_defers_prefills_while_a_decode_runs(new_tree: Tree) -> None:
    stream = RankStream((RequestScript("a", 0, 2, 5), RequestScript("b", 1, 4, 1)))
    scheduler = ModelledScheduler(stream, EngineOptions(), new_tree)
    scheduler.add_request(make_request(stream.requests[0]))
    output = scheduler.schedule(True)  # nothing decoding yet: admitted
    assert output.num_scheduled_tokens == {"a": 2}
    scheduler.update_from_output(output, None)
    scheduler.add_request(make_request(stream.requests[1]))
    assert scheduler.schedule(True).num_scheduled_tokens == {"a": 1}
    assert scheduler.schedule(False).num_scheduled_tokens == {"b": 4}


@pytest.mark.parametrize(
    ("crowded", "second"), [(False, {"a": 1}), (True, {"a": 1, "b": 7})]
)
def test_a_capacity_bound_engine_does_not_defer_prefill_chunks(
    new_tree: Tree, crowded: bool, second: dict[str, int]
) -> None:
    options = EngineOptions(max_num_seqs=2, max_num_batched_tokens=8)
    scripts = [RequestScript("a", 0, 2, 5), RequestScript("b", 0, 20, 1)]
    if crowded:
        scripts.append(RequestScript("c", 0, 2, 1))
    stream = RankStream(tuple(scripts))
    scheduler = ModelledScheduler(stream, options, new_tree)
    for script in scripts:
        scheduler.add_request(make_request(script))
    output = scheduler.schedule(False)
    assert output.num_scheduled_tokens == {"a": 2, "b": 6}
    scheduler.update_from_output(output, None)
    # Throttled: b's next chunk waits, unless c could not be admitted last
    # time (prefill_capacity_bound).
    assert scheduler.schedule(True).num_scheduled_tokens == second


def test_async_scheduling_uses_placeholders_and_stops_at_max_tokens(
    new_tree: Tree,
) -> None:
    options = EngineOptions(
        async_scheduling=True, speculator="mtp", num_speculative_tokens=2
    )
    stream = RankStream((RequestScript("a", 0, 4, 2, accepted=(0,)),))
    scheduler = ModelledScheduler(stream, options, new_tree)
    scheduler.add_request(make_request(stream.requests[0]))
    queue = []
    rows = []
    for _ in range(4):
        output = scheduler.schedule()
        rows.append(
            (
                output.num_scheduled_tokens,
                output.scheduled_spec_decode_tokens,
                output.finished_req_ids,
            )
        )
        queue.append(output)
        if len(queue) == 2:
            scheduler.update_from_output(queue.pop(0), None)
    # Prefill; then a decode with two placeholder drafts; then nothing: the
    # step in flight is sure to reach max_tokens (2) whatever is rejected.
    assert rows == [
        ({"a": 4}, {}, set()),
        ({"a": 3}, {"a": [-1, -1]}, set()),
        ({}, {}, set()),
        ({}, {}, {"a"}),
    ]


def test_acceptance_cycles_and_rolls_back_rejections(new_tree: Tree) -> None:
    options = EngineOptions(max_model_len=64, speculator="ar", num_speculative_tokens=3)
    stream = RankStream((RequestScript("a", 0, 2, 30, accepted=(0, 3)),))
    scheduler = ModelledScheduler(stream, options, new_tree)
    rows = drive(scheduler, stream, 5, k=3)
    # 2 prompt; then 1 + 3 drafts each step; computed tokens advance by
    # 1 + accepted: 0 accepted, then all 3, then 0 again.
    assert [row[4] for row in rows] == [[], [2], [3], [7], [8]]


def test_update_out_of_order_is_a_gap(new_tree: Tree) -> None:
    stream = RankStream((RequestScript("a", 0, 2, 2),))
    scheduler = ModelledScheduler(stream, EngineOptions(), new_tree)
    scheduler.add_request(make_request(stream.requests[0]))
    scheduler.schedule()
    second = scheduler.schedule()
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        scheduler.update_from_output(second, None)
    assert gaps and "schedule order" in gaps[0]


def test_unknown_questions_are_gaps(new_tree: Tree) -> None:
    stream = RankStream((RequestScript("a", 0, 2, 2),))
    scheduler = ModelledScheduler(stream, EngineOptions(), new_tree)
    request = make_request(stream.requests[0])
    with collect_gaps() as gaps:
        for attribute in ("set_pause_state", "finish_requests", "connector"):
            with pytest.raises(ModelGap):
                getattr(scheduler, attribute)
        with pytest.raises(ModelGap):
            request.sampling_params  # noqa: B018 - the read is the test
    assert [text.split(" read at ")[0] for text in gaps] == [
        "Scheduler.set_pause_state",
        "Scheduler.finish_requests",
        "Scheduler.connector",
        "Request.sampling_params",
    ]
    # What the engine does read is answered.
    assert request.request_id == "a" and request.kv_transfer_params is None
    assert scheduler.pause_state == 0
    assert scheduler.get_grammar_bitmask(None) is None


def test_a_request_added_twice_or_from_elsewhere_is_a_gap(new_tree: Tree) -> None:
    stream = RankStream((RequestScript("a", 0, 2, 2),))
    scheduler = ModelledScheduler(stream, EngineOptions(), new_tree)
    scheduler.add_request(make_request(stream.requests[0]))
    with collect_gaps() as gaps:
        with pytest.raises(ModelGap):
            scheduler.add_request(make_request(stream.requests[0]))
        with pytest.raises(ModelGap):
            scheduler.add_request(make_request(RequestScript("z", 0, 2, 2)))
    assert len(gaps) == 2


def test_a_release_without_the_output_module_is_refused(tmp_path: Path) -> None:
    tree = Tree(tmp_path / "vllm", version="0.28.0")
    with pytest.raises(TargetError) as error:
        ModelledScheduler(RankStream(), EngineOptions(), tree)
    assert str(error.value) == (
        "runner lane: vLLM 0.28.0 has no vllm/v1/core/sched/output.py, which the "
        "modelled scheduler's output classes come from"
    )


def test_a_required_field_the_model_cannot_fill_is_refused(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path, extra="    brand_new: int = field(kw_only=True)")
    stream = RankStream((RequestScript("a", 0, 2, 2),))
    scheduler = ModelledScheduler(stream, EngineOptions(), tree)
    with pytest.raises(TargetError, match=r"requires brand_new, which the modelled"):
        scheduler.schedule()


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.29.0", "0.33.0", "0.34.0"])
def test_real_output_classes(version: str) -> None:
    from dpsim.lanes.runner.sources import RunnerSources

    sources = RunnerSources.for_release(version)
    scheduler = ModelledScheduler(MIXED, SPEC, sources)
    rows = drive(scheduler, MIXED, 7, k=2)
    new = version != "0.29.0"
    assert [row[:5] for row in rows] == [row[:5] for row in MIXED_ROWS]
    assert [row[5] for row in rows if len(row) > 1] == (
        [row[5] for row in MIXED_ROWS if len(row) > 1] if new else [None] * 6
    )
    # The real classes, filled by name.
    scheduler = ModelledScheduler(MIXED, SPEC, sources)
    scheduler.add_request(make_request(MIXED.requests[0]))
    output = scheduler.schedule()
    assert type(output).__module__ == OUTPUT_MODULE
    assert type(output).__name__ == "SchedulerOutput"
    new_request = output.scheduled_new_reqs[0]
    assert new_request.prompt_len == 20
    assert new_request.sampling_params.max_tokens == 8
    assert new_request.block_ids == ([0, 1],)


def test_rules_follow_the_release() -> None:
    assert rules_for("0.29.0") == SchedulerRules(False, False, False)
    assert rules_for("0.30.0") == SchedulerRules(True, False, False)
    assert (
        rules_for("0.31.0")
        == rules_for("0.33.0")
        # 0.34's scheduler makes the same decisions the model follows.
        == rules_for("0.34.0")
        == SchedulerRules(True, True, True)
    )
    # 0.26-0.28: a padded request past max_model_len stops the waiting loop.
    assert (
        rules_for("0.26.0")
        == rules_for("0.28.0")
        == SchedulerRules(False, False, False, unpadded_near_max_model_len=False)
    )
    # Before 0.25 no waiting request is padded.
    assert not rules_for("0.24.0").pads_waiting_decodes
    assert rules_for("0.25.0").pads_waiting_decodes
    # A tree of unknown version is taken to be current.
    assert rules_for(None) == rules_for("0.33.0")


def test_near_max_model_len_a_padded_request_waits_before_0_29(
    tmp_path: Path,
) -> None:
    """b has one token left after its KV load, beside a's decode: padded to
    1 + k it would pass max_model_len. 0.29+ schedules it unpadded; 0.26-0.28
    stop the waiting loop (b waits a step)."""
    options = EngineOptions(max_model_len=5, speculator="ar", num_speculative_tokens=2)
    stream = RankStream(
        (RequestScript("a", 0, 1, 3), RequestScript("b", 0, 4, 1, kv_wait=1))
    )
    seconds = []
    for version in ("0.28.0", "0.29.0"):
        tree = fake_tree(tmp_path / version, extra="", version=version)
        scheduler = ModelledScheduler(stream, options, tree)
        for script in stream.requests:
            scheduler.add_request(make_request(script))
        first = scheduler.schedule()
        assert first.num_scheduled_tokens == {"a": 1}
        scheduler.update_from_output(first, None)
        seconds.append(scheduler.schedule().num_scheduled_tokens)
    assert seconds == [{"a": 1}, {"a": 1, "b": 1}]


def test_a_kv_loaded_request_is_padded_from_0_25_only(tmp_path: Path) -> None:
    """b has one token left after its KV load, beside a's decode: 0.25 added
    pad_spec_decode (1 + k tokens, -1 drafts); 0.24 schedules its 1 token."""
    options = EngineOptions(speculator="ar", num_speculative_tokens=2)
    stream = RankStream(
        (RequestScript("a", 0, 1, 3), RequestScript("b", 0, 4, 1, kv_wait=1))
    )
    seconds = []
    for version in ("0.24.0", "0.25.0"):
        tree = fake_tree(tmp_path / version, extra="", version=version)
        scheduler = ModelledScheduler(stream, options, tree)
        for script in stream.requests:
            scheduler.add_request(make_request(script))
        scheduler.update_from_output(scheduler.schedule(), None)
        output = scheduler.schedule()
        seconds.append(
            (output.num_scheduled_tokens, output.scheduled_spec_decode_tokens)
        )
    assert seconds == [
        ({"a": 1, "b": 1}, {}),
        ({"a": 1, "b": 3}, {"b": [-1, -1]}),
    ]


def test_a_lone_kv_loaded_request_is_padded_from_0_30(tmp_path: Path) -> None:
    options = EngineOptions(speculator="ar", num_speculative_tokens=2)
    stream = RankStream((RequestScript("a", 0, 5, 3, kv_wait=1),))
    firsts = []
    for version in ("0.29.0", "0.30.0"):
        tree = fake_tree(tmp_path / version, extra="", version=version)
        scheduler = ModelledScheduler(stream, options, tree)
        scheduler.add_request(make_request(stream.requests[0]))
        scheduler.update_from_output(scheduler.schedule(), None)
        output = scheduler.schedule()
        firsts.append(
            (output.num_scheduled_tokens, output.scheduled_spec_decode_tokens)
        )
    assert firsts == [({"a": 1}, {}), ({"a": 3}, {"a": [-1, -1]})]


def test_a_threshold_cutting_a_padded_request_is_refused(new_tree: Tree) -> None:
    """vLLM pads b (one token left after its KV load) to 1 + k, cuts it to
    the threshold and asserts; the model used to schedule 1 token carrying
    k drafts, which the runner then sampled k + 1 rows from (F-findings
    runner-no-hang-37fec73302: an IndexError read as a hang)."""
    options = EngineOptions(
        async_scheduling=True,
        max_num_batched_tokens=8,
        max_model_len=16,
        long_prefill_token_threshold=1,
        speculator="ar",
        num_speculative_tokens=2,
    )
    stream = RankStream(
        (RequestScript("a", 0, 1, 1), RequestScript("b", 0, 2, 1, kv_wait=1))
    )
    scheduler = ModelledScheduler(stream, options, new_tree)
    for script in stream.requests:
        scheduler.add_request(make_request(script))
    with collect_gaps() as gaps:
        assert scheduler.schedule().num_scheduled_tokens == {"a": 1}
        with pytest.raises(ModelGap, match="threshold 1 cuts request b's padding"):
            scheduler.schedule()
    assert len(gaps) == 1 and "vLLM's scheduler asserts" in gaps[0]


def run_protocol(
    scheduler: ModelledScheduler, stream: RankStream, options: EngineOptions
) -> int:
    """The engine's protocol (sync, or async with a batch queue of 2) until
    the scheduler has nothing left; checks every step's bounds; returns the
    iterations it took."""
    queue: list[Any] = []
    k = options.num_speculative_tokens
    for iteration in range(200):
        for script in stream.requests:
            if script.arrival == iteration:
                scheduler.add_request(make_request(script))
        if not scheduler.has_requests() and not queue:
            if iteration > stream.requests[-1].arrival:
                return iteration
            continue
        if scheduler.has_requests():
            output = scheduler.schedule()
            scheduled = output.num_scheduled_tokens
            assert output.total_num_scheduled_tokens == sum(scheduled.values())
            assert output.total_num_scheduled_tokens <= options.max_num_batched_tokens
            assert len(scheduled) <= options.max_num_seqs
            computed = dict(
                zip(
                    output.scheduled_cached_reqs.req_ids,
                    output.scheduled_cached_reqs.num_computed_tokens,
                    strict=True,
                )
            )
            for new in output.scheduled_new_reqs:
                computed[new.req_id] = new.num_computed_tokens
            assert computed.keys() == scheduled.keys()
            for req_id, count in scheduled.items():
                assert count > 0 and computed[req_id] + count < options.max_model_len
                assert len(output.scheduled_spec_decode_tokens.get(req_id, ())) <= k
                assert len(output.scheduled_spec_decode_tokens.get(req_id, ())) < count
            queue.append(output)
        if queue and (
            not options.async_scheduling
            or len(queue) == 2
            or not scheduler.has_requests()
        ):
            done = queue.pop(0)
            scheduler.update_from_output(done, None)
            if k and not options.async_scheduling and done.total_num_scheduled_tokens:
                ids = list(done.num_scheduled_tokens)
                drafts = [
                    [7] * (0 if getattr(done, "skip_drafts", False) else k) for _ in ids
                ]
                scheduler.update_draft_token_ids(Drafts(ids, drafts))
    raise AssertionError("the stream never finished")


# Streams with requests only: an empty one has nothing to run, and a quarter
# of the drawn streams would pass here without running anything.
@settings(max_examples=60, database=None, deadline=None, derandomize=True)
@given(workloads(min_ranks=1, max_ranks=1).filter(lambda w: bool(w[1][0].requests)))
def test_generated_streams_run_to_the_end_within_bounds(
    tmp_path_factory: pytest.TempPathFactory, workload: Any
) -> None:
    options, (stream,) = workload
    tree = fake_tree(tmp_path_factory.mktemp("tree"))
    with collect_gaps() as gaps:
        iterations = run_protocol(
            ModelledScheduler(stream, options, tree), stream, options
        )
    assert gaps == []
    # Small by design (generate's docstring: 39 at most over 300 streams).
    assert iterations <= 48
