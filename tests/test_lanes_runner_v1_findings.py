"""The V1 runner lane against vLLM's history: planted caller bugs and findings.

Each planted bug re-introduces, by a textual edit of a cached release's own
file in a temporary tree (never vLLM text in this repository: the edits are a
few words each), a class of DP hang vLLM shipped in the V1 runner
(``../shared/UPSTREAM_BUGS.md``): a dummy run on its local count (vLLM 25906),
an EAGLE ``dummy_run`` issuing one forward where ``propose`` issues k (26086),
a rank skipping its drafter near ``max_model_len`` (40589), a FULL dummy run
turning the drafter's graphs off (30119), the 0-token early return's dummy run
taken on the wrong backend (28774). :data:`PLANTS` says, per plant, which file
and which releases' text it edits; a test checks every edit still lands on
exactly one place, so a plant cannot silently stop planting anything.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpsim.lanes.runner.case import RunnerCase
from dpsim.lanes.runner.check import (
    DEFAULT_RUNNER_EXAMPLES,
    RunnerCheckOptions,
    RunnerCheckReport,
    run_runner_check,
)
from dpsim.lanes.runner.run import RunnerResult, run_runner_case
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.properties import RUNNER_LANE_PROPERTIES, judge
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.trace import Outcome
from dpsim.targets import load_target
from dpsim.targets.spec import TargetSpec, TreeSpec

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
EAGLE = "vllm/v1/spec_decode/eagle.py"
BASE_PROPOSER = "vllm/v1/spec_decode/llm_base_proposer.py"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (found exactly once) by ``new`` in ``path`` (relative to
    the directory holding ``vllm/``)."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Plant:
    """A bug class re-introduced in releases ``oldest``..``newest``."""

    name: str
    upstream: str
    oldest: str
    newest: str
    edits: tuple[Edit, ...]

    def applies_to(self, version: str) -> bool:
        return _key(self.oldest) <= _key(version) <= _key(self.newest)


PLANTS: dict[str, Plant] = {
    plant.name: plant
    for plant in (
        Plant(
            "dummy-local-count",
            "vllm#25906",
            "0.12.0",
            "0.33.0",
            (
                Edit(
                    RUNNER,
                    "        num_tokens_padded = batch_desc.num_tokens\n"
                    "        num_reqs_padded = (\n",
                    "        num_tokens_padded = num_tokens_unpadded\n"
                    "        num_reqs_padded = (\n",
                ),
            ),
        ),
        Plant(
            "eagle-dummy-one-forward",
            "vllm#26086",
            "0.20.0",
            "0.33.0",
            (
                Edit(
                    BASE_PROPOSER,
                    "1 if only_one_forward_pass else self.num_speculative_tokens",
                    "1",
                ),
            ),
        ),
        Plant(
            "skip-drafter-near-max",
            "vllm#40589",
            "0.25.0",
            "0.33.0",
            (
                Edit(
                    RUNNER,
                    "                        # Prevent hang when DP ranks disagree on "
                    "input_fits_in_drafter\n"
                    "                        self.drafter.dummy_run(num_tokens=1)\n",
                    "                        pass\n",
                ),
            ),
        ),
        Plant(
            "launcher-gate",
            "vllm#28774",
            "0.14.0",
            "0.33.0",
            (
                Edit(
                    RUNNER,
                    '== "external_launcher"\n'
                    "                    and self.parallel_config.data_parallel_size > 1\n",
                    '!= "external_launcher"\n'
                    "                    and self.parallel_config.data_parallel_size > 1\n",
                ),
            ),
        ),
        Plant(
            "full-dummy-drafter-eager",
            "vllm#30119",
            "0.13.0",
            "0.33.0",
            (
                Edit(
                    RUNNER,
                    "and cudagraph_runtime_mode != CUDAGraphMode.NONE\n",
                    "and cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE\n",
                ),
            ),
        ),
    )
}


def _sources(version: str) -> RunnerSources:
    return RunnerSources.for_release(version, "v1")


def planted_tree(version: str, plant: Plant, tmp_path: Path) -> Path:
    """A copy of the cached release's package with ``plant``'s edits made:
    the ``vllm`` directory to pass as ``--vllm``."""
    assert plant.applies_to(version), f"{plant.name} does not apply to {version}"
    tree = tmp_path / "vllm"
    shutil.copytree(_sources(version).package_dir, tree)
    for edit in plant.edits:
        path = tmp_path / edit.path
        text = path.read_text()
        found = text.count(edit.old)
        assert found == 1, f"{plant.name}: {edit.old!r} is {found} times in {version}"
        path.write_text(text.replace(edit.old, edit.new))
    return tree


def planted_sources(version: str, plant: Plant, tmp_path: Path) -> RunnerSources:
    return RunnerSources.for_spec(
        TargetSpec(TreeSpec(planted_tree(version, plant, tmp_path)), runner="v1")
    )


#: Releases the plants' texts are checked against (the lane's oldest, the
#: first with 40589's fix, the first with the V2 runner's reuse, the newest).
CHECKED = ("0.21.0", "0.25.0", "0.29.0", "0.33.0")


@pytest.mark.release
@pytest.mark.parametrize(
    ("name", "version"),
    [
        (name, version)
        for name, plant in sorted(PLANTS.items())
        for version in CHECKED
        if plant.applies_to(version)
    ],
)
def test_every_plant_edits_one_place_in_the_releases_it_names(
    name: str, version: str, tmp_path: Path
) -> None:
    plant = PLANTS[name]
    tree = planted_tree(version, plant, tmp_path)
    original = _sources(version).package_dir
    changed = [
        edit.path
        for edit in plant.edits
        if (tree.parent / edit.path).read_text()
        != (original.parent / edit.path).read_text()
    ]
    assert changed == [edit.path for edit in plant.edits]


def _check(
    tree: Path, examples: int, seed: int, speculators: tuple[str | None, ...] = ()
) -> RunnerCheckReport:
    """``dpsim check --lane runner --runner v1 --vllm TREE --seed SEED
    --examples EXAMPLES``, unshrunk (the first failing case is what counts)."""
    options = RunnerCheckOptions(
        runner="v1",
        seed=seed,
        examples=examples,
        speculators=speculators,
        shrink=False,
    )
    return run_runner_check(load_target(str(tree), runner="v1"), options)


#: (plant, release, seed, property found, the case it is found at): each
#: found by the default search (seed, budget 100) at the case counted. The
#: search's schedule depends on its budget, so the test runs the default one;
#: stopping at the first failure, it runs only that many cases.
FOUND_PLAIN = (
    ("dummy-local-count", "0.21.0", 0, "no-error", 7),
    ("dummy-local-count", "0.33.0", 0, "no-error", 7),
    ("launcher-gate", "0.21.0", 0, "no-hang", 5),
    ("launcher-gate", "0.33.0", 0, "no-hang", 5),
)


@pytest.mark.release
@pytest.mark.parametrize(("name", "version", "seed", "found", "cases"), FOUND_PLAIN)
def test_a_planted_caller_bug_without_a_drafter_is_found_within_the_budget(
    name: str, version: str, seed: int, found: str, cases: int, tmp_path: Path
) -> None:
    tree = planted_tree(version, PLANTS[name], tmp_path)
    report = _check(
        tree, examples=DEFAULT_RUNNER_EXAMPLES, seed=seed, speculators=(None,)
    )
    assert report.finding is not None, f"{name} not found in the default budget"
    assert report.finding.primary.property == found
    assert report.examples == cases


#: (plant, seed, examples): drafter plants on 0.33.0, each found by the
#: seeded search within the default budget (the first case found is 20th
#: or earlier; with this budget, the 5th).
FOUND_DRAFTER = (
    ("eagle-dummy-one-forward", 0, 20),
    ("skip-drafter-near-max", 0, 20),
)
#: What a drafter's missing or extra collective shows as first: a rank left
#: waiting (``no-hang``), the forward counts (``drafter-forwards``) or a rank
#: that read a peer's sync as its own and raised (``no-error``).
DESYNC = {"no-hang", "drafter-forwards", "no-error"}


@pytest.mark.release
@pytest.mark.parametrize(("name", "seed", "cases"), FOUND_DRAFTER)
def test_a_planted_drafter_bug_is_found_within_the_budget(
    name: str, seed: int, cases: int, tmp_path: Path
) -> None:
    tree = planted_tree("0.33.0", PLANTS[name], tmp_path)
    report = _check(tree, examples=cases, seed=seed)
    assert report.finding is not None, f"{name} not found in {cases} cases"
    assert report.finding.primary.property in DESYNC
    assert report.finding.case.options.speculator is not None


def _one_busy_rank(
    policy: CapturePolicy, options: EngineOptions, request: RequestScript
) -> RunnerCase:
    """Two ranks: rank 0 idle (the engine's dummy batches), rank 1 one request."""
    return RunnerCase(
        policy,
        options,
        (RankStream(), RankStream((request,))),
        seed=0,
        runner="v1",
    )


#: 40589's case: rank 1's request (9 + 5 tokens) comes within k = 2 of
#: max_model_len 16, so its fit check fails while the idle rank drafts.
NEAR_MAX = _one_busy_rank(
    CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode=CudagraphMode.PIECEWISE,
        max_num_seqs=1,
        decode_query_len=3,
    ),
    EngineOptions(
        max_num_seqs=1,
        max_num_batched_tokens=8,
        max_model_len=16,
        speculator="eagle",
        num_speculative_tokens=2,
    ),
    RequestScript("r1-0", 0, 9, 5),
)


def _verdicts(version: str, case: RunnerCase) -> tuple[RunnerResult, list[str]]:
    run = run_runner_case(load_target(version, runner="v1"), case)
    verdicts = judge(case, run.result, RUNNER_LANE_PROPERTIES.values())
    return run, [verdict.property for verdict in verdicts]


@pytest.mark.release
def test_a_rank_skipping_its_drafter_near_max_model_len_hangs_before_0_25() -> None:
    """vLLM 40589 on the release's own code: before 0.25 a rank whose longest
    request does not fit the drafter skips ``propose`` altogether
    (``input_fits_in_drafter``) while its idle peer's dummy run drafts; 0.25
    runs ``drafter.dummy_run(num_tokens=1)`` there instead."""
    run, found = _verdicts("0.24.0", NEAR_MAX)
    assert run.result.outcome == Outcome.HANG
    assert "no-hang" in found
    # The idle rank waits in its drafter's own DP sync.
    assert any(
        "in _determine_batch_execution_and_padding" in line and "spec_decode" in line
        for line in run.stood_at[0]
    )
    run, found = _verdicts("0.25.0", NEAR_MAX)
    assert run.result.outcome == Outcome.OK
    assert found == []


@pytest.mark.release
def test_the_plant_re_introducing_40589_hangs_the_same_case(tmp_path: Path) -> None:
    tree = planted_tree("0.33.0", PLANTS["skip-drafter-near-max"], tmp_path)
    run, found = _verdicts(str(tree), NEAR_MAX)
    assert run.result.outcome == Outcome.HANG
    assert "no-hang" in found
    run, found = _verdicts("0.33.0", NEAR_MAX)
    assert run.result.outcome == Outcome.OK
    assert found == []


#: An idle rank beside one decode under FULL graphs with EAGLE k = 1.
IDLE_DUMMY_UNDER_FULL = _one_busy_rank(
    CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode=CudagraphMode.FULL,
        max_num_seqs=1,
        decode_query_len=2,
    ),
    EngineOptions(
        max_num_seqs=1,
        max_num_batched_tokens=8,
        max_model_len=16,
        speculator="eagle",
        num_speculative_tokens=1,
    ),
    RequestScript("r1-0", 0, 1, 1),
)


@pytest.mark.release
def test_an_idle_ranks_one_token_dummy_trips_the_dispatcher_before_0_18() -> None:
    """Finding (examined on the code): the engine's ``execute_dummy_batch``
    runs ``_dummy_run(1, uniform_decode=True)`` (0.12-0.18), one request of
    one token called a uniform decode where decodes are 1 + k; under FULL
    graphs the dispatcher pads it as a uniform decode and asserts the padded
    size is a multiple of 1 + k, so the idle rank raises while its busy peer
    waits in the target's DP sync. 0.19's ``execute_dummy_batch`` passes
    ``uniform_decode_query_len`` tokens instead (0.21 holds below: 0.14-0.19's
    drafters launch a triton kernel the lane does not stand in for)."""
    run, found = _verdicts("0.12.0", IDLE_DUMMY_UNDER_FULL)
    assert found[0] == "no-error"
    error = run.result.ranks[0].error
    assert error is not None and error.type == "AssertionError"
    assert error.where.startswith("cudagraph_dispatcher.py:")
    assert error.where.endswith(" in _create_padded_batch_descriptor")
    # Its busy peer waits in the caller method's real DP sync.
    assert any(
        "in _determine_batch_execution_and_padding" in line for line in run.stood_at[1]
    )
    run, found = _verdicts("0.21.0", IDLE_DUMMY_UNDER_FULL)
    assert run.result.outcome == Outcome.OK
    assert found == []


#: A 9-token request (an 8-token prefill chunk, then 1) beside an idle rank,
#: vLLM's default mode FULL_AND_PIECEWISE, EAGLE k = 2.
EAGER_TARGET_STEP = _one_busy_rank(
    CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
        max_num_seqs=1,
        decode_query_len=3,
    ),
    EngineOptions(
        max_num_seqs=1,
        max_num_batched_tokens=8,
        max_model_len=16,
        speculator="eagle",
        num_speculative_tokens=2,
    ),
    RequestScript("r1-0", 0, 9, 1),
)


@pytest.mark.release
@pytest.mark.parametrize(("version", "hangs"), [("0.13.0", True), ("0.17.0", False)])
def test_an_idle_drafter_follows_an_eager_target_where_the_busy_one_graphs(
    version: str, hangs: bool
) -> None:
    """Finding (examined on the code): 0.13-0.16's ``_dummy_run`` gives the
    drafter graphs only when the agreed target step is not eager (30119's
    fix), while a busy rank's ``propose`` picks its graph from its own count
    after a count-only DP sync (``_pad_batch_across_dp``). A step the ranks
    agree to run eager leaves the idle rank drafting eager beside a busy rank
    replaying a drafter graph: the first drafter forward differs. 0.17's
    drafter syncs its mode too (``_determine_batch_execution_and_padding``)."""
    run, found = _verdicts(version, EAGER_TARGET_STEP)
    if hangs:
        assert run.result.outcome == Outcome.MISMATCH
        assert found == ["no-hang"]
        assert run.stood_at[0][0].endswith(" in dummy_run")
        assert run.stood_at[1][0].endswith(" in propose")
    else:
        assert run.result.outcome == Outcome.OK
        assert found == []
