"""The properties on hand-built V1-runner traces: what changes for V1, and what is not run.

Traces are recorded as ``test_properties`` records them, plus the mark a V1
rank program leaves (``runner`` event), so the properties read them as the
V1 runner's. Real V1 runs are in ``test_scenarios_v1``.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_properties import POLICY, Pinned, batch, chose, pinned

from dpsim.errors import UsageError
from dpsim.properties import PROPERTIES, judge, not_run, select
from dpsim.properties.base import Verdict
from dpsim.records.case import Case, RankBatch
from dpsim.records.groups import EP_GROUP
from dpsim.records.policy import CapturePolicy, Microbatching
from dpsim.records.sync import EXPECT_EVENT, RUNNER_EVENT, SYNC_EVENT
from dpsim.sim import current_world, record, simulate

SPLITTING = CapturePolicy(
    capture_sizes=(1, 2, 4, 8),
    cudagraph_mode="FULL",
    max_num_seqs=8,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
    ),
)


def v1_agreed(
    counts: list[int], mode: str | None = "FULL", ubatch: bool = False
) -> dict[str, Any]:
    agreement: dict[str, Any] = {
        "num_tokens_across_dp": counts,
        "uniform_token_count": None,
        "eager": None,
        "num_reqs": None,
        "skip_drafts": None,
        "ubatch": ubatch,
    }
    if mode is not None:
        agreement["cg_mode"] = mode
    return agreement


def v1_verdicts(
    records: list[dict[str, Any]],
    *,
    policy: CapturePolicy = POLICY,
    expected: list[dict[str, Any]] | None = None,
    runner: str | None = "v1",
) -> list[Verdict]:
    def program(rank: int) -> None:
        if runner is not None:
            record(RUNNER_EVENT, runner=runner)
        if expected is not None and rank == 0:
            record(EXPECT_EVENT, phase="step 0", choices=expected)
        payload = {"phase": "step 0", "reused": False, "solo": False, **records[rank]}
        record(SYNC_EVENT, **payload)
        current_world().dist.barrier(group=current_world().group(EP_GROUP))

    result = simulate(program, ranks=len(records))
    steps = (tuple(RankBatch.from_dict(r["inputs"]) for r in records),)
    return judge(Case("step", "contract", policy, steps), result)


def failing(records: list[dict[str, Any]], **options: Any) -> list[str]:
    return [verdict.property for verdict in v1_verdicts(records, **options)]


def judged(records: list[dict[str, Any]], **options: Any) -> list[Pinned]:
    return pinned(v1_verdicts(records, **options))


def test_properties_that_do_not_apply_to_v1_say_why_and_are_not_run() -> None:
    skipped = not_run("v1")
    assert set(skipped) == {"agreed-values", "reuse", "idle"}
    assert all(reason for reason in skipped.values())
    assert not_run("v2") == {}
    assert all(PROPERTIES[name].applies_to("v2") for name in skipped)
    # A wrong agreed uniform length fails agreed-values on a V2 trace and
    # is not judged on a V1 one, whose agreement holds no such value.
    wrong = {**v1_agreed([1, 1]), "uniform_token_count": 7, "eager": False}
    del wrong["cg_mode"], wrong["ubatch"]
    records = [
        {"inputs": batch(1), "descriptor": chose("FULL", 1, 1), "agreement": wrong}
    ] * 2
    assert judged(records, runner=None) == [
        (
            "agreed-values",
            "step 0",
            (0, 1),
            "agreed uniform length 7, but the ranks passed [None, None]",
        )
    ]
    assert failing(records) == []


def test_coverage_on_v1_takes_an_eager_descriptor_without_a_request_count() -> None:
    # V1's eager BatchDescriptor(num_tokens) names no requests.
    records = [
        {
            "inputs": batch(3, 2),
            "descriptor": chose("NONE", 3, None),
            "agreement": v1_agreed([3, 3], mode="NONE"),
        }
    ] * 2
    assert failing(records) == []
    # The same descriptor is a shortfall for V2, whose eager descriptors do.
    v2 = [{**record, "agreement": None} for record in records]
    (shortfall,) = [
        found for found in judged(v2, runner=None) if found[0] == "coverage"
    ]
    assert shortfall == (
        "coverage",
        "step 0",
        (0,),
        "rank 0 runs NONE 3: an eager descriptor for None requests and 3 tokens, "
        "not the batch's own 2 and 3",
    )


def uniform_phase(lengths: tuple[int, ...]) -> list[dict[str, Any]]:
    """Two ranks on a FULL uniform-decode graph of length 2 and 4 tokens; rank
    1's batch has requests of ``lengths``."""
    inputs = [
        batch(4, 2, uniform_token_count=2, max_query_len=2),
        batch(sum(lengths), len(lengths), max_query_len=max(lengths)),
    ]
    return [
        {
            "inputs": rank_inputs,
            "descriptor": chose("FULL", 4, 2, uniform_token_count=2),
            "agreement": v1_agreed([4, 4]),
        }
        for rank_inputs in inputs
    ]


def test_coverage_on_v1_holds_every_request_to_the_uniform_graphs_length() -> None:
    # One shorter request (a dummy run's) is what uniform graphs allow.
    assert failing(uniform_phase((1,))) == []
    assert failing(uniform_phase((2, 1))) == []
    # A three-token request cannot run in a decode graph of length 2.
    assert judged(uniform_phase((3, 1))) == [
        (
            "coverage",
            "step 0",
            (1,),
            "rank 1 runs FULL 4: a uniform-decode graph of length 2 for a batch "
            "with a request of 3 tokens",
        )
    ]


def split_records(ubatches: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "inputs": batch(6, allow_ubatching=True),
            "descriptor": chose("NONE", 8, None, ubatches=parts),
            "agreement": v1_agreed([8, 8], mode="NONE", ubatch=parts > 1),
        }
        for parts in ubatches
    ]


def choices(parts: int) -> list[dict[str, Any]]:
    choice = {
        "cg_mode": "NONE",
        "num_tokens": 8,
        "num_ubatches": parts,
        "largest": 8,
        "uniform": None,
        "bound": None,
    }
    return [choice, choice]


def test_ubatch_decision_on_v1_holds_each_rank_to_the_oracles_split() -> None:
    assert failing(split_records([2, 2]), policy=SPLITTING, expected=choices(2)) == []
    assert judged(split_records([1, 1]), policy=SPLITTING, expected=choices(2)) == [
        (
            "ubatch-decision",
            "step 0",
            (0,),
            "rank 0 runs 1 microbatch(es), but the votes [6 tokens, 6 tokens] with "
            "thresholds decode 1 / prefill 1 and every rank's last microbatch of 8 "
            "tokens call for 2",
        )
    ]
    # No oracle (a step it could not judge): no verdict rather than a guess.
    assert "ubatch-decision" not in failing(split_records([1, 1]), policy=SPLITTING)
    # On a V2 trace the same records are judged by V2's own rule: the
    # smallest rank's 6 tokens reach the prefill threshold of 1.
    v2 = judged(split_records([1, 1]), policy=SPLITTING, runner=None)
    assert [found for found in v2 if found[0] == "ubatch-decision"] == [
        (
            "ubatch-decision",
            "step 0",
            (0,),
            "rank 0 runs 1 microbatch(es), but the votes [6 tokens, 6 tokens] with "
            "thresholds decode 1 / prefill 1 call for 2",
        )
    ]


def test_naming_a_property_that_is_not_run_on_v1_is_refused_in_one_line() -> None:
    with pytest.raises(
        UsageError, match=r"^property 'reuse' is not run on the V1 runner: "
    ):
        select(["reuse"], "v1")
    assert [prop.name for prop in select(["reuse"], "v2")] == ["reuse"]
    assert [prop.name for prop in select(["coverage"], "v1")] == ["coverage"]
