"""vLLM 0.34's split capture tables and agreed query bound, on the real release.

0.34's manager takes prefill token sizes and decode request sizes that
``VllmConfig`` resolves; dpsim runs that resolution from the release's own
``config/vllm.py`` (:mod:`dpsim.targets.split_sizes`). The expected tables
here are worked out by hand from 0.34's documented rule for the deprecated
shared sizes: prefill graphs at the shared sizes, decode graphs at the
request count each shared size rounds up to at the query length, where the
rounded size stays within the shared maximum.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.properties import Evidence, judge, select
from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import Agreement
from dpsim.scenarios import run_case
from dpsim.targets import load_target
from dpsim.targets.cache import ensure_release
from dpsim.targets.spec import DP_UTILS_IN_PACKAGE

pytestmark = pytest.mark.release

RELEASE = "0.34.0"
SHARED_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)
POLICY = CapturePolicy(
    capture_sizes=SHARED_SIZES,
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=16,
    decode_query_len=3,
)


def test_the_split_tables_are_what_the_release_resolves_from_shared_sizes() -> None:
    manager = load_target(RELEASE).build_manager(POLICY.manager_config(2))
    compilation = manager.compilation_config
    assert compilation.prefill_cudagraph_capture_token_sizes == list(SHARED_SIZES)
    # cdiv(size, 3) for each size whose rounded-up size stays within 64: 64
    # would round to 66, so it has no decode graph.
    assert compilation.decode_cudagraph_capture_request_sizes == [1, 2, 3, 6, 8, 11, 16]
    assert manager.decode_max_reqs == {3: 16}


def test_a_uniform_decode_takes_its_request_graph_and_a_mixed_batch_a_token_one() -> (
    None
):
    target = load_target(RELEASE)
    manager = target.build_manager(POLICY.manager_config(2))
    full, piecewise = target.CUDAGraphMode.FULL, target.CUDAGraphMode.PIECEWISE
    decode = manager.dispatch(10, 30, 3, 0)
    assert (decode.cg_mode, decode.num_tokens, decode.num_reqs) == (full, 33, 11)
    mixed = manager.dispatch(10, 30, None, 0)
    assert (mixed.cg_mode, mixed.num_tokens) == (piecewise, 32)


def test_only_034s_drafter_prefill_passes_the_query_bound_beside_the_reused_sync() -> (
    None
):
    assert load_target(RELEASE).drafter_prefill_passes_query_bound
    assert not load_target("0.33.0").drafter_prefill_passes_query_bound


def _bound_case(*bounds: int | None) -> Case:
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        cudagraph_mode="FULL_AND_PIECEWISE",
        max_num_seqs=8,
        decode_query_len=3,
        varlen_decode=True,
    )
    step = tuple(
        RankBatch(
            num_reqs=2,
            num_tokens=4,
            max_query_len=bound,
            uniform_decode=bound is not None,
            kind="decode" if bound is not None else "mixed",
        )
        for bound in bounds
    )
    return Case("step", "caller", policy, (step,))


def _agreement(case: Case, dp_utils: Path | None = None) -> Agreement | None:
    result = run_case(load_target(RELEASE, dp_utils), case)
    return Evidence(case, result).phases[0].agreements[0]


@pytest.mark.parametrize(
    ("bounds", "agreed"), [((2, 3), 3), ((3, 3), 3), ((2, None), None)]
)
def test_the_agreement_records_the_query_bound_the_ranks_agreed(
    bounds: tuple[int | None, ...], agreed: int | None
) -> None:
    agreement = _agreement(_bound_case(*bounds))
    assert agreement is not None and agreement.reports_max_query_len
    assert agreement.max_query_len == agreed
    assert Agreement.from_json(agreement.to_json()) == agreement


def test_a_release_before_034_reports_no_query_bound_and_writes_no_key() -> None:
    case = _bound_case(2, 3)
    result = run_case(load_target("0.33.0"), case)
    agreement = Evidence(case, result).phases[0].agreements[0]
    assert agreement is not None and not agreement.reports_max_query_len
    assert "max_query_len" not in agreement.to_json()
    assert Agreement.from_json(agreement.to_json()) == agreement


def _least_bound_sync(tmp_path: Path) -> Path:
    """0.34's own dp_utils.py, agreeing the least query bound, not the largest."""
    original = (ensure_release(RELEASE) / DP_UTILS_IN_PACKAGE).read_text()
    before = "synced_max_query_len = int(max_query_lens_across_dp.max())"
    assert original.count(before) == 1
    path = tmp_path / "dp_utils.py"
    path.write_text(original.replace(before, before.replace(".max()", ".min()")))
    return path


def test_agreed_values_catches_an_agreed_bound_below_a_ranks(tmp_path: Path) -> None:
    case = _bound_case(2, 3)
    faulty = _least_bound_sync(tmp_path)
    result = run_case(load_target(RELEASE, faulty), case)
    verdicts = judge(case, result, select(["agreed-values"]))
    assert [(v.property, v.phase, v.ranks) for v in verdicts] == [
        ("agreed-values", "step 0", (0, 1))
    ]
    assert verdicts[0].message == (
        "agreed query-length bound 2, but the ranks passed [2, 3]"
    )
    assert not judge(
        case, run_case(load_target(RELEASE), case), select(["agreed-values"])
    )


def test_check_on_034_finds_the_least_bound_sync_in_its_default_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    faulty = _least_bound_sync(tmp_path)
    status = main(
        [
            "check",
            "--vllm",
            RELEASE,
            "--target",
            str(faulty),
            "--scenario",
            "step",
            "--property",
            "agreed-values",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert status == 1
    assert "agreed query-length bound" in capsys.readouterr().out


def test_a_draft_decode_table_takes_the_request_grid_up_to_max_num_seqs() -> None:
    # 0.34's EAGLE-style speculator gives its one-token draft decodes the
    # request-count grid up to max_num_seqs, whatever the shared sizes: with
    # sizes up to 8 tokens, 13 one-token requests still pad to a 14 graph.
    from dpsim.scenarios.run import tables_for

    target = load_target(RELEASE)
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode="FULL_AND_PIECEWISE",
        max_num_seqs=16,
        decode_query_len=3,
    )
    decode = target.build_manager(tables_for(target, policy, 2).drafter_decode)
    assert decode.decode_request_sizes == [1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16]
    chosen = decode.dispatch(13, 13, 1, 0)
    assert (chosen.cg_mode, chosen.num_tokens) == (target.CUDAGraphMode.FULL, 14)
    older = load_target("0.33.0")
    assert tables_for(older, policy, 2).drafter_decode.draft_decode_for is None


@pytest.mark.parametrize("passed", [None, 1, 3])
def test_a_reusing_prefill_is_judged_by_the_bound_034_documents_it_takes(
    passed: int | None,
) -> None:
    # 0.34's reuse path dispatches with the agreed bound "including when it
    # is None", whatever the caller passes: coverage judges the graph against
    # the agreed bound (1 here), so a reused call passing none, the same or a
    # longer one runs the same graph and holds.
    from dpsim.records.case import ReuseCall

    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8),
        cudagraph_mode="FULL_DECODE_ONLY",
        max_num_seqs=16,
        decode_query_len=2,
        varlen_decode=True,
    )
    batch = RankBatch(num_reqs=1, num_tokens=1, uniform_token_count=1, max_query_len=1)
    case = Case(
        "drafter",
        "contract",
        policy,
        ((batch, batch),),
        num_speculative_steps=1,
        reuse_calls=((ReuseCall(1, passed), ReuseCall(1, passed)),),
    )
    result = run_case(load_target(RELEASE), case)
    phase = next(p for p in Evidence(case, result).phases if p.any_reused)
    assert {d.max_query_len for d in phase.descriptors} == {2}
    assert not judge(case, result, select(["coverage"]))
