"""Each property on hand-built traces: it flags what it exists for, and only that.

The traces are made by running tiny programs on the simulator that record
``sync`` events as the scenarios do, so the properties see exactly the shape
of evidence they see in a real check. The corpus tests (test_corpus.py) show
each property catching a planted bug in a full dp_utils module.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
import torch

from dpsim.errors import UsageError
from dpsim.properties import PROPERTIES, PROPERTY_NAMES, judge, select
from dpsim.properties.base import Evidence, Phase, Verdict
from dpsim.records.case import Case, RankBatch
from dpsim.records.groups import DP_CPU_GROUP, EP_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode, Microbatching
from dpsim.records.sync import (
    EXPECT_EVENT,
    SYNC_EVENT,
    WORKER_ERROR_EVENT,
    Agreement,
    Choice,
    Descriptor,
    ExpectRecord,
    SyncRecord,
)
from dpsim.records.trace import Event
from dpsim.sim import current_world, record, simulate

POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8), cudagraph_mode="FULL", max_num_seqs=8
)


def batch(tokens: int, reqs: int | None = None, **extra: Any) -> dict[str, Any]:
    fields = RankBatch(
        num_reqs=tokens if reqs is None else reqs, num_tokens=tokens, **extra
    )
    return fields.to_dict()


def chose(
    mode: str, tokens: int, reqs: int | None = None, ubatches: int = 1, **extra: Any
) -> dict[str, Any]:
    descriptor = {
        "cg_mode": mode,
        "num_tokens": tokens,
        "num_reqs": reqs,
        "uniform_token_count": None,
        "max_query_len": None,
        "num_active_loras": 0,
        "num_ubatches": ubatches,
    }
    descriptor.update(extra)
    return descriptor


def agreed(
    counts: list[int], eager: bool | None = False, **extra: Any
) -> dict[str, Any]:
    agreement = {
        "num_tokens_across_dp": counts,
        "uniform_token_count": None,
        "eager": eager,
        "num_reqs": None,
        "skip_drafts": None,
    }
    agreement.update(extra)
    return agreement


def verdicts(
    records: list[dict[str, Any]],
    *,
    skip_forward_on: tuple[int, ...] = (),
    policy: CapturePolicy = POLICY,
    expected: list[dict[str, Any]] | None = None,
) -> list[Verdict]:
    """Record one phase per rank as given (and the oracle's ``expected``
    choices, as the scenarios do); return the failing properties' verdicts."""

    def program(rank: int) -> None:
        if expected is not None and rank == 0:
            record(EXPECT_EVENT, phase="step 0", choices=expected)
        payload = {"phase": "step 0", "reused": False, "solo": False, **records[rank]}
        record(SYNC_EVENT, **payload)
        if "error" in payload:
            raise AssertionError(payload["error"])
        if rank not in skip_forward_on:
            current_world().dist.barrier(group=current_world().group(EP_GROUP))

    result = simulate(program, ranks=len(records))
    steps = (tuple(RankBatch.from_dict(r["inputs"]) for r in records),)
    case = Case("step", "contract", policy, steps)
    return judge(case, result)


def failing(records: list[dict[str, Any]], **options: Any) -> list[str]:
    """The names of the properties failing on ``records`` (see ``verdicts``)."""
    return [verdict.property for verdict in verdicts(records, **options)]


Pinned = tuple[str, str | None, tuple[int, ...], str]


def pinned(found: list[Verdict]) -> list[Pinned]:
    """Each verdict as a reader sees it: property, phase, ranks and message."""
    return [(v.property, v.phase, v.ranks, v.message) for v in found]


def judged(records: list[dict[str, Any]], **options: Any) -> list[Pinned]:
    """The verdicts on ``records`` (see ``verdicts``), each pinned whole."""
    return pinned(verdicts(records, **options))


def test_a_correct_phase_fails_nothing() -> None:
    records = [
        {
            "inputs": batch(3),
            "descriptor": chose("FULL", 4, 4),
            "agreement": agreed([4, 4]),
        },
        {
            "inputs": batch(1),
            "descriptor": chose("FULL", 4, 4),
            "agreement": agreed([4, 4]),
        },
    ]
    assert failing(records) == []


def test_a_sync_event_that_is_no_sync_record_is_refused_not_judged() -> None:
    # A renamed key once read as a missing descriptor ("the call raised") or a
    # silent None; now judging the run stops and names the record.
    fine = {
        "inputs": batch(1),
        "descriptor": chose("FULL", 1, 1),
        "agreement": agreed([1, 1]),
    }
    renamed = {"inputs": batch(1), "descriptr": fine["descriptor"], "agreement": None}
    with pytest.raises(ValueError, match=r"^malformed sync record: .*descriptr"):
        failing([fine, renamed])


def test_agreement_flags_a_per_rank_value_in_the_agreement_alone() -> None:
    records = [
        {
            "inputs": batch(2),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2], uniform_token_count=1),
        },
        {
            "inputs": batch(2),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2], uniform_token_count=2),
        },
    ]
    assert judged(records) == [
        (
            "agreement",
            "step 0",
            (0, 1),
            "rank 0 and rank 1 got different agreements (uniform_token_count: 1 vs 2)",
        )
    ]


def test_agreement_flags_different_padded_counts_unless_eager() -> None:
    graph = [
        {
            "inputs": batch(2),
            "descriptor": chose("PIECEWISE", 2),
            "agreement": agreed([2, 4]),
        },
        {
            "inputs": batch(3),
            "descriptor": chose("PIECEWISE", 4),
            "agreement": agreed([2, 4]),
        },
    ]
    assert judged(graph) == [
        (
            "agreement",
            "step 0",
            (0, 1),
            "ranks chose different padded token counts: rank 0 2, rank 1 4",
        )
    ]
    eager = [
        {
            "inputs": batch(2),
            "descriptor": chose("NONE", 2, 2),
            "agreement": agreed([2, 3], eager=True),
        },
        {
            "inputs": batch(3),
            "descriptor": chose("NONE", 3, 3),
            "agreement": agreed([2, 3], eager=True),
        },
    ]
    assert failing(eager) == []


def test_no_hang_flags_a_rank_that_skips_a_collective_and_names_the_stuck() -> None:
    records = [
        {
            "inputs": batch(1),
            "descriptor": chose("FULL", 1, 1),
            "agreement": agreed([1, 1]),
        },
        {
            "inputs": batch(1),
            "descriptor": chose("FULL", 1, 1),
            "agreement": agreed([1, 1]),
        },
    ]
    # Rank 1 skips the forward's collective: rank 0, which entered it, is
    # the one left waiting; rank 1 finished.
    assert judged(records, skip_forward_on=(1,)) == [
        ("no-hang", None, (0,), "hang: 1 of 2 ranks finished; stuck: 0")
    ]


def test_no_error_flags_a_raise_and_no_hang_leaves_it_to_no_error() -> None:
    records = [
        {"inputs": batch(1), "error": "AssertionError: padding"},
        {
            "inputs": batch(1),
            "descriptor": chose("FULL", 1, 1),
            "agreement": agreed([1, 1]),
        },
    ]
    assert judged(records) == [
        ("no-error", "step 0", (0,), "rank 0 raised AssertionError: padding")
    ]


def test_no_error_names_a_rank_that_raised_outside_any_sync() -> None:
    def program(rank: int) -> None:
        if rank == 1:
            raise RuntimeError("no batch to run")

    result = simulate(program, ranks=2)
    case = Case("step", "contract", POLICY, ((RankBatch(1, 1), RankBatch(1, 1)),))
    assert pinned(judge(case, result)) == [
        ("no-error", None, (1,), "rank 1 raised RuntimeError: no batch to run")
    ]


def test_coverage_flags_a_graph_too_small_for_the_ranks_requests() -> None:
    records = [
        {
            "inputs": batch(4, 4),
            "descriptor": chose("FULL", 4, 2),
            "agreement": agreed([4, 4]),
        },
        {
            "inputs": batch(2, 2),
            "descriptor": chose("FULL", 4, 2),
            "agreement": agreed([4, 4]),
        },
    ]
    assert judged(records) == [
        ("coverage", "step 0", (0,), "rank 0 runs FULL 4: 2 requests < the batch's 4")
    ]


@pytest.mark.parametrize(
    ("inputs", "descriptor", "shortfall"),
    [
        (
            batch(4, 4, uniform_token_count=None),
            chose("FULL", 4, 4, uniform_token_count=1),
            "a uniform-decode graph of length 1 for a batch whose uniform length "
            "is None",
        ),
        (
            batch(4, 2, max_query_len=None),
            chose("FULL", 4, 4, max_query_len=2),
            "query length bound 2 < the batch's None",
        ),
        (
            batch(4, 2, num_active_loras=2),
            chose("FULL", 4, 4, num_active_loras=1),
            "a graph for 1 LoRAs with 2 active",
        ),
    ],
)
def test_coverage_flags_uniform_query_bound_and_lora_shortfalls(
    inputs: dict, descriptor: dict, shortfall: str
) -> None:
    records = [
        {"inputs": inputs, "descriptor": descriptor, "agreement": agreed([4, 4])}
    ] * 2
    assert judged(records) == [
        ("coverage", "step 0", (0,), f"rank 0 runs FULL 4: {shortfall}")
    ]


def test_coverage_lets_a_split_eager_step_pad_tokens_but_not_requests() -> None:
    padded = split_phase([4, 6], 2)  # both ranks run 6 tokens, their own requests
    assert "coverage" not in failing(padded, policy=SPLITTING)
    padded[0] = {
        **padded[0],
        "descriptor": chose("NONE", 6, 6, ubatches=2),  # rank 0 has 4 requests
    }
    assert judged(padded, policy=SPLITTING) == [
        (
            "coverage",
            "step 0",
            (0,),
            "rank 0 runs NONE 6: an eager descriptor for 6 requests and 6 tokens, "
            "not the batch's own 4 and 4",
        )
    ]


@pytest.mark.parametrize("eager", [False, None], ids=["DPSyncState", "tensor"])
def test_coverage_lets_ranks_run_eager_at_an_agreed_graph_size_the_table_lacked(
    eager: bool | None,
) -> None:
    # The ranks agreed on 2 tokens (not eager) but the table has no graph for
    # the agreed batch: every rank runs eager at 2, rank 1 with 1 real token.
    # Versions before 0.29 return the padded count tensor, with no eager flag
    # (None): their eager branch returns each rank's own count, so an eager
    # descriptor at the rank's agreed entry is that same case.
    records = [
        {
            "inputs": batch(count),
            "descriptor": chose("NONE", 2, count),
            "agreement": agreed([2, 2], eager=eager),
        }
        for count in (2, 1)
    ]
    assert "coverage" not in failing(records)
    for synced in records:
        synced["agreement"] = agreed([2, 2], eager=True)  # then nothing was padded
    assert judged(records) == [
        (
            "coverage",
            "step 0",
            (1,),
            "rank 1 runs NONE 2: an eager descriptor for 1 requests and 2 tokens, "
            "not the batch's own 1 and 1",
        )
    ]


def test_eager_contagion_flags_an_ignored_need_eager() -> None:
    records = [
        {
            "inputs": batch(2, need_eager=True),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2]),
        },
        {
            "inputs": batch(2),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2]),
        },
    ]
    assert judged(records) == [
        (
            "eager-contagion",
            "step 0",
            (0, 1),
            "rank 0 asked for eager but replays a FULL graph",
        )
    ]


def test_idle_flags_an_agreement_when_nobody_has_work() -> None:
    records = [
        {
            "inputs": batch(0),
            "descriptor": chose("NONE", 0, 0),
            "agreement": agreed([0, 0]),
        }
    ] * 2
    assert judged(records, skip_forward_on=(0, 1)) == [
        ("idle", "step 0", (0,), "no rank has work, yet rank 0 got an agreement to run")
    ]
    nothing = [
        {"inputs": batch(0), "descriptor": chose("NONE", 0, 0), "agreement": None}
    ] * 2
    assert failing(nothing, skip_forward_on=(0, 1)) == []


def test_idle_flags_a_busy_step_without_an_agreement() -> None:
    records = [
        {"inputs": batch(1), "descriptor": chose("FULL", 1, 1), "agreement": None}
    ] * 2
    assert judged(records) == [
        ("idle", "step 0", (0,), "some rank has work, yet rank 0 got no agreement")
    ]


def test_padded_counts_flags_agreed_counts_not_updated_to_the_padding() -> None:
    records = [
        {
            "inputs": batch(3),
            "descriptor": chose("PIECEWISE", 4),
            "agreement": agreed([3, 3]),
        }
    ] * 2
    assert judged(records) == [
        (
            "padded-counts",
            "step 0",
            (0,),
            "rank 0's agreement says rank 0 runs 3 tokens; it runs 4",
        )
    ]


def test_ubatch_split_flags_an_empty_last_microbatch() -> None:
    # vLLM 57020: counts [64, 128] with a 128-token graph in 2 microbatches.
    records = [
        {
            "inputs": batch(64, 8),
            "descriptor": chose("FULL", 128, 16, ubatches=2),
            "agreement": agreed([128, 128]),
        },
        {
            "inputs": batch(128, 16),
            "descriptor": chose("FULL", 128, 16, ubatches=2),
            "agreement": agreed([128, 128]),
        },
    ]
    assert judged(records) == [
        (
            "ubatch-split",
            "step 0",
            (0,),
            "rank 0 replays a FULL graph of 128 tokens in 2 microbatches with 64 "
            "real tokens: its last microbatch is empty",
        )
    ]
    filled = [dict(records[1]), dict(records[1])]
    filled[0] = {**records[0], "inputs": batch(65, 8)}
    assert failing(filled) == []


SPLITTING = replace(
    POLICY,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=4, prefill_token_threshold=8
    ),
)


def split_phase(
    tokens: list[int], ubatches: int, *, decode: bool = True, allow: bool = True
) -> list[dict[str, Any]]:
    """Eager ranks (so ubatch-split has nothing to say) with these counts; a
    split step pads every rank to the largest, as vLLM's does."""
    runs = [max(tokens)] * len(tokens) if ubatches > 1 else tokens
    return [
        {
            "inputs": batch(
                count,
                uniform_token_count=1 if decode else None,
                uniform_decode=decode,
                allow_ubatching=allow or rank > 0,
            ),
            "descriptor": chose("NONE", runs[rank], count, ubatches=ubatches),
            "agreement": agreed(
                runs, eager=True, uniform_token_count=1 if decode else None
            ),
        }
        for rank, count in enumerate(tokens)
    ]


@pytest.mark.parametrize(
    ("tokens", "decode", "allow", "expected", "votes"),
    [
        # The smallest reaches the decode threshold.
        ([4, 6], True, True, 2, "4 tokens decode, 6 tokens decode"),
        # The smallest does not.
        ([3, 6], True, True, 1, "3 tokens decode, 6 tokens decode"),
        # A prefill is held to the prefill threshold.
        ([6, 9], False, True, 1, "6 tokens, 9 tokens"),
        ([8, 9], False, True, 2, "8 tokens, 9 tokens"),
        # Rank 0 did not allow it.
        ([4, 6], True, False, 1, "4 tokens decode no-split, 6 tokens decode"),
    ],
)
def test_ubatch_decision_flags_a_split_the_votes_do_not_call_for(
    tokens: list[int], decode: bool, allow: bool, expected: int, votes: str
) -> None:
    right = split_phase(tokens, expected, decode=decode, allow=allow)
    assert failing(right, policy=SPLITTING) == []
    wrong = split_phase(tokens, 3 - expected, decode=decode, allow=allow)
    assert judged(wrong, policy=SPLITTING) == [
        (
            "ubatch-decision",
            "step 0",
            (0,),
            f"rank 0 runs {3 - expected} microbatch(es), but the votes [{votes}] "
            f"with thresholds decode 4 / prefill 8 call for {expected}",
        )
    ]
    # Without microbatching configured there is nothing to decide.
    assert "ubatch-decision" not in failing(wrong)


def oracle(mode: str, tokens: int, ranks: int = 2) -> list[dict[str, Any]]:
    agreed = {"largest": 3, "uniform": None, "bound": None}
    return [
        {"cg_mode": mode, "num_tokens": tokens, "num_ubatches": 1, **agreed}
    ] * ranks


def graph_phase(mode: str, tokens: int) -> list[dict[str, Any]]:
    eager = mode == "NONE"
    return [
        {
            "inputs": batch(count),
            "descriptor": chose(mode, count if eager else tokens, count),
            "agreement": agreed([3, 1] if eager else [tokens] * 2, eager=eager),
        }
        for count in (3, 1)
    ]


def test_graph_choice_flags_needless_eager_and_over_padding_only() -> None:
    # The table gives the agreed batch (3 tokens) a FULL graph of 4.
    assert failing(graph_phase("FULL", 4), expected=oracle("FULL", 4)) == []
    agreed_batch = "(largest 3 tokens, uniform None, query bound None)"
    assert judged(graph_phase("NONE", 0), expected=oracle("FULL", 4)) == [
        (
            "graph-choice",
            "step 0",
            (0,),
            f"rank 0 runs NONE x 3 tokens, but the agreed batch {agreed_batch} "
            "calls for FULL x 4 tokens",
        )
    ]
    assert judged(graph_phase("FULL", 8), expected=oracle("FULL", 4)) == [
        (
            "graph-choice",
            "step 0",
            (0,),
            f"rank 0 runs FULL x 8 tokens, but the agreed batch {agreed_batch} "
            "calls for FULL x 4 tokens",
        )
    ]
    # Where the oracle says eager, a graph is for the safety properties to
    # judge (here none objects), not reported twice.
    assert failing(graph_phase("FULL", 4), expected=oracle("NONE", 3)) == []
    # No oracle recorded (a profile run): nothing to judge.
    assert failing(graph_phase("NONE", 0)) == []


def solo_verdicts(alone: dict[str, Any], *, sync_alone: bool = False) -> list[Pinned]:
    """Two ranks sync a step together, then each alone, as the scenarios do."""
    together = {
        "inputs": batch(3),
        "descriptor": chose("FULL", 4, 4),
        "agreement": agreed([4, 4]),
    }

    def program(rank: int) -> None:
        world = current_world()
        record(SYNC_EVENT, phase="step 0", reused=False, solo=False, **together)
        world.dist.barrier(group=world.group(EP_GROUP))
        if sync_alone:
            world.dist.barrier(group=world.group(DP_CPU_GROUP))
        record(SYNC_EVENT, phase="solo 0", reused=False, solo=True, **alone)

    result = simulate(program, ranks=2)
    step = (RankBatch.from_dict(together["inputs"]),) * 2
    case = Case("step", "contract", POLICY, (step,))
    return pinned(judge(case, result, [PROPERTIES["solo"]]))


def test_solo_flags_a_skipped_sync_that_answers_differently_or_syncs() -> None:
    same = {
        "inputs": batch(3),
        "descriptor": chose("FULL", 4, 4),
        "agreement": agreed([4, 4]),
    }
    assert solo_verdicts(same) == []
    assert solo_verdicts(same, sync_alone=True) == [
        ("solo", "solo 0", (0,), "rank 0 skipped DP coordination but synced")
    ]
    own_column_lost = {**same, "agreement": agreed([4, 0])}
    assert solo_verdicts(own_column_lost) == [
        (
            "solo",
            "solo 0",
            (0,),
            "rank 0 alone got agreement {num_tokens_across_dp=[4, 0], eager=False}, "
            "but with every rank's identical batch the ranks agreed "
            "{num_tokens_across_dp=[4, 4], eager=False}",
        )
    ]


def test_every_property_documents_what_it_guards() -> None:
    assert set(PROPERTY_NAMES) >= {
        "agreement",
        "no-hang",
        "coverage",
        "eager-contagion",
        "idle",
        "padded-counts",
    }
    for prop in PROPERTIES.values():
        assert prop.summary and prop.guards
        module = __import__(prop.judge.__module__, fromlist=["_"])
        assert module.__doc__ and "Why" in module.__doc__


def test_unknown_property_names_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown property 'agreemnt'"):
        select(["agreemnt"])
    assert [prop.name for prop in select(["idle"])] == ["idle"]


def test_agreed_values_flags_a_wrong_value_every_rank_shares() -> None:
    # Same on both ranks, so `agreement` holds; but no rank has a uniform length.
    records = [
        {
            "inputs": batch(2),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2], uniform_token_count=1),
        },
    ] * 2
    assert judged(records) == [
        (
            "agreed-values",
            "step 0",
            (0, 1),
            "agreed uniform length 1, but the ranks passed [None, None]",
        )
    ]


@pytest.mark.parametrize(
    ("inputs", "descriptor", "agreement", "message"),
    [
        # A request bound below a rank's batch.
        (
            batch(4, 3),
            chose("PIECEWISE", 4),
            agreed([4, 4], num_reqs=2),
            "agreed request bound 2, but the ranks have up to 3 requests",
        ),
        # Drafts skipped though a rank did not allow it.
        (
            batch(2),
            chose("FULL", 2, 2),
            agreed([2, 2], skip_drafts=True),
            "agreed skip_drafts=True, but the ranks voted [False, False]",
        ),
        # Agreed eager while the ranks replay graphs.
        (
            batch(2),
            chose("FULL", 2, 2),
            agreed([2, 2], eager=True),
            "agreed eager, but a rank replays a FULL graph",
        ),
    ],
)
def test_agreed_values_flags_request_bound_skip_drafts_and_eager(
    inputs: dict, descriptor: dict, agreement: dict, message: str
) -> None:
    records = [{"inputs": inputs, "descriptor": descriptor, "agreement": agreement}] * 2
    assert judged(records) == [("agreed-values", "step 0", (0, 1), message)]


def test_agreed_values_accepts_a_full_graphs_padded_request_bound() -> None:
    records = [
        {
            "inputs": batch(3, 3),
            "descriptor": chose("FULL", 4, 4),
            "agreement": agreed([4, 4], num_reqs=4),
        },
        {
            "inputs": batch(2, 2),
            "descriptor": chose("FULL", 4, 4),
            "agreement": agreed([4, 4], num_reqs=4),
        },
    ]
    assert failing(records) == []


def reuse_run(
    resync: bool, reused_agreement: dict[str, Any], runs: int = 2
) -> list[Pinned]:
    """A fresh sync, then a reusing one; ``resync`` makes the reuse all-reduce again."""
    fresh = {
        "inputs": batch(2),
        "descriptor": chose("FULL", 2, 2),
        "agreement": agreed([2, 2]),
    }

    def program(rank: int) -> None:
        world = current_world()
        world.dist.all_reduce(torch.zeros(2), group=world.group("dp_cpu"))
        record(SYNC_EVENT, phase="step 0", reused=False, solo=False, **fresh)
        if resync:
            world.dist.all_reduce(torch.zeros(2), group=world.group("dp_cpu"))
        record(
            SYNC_EVENT,
            phase="drafter prefill 0",
            reused=True,
            solo=False,
            inputs=batch(runs),
            descriptor=chose("FULL", runs, runs),
            agreement=reused_agreement,
        )

    result = simulate(program, ranks=2)
    case = Case("drafter", "contract", POLICY, ((RankBatch(2, 2), RankBatch(2, 2)),))
    return pinned(judge(case, result))


def test_reuse_flags_a_second_sync_and_a_changed_agreement_but_allows_padding() -> None:
    assert reuse_run(resync=False, reused_agreement=agreed([2, 2])) == []
    padded_further = agreed([4, 4])
    assert reuse_run(resync=False, reused_agreement=padded_further, runs=4) == []
    where = ("reuse", "drafter prefill 0", (0,))
    assert reuse_run(resync=True, reused_agreement=agreed([2, 2])) == [
        (*where, "rank 0 reused an agreement but synced again")
    ]
    assert reuse_run(resync=False, reused_agreement=agreed([2, 2], eager=True)) == [
        (*where, "reuse changed the agreed eager from False to True")
    ]
    assert reuse_run(resync=False, reused_agreement=agreed([1, 1]), runs=1) == [
        (
            *where,
            "reuse changed the agreed counts from [2, 2] to [1, 1], not only "
            "padding them",
        )
    ]


# -- verdict ranks: distinct and ascending, as a counterexample's reader wants ---


def test_a_verdict_lists_each_rank_once_in_ascending_order() -> None:
    assert Verdict("no-hang", None, (2, 0, 2, 1), "m").ranks == (0, 1, 2)


def test_a_rank_that_asked_for_eager_and_replays_a_graph_is_named_once() -> None:
    # Found by `dpsim check --scenario ubatch`: the verdict once listed [0, 0, 1]
    # and its own counterexample file was refused by `dpsim replay`.
    records = [
        {
            "inputs": batch(2, need_eager=True),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2]),
        },
        {
            "inputs": batch(2),
            "descriptor": chose("FULL", 2, 2),
            "agreement": agreed([2, 2]),
        },
    ]
    (verdict,) = verdicts(records)
    assert verdict.ranks == (0, 1)
    assert verdict.message == "rank 0 asked for eager but replays a FULL graph"


def test_a_rank_whose_own_agreed_count_is_wrong_is_named_once() -> None:
    records = [
        {
            "inputs": batch(2),
            "descriptor": chose("NONE", 2, 2),
            "agreement": agreed([3, 2], eager=True),
        },
        {
            "inputs": batch(2),
            "descriptor": chose("NONE", 2, 2),
            "agreement": agreed([3, 2], eager=True),
        },
    ]
    found = {verdict.property: verdict for verdict in verdicts(records)}
    assert found["padded-counts"].ranks == (0,)


def _returned(
    tokens: int,
    mode: CudagraphMode = CudagraphMode.NONE,
    *,
    reused: bool = False,
    padding: int = 0,
) -> SyncRecord:
    """A step-0 sync that returned ``mode`` for ``tokens`` (plus ``padding``)."""
    batch = RankBatch(num_reqs=1, num_tokens=tokens, uniform_token_count=None)
    return SyncRecord(
        "step 0",
        batch,
        reused,
        False,
        Descriptor(mode, tokens + padding, 1),
        Agreement((tokens, 0), eager=mode == CudagraphMode.NONE),
    )


def test_a_phases_columns_read_what_its_accessors_read() -> None:
    # A phase works its columns out in one pass as it is made: they must
    # read what the per-rank accessors read of its records.
    raised = SyncRecord(
        "step 0", RankBatch(num_reqs=1, num_tokens=2), False, False, error="E: x"
    )
    for records in (
        (_returned(0), _returned(0)),
        (_returned(3), _returned(0, reused=True)),
        (_returned(3), None),
        (_returned(3), raised),
    ):
        made = Phase("step 0", records)
        ranks = range(len(records))
        assert made.complete == all(r is not None and not r.raised for r in records)
        if made.complete:
            assert made.all_inputs == tuple(made.inputs(rank) for rank in ranks)
            assert made.descriptors == tuple(made.descriptor(rank) for rank in ranks)
            assert made.agreements == tuple(made.agreement(rank) for rank in ranks)
        assert made.any_work == any(
            r is not None and r.inputs.num_tokens > 0 for r in records
        )
        assert made.any_reused == any(r is not None and r.reused for r in records)


def test_a_phase_made_by_of_reads_as_one_made_plainly() -> None:
    # The judge makes its phases with Phase.of, without the dataclass's
    # frozen __init__: every column must read as a plainly made phase's.
    raised = SyncRecord(
        "step 0", RankBatch(num_reqs=1, num_tokens=2), False, False, error="E: x"
    )
    for records in (
        (_returned(0, padding=1), _returned(0, CudagraphMode.FULL, padding=1)),
        (
            _returned(3, CudagraphMode.FULL, padding=1),
            _returned(0, reused=True, padding=1),
        ),
        (_returned(3, padding=1), None),
        (raised, _returned(3, padding=1)),
        (),
    ):
        plain, made = Phase("step 0", records), Phase.of("step 0", records)
        assert made == plain
        for column in ("complete", "any_work", "any_reused"):
            assert getattr(made, column) == getattr(plain, column), (records, column)
        if plain.complete:
            for column in ("all_inputs", "descriptors", "agreements"):
                assert getattr(made, column) == getattr(plain, column)
            assert made.modes == tuple(d.cg_mode for d in plain.descriptors)
            assert made.padded_counts == tuple(d.num_tokens for d in plain.descriptors)


def test_a_phase_finds_the_first_agreement_differing_in_any_field() -> None:
    # Agreements are compared by their fields' __dict__s first: a difference
    # in any one field, on any rank, must still be found, and equal values in
    # other objects must not read as a difference.
    def phase(*agreements: Agreement | None) -> Phase:
        batch = RankBatch(num_reqs=1, num_tokens=1)
        descriptor = Descriptor(CudagraphMode.NONE, 1, 1)
        return Phase(
            "step 0",
            tuple(
                SyncRecord("step 0", batch, False, False, descriptor, agreement)
                for agreement in agreements
            ),
        )

    base = Agreement((1, 1, 1), uniform_token_count=1, eager=False, num_reqs=1)
    assert phase(base, replace(base), replace(base)).agreements_differ is None
    assert phase(None, None).agreements_differ is None
    assert phase(base, None).agreements_differ == (0, 1)
    assert phase(None, base).agreements_differ == (0, 1)
    changed = {
        "num_tokens_across_dp": (1, 2, 1),
        "uniform_token_count": None,
        "eager": True,
        "num_reqs": 2,
        "skip_drafts": True,
        "cg_mode": CudagraphMode.FULL,
        "ubatch": True,
        "max_query_len": 3,
        "reports_max_query_len": True,
    }
    assert set(changed) == {field.name for field in fields(Agreement)}
    for name, value in changed.items():
        other = replace(base, **{name: value})
        assert phase(base, replace(base), other).agreements_differ == (0, 2), name
        assert phase(other, base, base).agreements_differ == (0, 1), name


def test_the_judge_reads_kept_records_as_it_reads_them_written() -> None:
    # A simulated rank keeps its sync and oracle records, and the judge reads
    # them off its events in one pass; a trace read back from JSON (a
    # counterexample file) has only the payloads. Both must give the same
    # evidence: runner, phases, syncs, oracle, solo calls, kept errors.
    batch = RankBatch(num_reqs=1, num_tokens=2)
    descriptor = Descriptor(CudagraphMode.NONE, 2, 1)
    choice = Choice(CudagraphMode.NONE, 2, 1, largest=2, uniform=None, bound=None)

    def program(rank: int) -> None:
        world = current_world()
        if rank == 0:
            world.record(EXPECT_EVENT, ExpectRecord("step 0", (choice,) * 2).to_event())
        agreement = Agreement((2, 2), eager=True)
        world.record(
            SYNC_EVENT,
            SyncRecord("step 0", batch, False, False, descriptor, agreement).to_event(),
        )
        if rank == 1:
            world.record(WORKER_ERROR_EVENT, {"error": "E: x", "where": None})
            world.record(
                SYNC_EVENT,
                SyncRecord(
                    "solo 0", batch, False, True, descriptor, agreement
                ).to_event(),
            )

    kept = simulate(program, ranks=2)
    assert all(
        event.kept is not None
        for trace in kept.ranks
        for event in trace.events
        if event.kind != WORKER_ERROR_EVENT
    )
    written = replace(
        kept,
        ranks=tuple(
            replace(
                trace,
                events=tuple(
                    Event(event.kind, event.after_collectives, event.payload)
                    for event in trace.events
                ),
            )
            for trace in kept.ranks
        ),
    )
    case = Case("step", "contract", POLICY, ((batch, batch),))
    seen = []
    for result in (kept, written):
        evidence = Evidence(case, result)
        seen.append(
            (
                evidence.runner,
                evidence.phases,
                evidence.syncs,
                evidence.expected,
                evidence.solo_calls,
                [(rank, event.payload) for rank, event in evidence.worker_errors],
            )
        )
    assert seen[0] == seen[1]
    runner, phases, _, expected, solo, errors = seen[0]
    assert runner == "v2" and solo and expected == {"step 0": (choice, choice)}
    assert [phase.name for phase in phases] == ["step 0", "solo 0"]
    assert errors == [(1, {"error": "E: x", "where": None})]
