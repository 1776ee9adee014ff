"""A correct DP sync with the vLLM 0.29.0 API, the twin every v29 faulty target edits.

Written for dpsim from the documented contract of ``dispatch_cg_and_sync_dp``
(not from vLLM's text), so the corpus can plant one realistic bug at a time in
code whose every other line is known to be right. It loads as a ``--target``
file on top of release 0.29.0, whose manager, descriptor and enum it uses.

Contract, in short: with one rank nothing is exchanged. Reusing an earlier
agreement exchanges nothing either; the batch is re-dispatched on this
(possibly different) manager with the agreed uniform length, and any further
padding that manager adds is reported. Otherwise one all-reduce of a small
int32 table (one column per rank) decides: nobody has work -> an empty eager
descriptor and no agreement; anybody wants eager -> everybody eager on their
own counts; else everybody dispatches the largest count with the agreed
uniform length and query-length bound, and the agreement records that padded
size for every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_dp_group
from vllm.v1.worker.gpu.cudagraph_utils import (
    BatchExecutionDescriptor,
    CudaGraphManager,
)

# Rows of the exchanged table. A rank writes only its own column, so a sum
# over ranks is a gather: every rank ends up reading every rank's values.
TOKENS_ROW = 0
MODE_ROW = 1
UNIFORM_ROW = 2
QUERY_ROW = 3
ROWS = 4

# Markers for "no value" in an int32 cell. Uniform lengths are positive, so 0
# is free; a query-length bound may legitimately be 0, so it gets -1.
NO_UNIFORM = 0
NO_QUERY_BOUND = -1


@dataclass(frozen=True)
class DPSyncState:
    """The outcome of one exchange, identical on every rank by construction.

    Callers branch on these fields to decide which collectives to run next, so
    a value that may differ between ranks must never be stored here.
    """

    #: Tokens each rank runs: the padded size everywhere, or, when eager, each
    #: rank's own unpadded count.
    num_tokens_across_dp: torch.Tensor
    #: The uniform decode length all ranks share; None when they do not share one.
    uniform_token_count: int | None
    #: All ranks run eager. A later reuse must run eager too: no shape was agreed.
    eager: bool


def eager_descriptor(
    num_reqs: int, num_tokens: int, num_active_loras: int = 0
) -> BatchExecutionDescriptor:
    """A descriptor that replays no graph and pads nothing."""
    return BatchExecutionDescriptor(
        cg_mode=CUDAGraphMode.NONE,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_active_loras=num_active_loras,
    )


def shared_value(column: torch.Tensor, absent: int) -> int | None:
    """The value every rank wrote, or None if any rank differs or wrote ``absent``."""
    first = int(column[0])
    if first == absent or bool((column != first).any()):
        return None
    return first


def query_bound(column: torch.Tensor) -> int | None:
    """A bound that holds on every rank: the largest, unless some rank has none."""
    if bool((column == NO_QUERY_BOUND).any()):
        return None
    return int(column.max())


def dispatch_cg_and_sync_dp(
    cudagraph_manager: CudaGraphManager | None,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    dp_size: int,
    dp_rank: int,
    max_query_len: int | None = None,
    need_eager: bool = False,
    num_active_loras: int = 0,
    dp_sync: DPSyncState | None = None,
) -> tuple[BatchExecutionDescriptor, DPSyncState | None]:
    """Choose this rank's graph descriptor so that all DP ranks choose alike.

    ``cudagraph_manager`` may be None only with ``need_eager`` (profile run).
    ``dp_sync`` is an agreement made over this same batch (same padded token
    count, same uniform length) to reuse without a collective. Returns the
    descriptor and the agreement, which is None with one rank or when no rank
    has work.
    """
    if dp_size > 1 and dp_sync is not None:
        return reuse_agreement(
            cudagraph_manager,
            num_reqs,
            num_tokens,
            uniform_token_count,
            dp_rank,
            need_eager,
            num_active_loras,
            dp_sync,
        )
    if need_eager:
        wanted = eager_descriptor(num_reqs, num_tokens, num_active_loras)
    else:
        assert cudagraph_manager is not None, "only a profile run has no manager"
        wanted = cudagraph_manager.dispatch(
            num_reqs,
            num_tokens,
            uniform_token_count,
            num_active_loras=num_active_loras,
            max_query_len=max_query_len,
        )
    if dp_size == 1:
        return wanted, None

    table = torch.zeros(ROWS, dp_size, dtype=torch.int32)
    table[TOKENS_ROW, dp_rank] = num_tokens
    table[MODE_ROW, dp_rank] = wanted.cg_mode.value
    table[UNIFORM_ROW, dp_rank] = uniform_token_count or NO_UNIFORM
    table[QUERY_ROW, dp_rank] = (
        NO_QUERY_BOUND if max_query_len is None else max_query_len
    )
    dist.all_reduce(table, group=get_dp_group().cpu_group)

    counts = table[TOKENS_ROW]
    if not bool(counts.any()):
        # Nobody has work: no graph, and nothing for a later step to reuse.
        return eager_descriptor(0, 0), None
    uniform = shared_value(table[UNIFORM_ROW], NO_UNIFORM)

    if int(table[MODE_ROW].min()) == CUDAGraphMode.NONE.value:
        # One rank cannot replay a graph, so none may: a graph on some ranks
        # and eager on others run different collectives.
        return eager_descriptor(num_reqs, num_tokens, wanted.num_active_loras), (
            DPSyncState(
                num_tokens_across_dp=counts, uniform_token_count=uniform, eager=True
            )
        )

    assert cudagraph_manager is not None, "every rank voted for a graph"
    # Request padding follows this rank's own request count: FULL graphs need
    # room for its requests, and PIECEWISE graphs pad none.
    agreed = cudagraph_manager.dispatch(
        num_reqs,
        int(counts.max()),
        uniform,
        num_active_loras=num_active_loras,
        max_query_len=query_bound(table[QUERY_ROW]),
    )
    padded = torch.full_like(counts, agreed.num_tokens)
    return agreed, DPSyncState(
        num_tokens_across_dp=padded, uniform_token_count=uniform, eager=False
    )


def reuse_agreement(
    cudagraph_manager: CudaGraphManager | None,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    dp_rank: int,
    need_eager: bool,
    num_active_loras: int,
    dp_sync: DPSyncState,
) -> tuple[BatchExecutionDescriptor, DPSyncState]:
    """Serve a batch already agreed on, e.g. a drafter's prefill of the target's batch."""
    assert int(dp_sync.num_tokens_across_dp[dp_rank]) == num_tokens, (
        "the agreement was made over a batch of another size"
    )
    assert dp_sync.uniform_token_count in (None, uniform_token_count), (
        "the agreement was made over a batch with another uniform length"
    )
    if need_eager or dp_sync.eager:
        return eager_descriptor(num_reqs, num_tokens, num_active_loras), dp_sync
    assert cudagraph_manager is not None, "a graph agreement needs a manager"
    # This manager's table may differ from the one the agreement was made on
    # (a drafter's), but every rank holds the same table, so asking it only
    # agreed values gets every rank the same descriptor. That rules out this
    # rank's own request count: a FULL graph with room for one rank's requests
    # but not another's would split the ranks. Ask for the most requests any
    # rank can have: one per token, or one per uniform length in a decode. The
    # query-length bound is per rank too, so ask for graphs that take any.
    most_requests = num_tokens // (dp_sync.uniform_token_count or 1)
    chosen = cudagraph_manager.dispatch(
        most_requests,
        num_tokens,
        dp_sync.uniform_token_count,
        num_active_loras=num_active_loras,
        max_query_len=None,
    )
    if chosen.cg_mode == CUDAGraphMode.NONE:
        # No graph: run this rank's own batch, which eager never pads.
        return eager_descriptor(num_reqs, num_tokens, num_active_loras), dp_sync
    if chosen.num_tokens != num_tokens:
        # That table padded further: report what every rank now runs.
        dp_sync = replace(
            dp_sync,
            num_tokens_across_dp=torch.full_like(
                dp_sync.num_tokens_across_dp, chosen.num_tokens
            ),
        )
    return chosen, dp_sync
