"""``coverage``: the descriptor a rank runs can serve that rank's own batch.

Asserts, for every rank of every completed sync: an eager descriptor is the
rank's own batch (eager pads nothing; a microbatched step pads tokens only,
to split evenly; ranks that agreed on a graph the table then lacked run eager
at the agreed count); a graph holds at least the rank's tokens; if it pads
requests, at least the rank's requests; if it is a uniform-decode graph, the
rank's batch is a uniform decode of that length; if it bounds the query
length, the rank's batch declares a bound no larger; and a graph's LoRA case
holds at least the rank's active LoRAs. A sync that reuses an agreement
carrying a query-length bound (0.34+) is documented to take that bound in
place of the one it is passed ("including when it is None"), so its batch's
bound is the agreed one: the bound vLLM's callers pass there is the target
step's own, which ``agreed-values`` holds the agreement to.

Why: an agreed shape that is too small for one rank's real batch makes that
rank's graph replay read or write past its inputs: crashes such as reshape
errors, or silently wrong results. Guards: an agreed value used where the
rank's own was needed (26375, 55458/56181); request padding taken from the
wrong rank.

For the V1 runner the same, read through V1's descriptors: an eager
``BatchDescriptor`` names no request count, so only its tokens are held to
the batch's; a uniform-decode graph (the dispatcher's ``uniform`` key, of the
decode query length) serves a batch none of whose requests is longer than
that length (``_dummy_run``'s one shorter request included); V1 keys carry
no query-length bound.
"""

from __future__ import annotations

from dataclasses import replace

from dpsim.records.case import RankBatch, SyncInputs
from dpsim.records.sync import Descriptor
from dpsim.scenarios.expect_v1 import longest_request

from .base import EAGER, Evidence, Property, Verdict

NAME = "coverage"


def shortfall(
    batch: SyncInputs,
    descriptor: Descriptor,
    agreed_count: int | None = None,
    runner: str = "v2",
) -> str | None:
    """Why ``descriptor`` cannot serve ``batch``, or None when it can.

    ``agreed_count`` is this rank's entry of an agreement that is not eager:
    the table had no graph for the agreed batch, so the ranks run eager at the
    agreed, padded size (DPSyncState pads unless ``eager``). A version that
    returns the count tensor instead (before 0.29) says nothing of eager; its
    eager branch returns each rank's own count, so its entry is passed too.
    """
    if descriptor.num_tokens < batch.num_tokens:
        return f"{descriptor.num_tokens} tokens < the batch's {batch.num_tokens}"
    if descriptor.num_reqs is not None and descriptor.num_reqs < batch.num_reqs:
        return f"{descriptor.num_reqs} requests < the batch's {batch.num_reqs}"
    if descriptor.cg_mode == EAGER:
        # Eager pads nothing (DPSyncState: "unless eager, where nothing was
        # padded"), except tokens, to split microbatches evenly.
        split = descriptor.num_ubatches > 1
        named_reqs = descriptor.num_reqs is not None or runner != "v1"
        tokens = descriptor.num_tokens
        if (named_reqs and descriptor.num_reqs != batch.num_reqs) or (
            not split and tokens != batch.num_tokens and tokens != agreed_count
        ):
            return (
                f"an eager descriptor for {descriptor.num_reqs} requests and "
                f"{descriptor.num_tokens} tokens, not the batch's own "
                f"{batch.num_reqs} and {batch.num_tokens}"
            )
        return None
    uniform = descriptor.uniform_token_count
    if runner == "v1" and isinstance(batch, RankBatch):
        longest = longest_request(batch)
        if uniform is not None and longest > uniform:
            return (
                f"a uniform-decode graph of length {uniform} for a batch with "
                f"a request of {longest} tokens"
            )
    elif uniform is not None and uniform != batch.uniform_token_count:
        return (
            f"a uniform-decode graph of length {uniform} for a batch whose "
            f"uniform length is {batch.uniform_token_count}"
        )
    bound = descriptor.max_query_len
    if bound is not None and (
        batch.max_query_len is None or batch.max_query_len > bound
    ):
        return f"query length bound {bound} < the batch's {batch.max_query_len}"
    if descriptor.num_active_loras < batch.num_active_loras:
        return (
            f"a graph for {descriptor.num_active_loras} LoRAs with "
            f"{batch.num_active_loras} active"
        )
    return None


def judge(evidence: Evidence) -> Verdict | None:
    runner = evidence.runner
    for phase in evidence.complete_phases:
        reused = phase.any_reused
        for rank, (batch, descriptor, agreement) in enumerate(
            zip(phase.all_inputs, phase.descriptors, phase.agreements, strict=True)
        ):
            agreed_count = (
                agreement.num_tokens_across_dp[rank]
                if agreement is not None and agreement.eager is not True
                else None
            )
            if (
                reused
                and agreement is not None
                and agreement.reports_max_query_len
                and phase.records[rank].reused  # type: ignore[union-attr]
            ):
                batch = replace(batch, max_query_len=agreement.max_query_len)
            reason = shortfall(batch, descriptor, agreed_count, runner)
            if reason is not None:
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank} runs {descriptor.cg_mode} {descriptor.num_tokens}: {reason}",
                )
    return None


PROPERTY = Property(
    NAME,
    "the descriptor can serve the rank's own batch (tokens, requests, uniform "
    "length, query-length bound, LoRA case)",
    "agreed value used where the rank's own was needed (26375, 55458)",
    judge,
)
