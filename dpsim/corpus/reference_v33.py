"""A correct DP sync with the vLLM 0.33.0 API, the twin every v33 faulty target edits.

Written for dpsim from the documented contract of ``dispatch_cg_and_sync_dp``
(not from vLLM's text). It loads as a ``--target`` file on top of release
0.33.0. Compared with the 0.29 shape it also agrees on microbatching, on the
largest request count and on skipping drafts, and reaches the other ranks
through the DP group coordinator (or not at all when DP coordination is
switched off, in which case each rank's own column stands for every rank).

Microbatching is all or nothing: every rank must allow it, the smallest rank
must clear the token threshold (thresholds only grow with the count, so that
holds every rank to them), and a microbatched graph replays only when every
rank's real tokens reach into every microbatch; otherwise the split runs eager.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from vllm.config import ParallelConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_dp_group
from vllm.v1.worker.dp_utils import should_skip_dp_coordination
from vllm.v1.worker.gpu.cudagraph_utils import (
    BatchExecutionDescriptor,
    CudaGraphManager,
)
from vllm.v1.worker.ubatch_utils import check_ubatch_thresholds, get_num_ubatches

# What each rank reports, one row each, in the order of the exchanged table.
FIELDS = (
    "tokens",
    "mode",
    "uniform",
    "query_bound",
    "allow_ubatching",
    "reqs",
    "allow_skip_drafts",
)
ROW = {name: index for index, name in enumerate(FIELDS)}


@dataclass(frozen=True)
class DPSyncState:
    """What the group agreed; the 0.29 fields (see reference_v29.py) and two more.

    Only values read off the whole exchanged table belong here, since callers
    pick their next collectives by them. The token counts are padded, except
    for a step every rank runs eager without splitting, where each is its own.
    """

    num_tokens_across_dp: torch.Tensor
    uniform_token_count: int | None
    eager: bool
    #: The most requests any rank scheduled, before graph padding.
    num_reqs: int
    #: Every rank found its drafts useless this step, so all skip drafting.
    skip_drafts: bool = False


@dataclass(frozen=True)
class Reports:
    """The exchanged table, read as the group's answers rather than rows of ints."""

    table: torch.Tensor

    def row(self, name: str) -> torch.Tensor:
        return self.table[ROW[name]]

    @property
    def idle(self) -> bool:
        return not bool(self.row("tokens").any())

    @property
    def largest(self) -> int:
        return int(self.row("tokens").max())

    @property
    def smallest(self) -> int:
        return int(self.row("tokens").min())

    @property
    def uniform(self) -> int | None:
        """The uniform length, if every rank runs a uniform decode of the same one."""
        lengths = self.row("uniform")
        first = int(lengths[0])
        return first if first > 0 and bool((lengths == first).all()) else None

    @property
    def query_bound(self) -> int | None:
        """A query-length bound valid on every rank, unless some rank gave none."""
        bounds = self.row("query_bound")
        return None if bool((bounds < 0).any()) else int(bounds.max())

    @property
    def anyone_eager(self) -> bool:
        return int(self.row("mode").min()) == CUDAGraphMode.NONE.value

    def unanimous(self, name: str) -> bool:
        return bool((self.row(name) == 1).all())

    def state(self, counts: torch.Tensor, eager: bool) -> DPSyncState:
        return DPSyncState(
            num_tokens_across_dp=counts,
            uniform_token_count=self.uniform,
            eager=eager,
            num_reqs=int(self.row("reqs").max()),
            skip_drafts=self.unanimous("allow_skip_drafts"),
        )


def exchange(column: list[int], dp_size: int, dp_rank: int) -> Reports:
    """Share this rank's column with every rank of the DP group."""
    table = torch.zeros(len(FIELDS), dp_size, dtype=torch.int32)
    table[:, dp_rank] = torch.tensor(column, dtype=torch.int32)
    if should_skip_dp_coordination():
        # Coordination is off: behave as if every rank reported what this one did.
        table[:] = table[:, dp_rank : dp_rank + 1].clone()
    else:
        get_dp_group().cpu_all_reduce_(table)
    return Reports(table)


def no_graph(
    num_reqs: int, num_tokens: int, num_active_loras: int = 0, num_ubatches: int = 1
) -> BatchExecutionDescriptor:
    return BatchExecutionDescriptor(
        cg_mode=CUDAGraphMode.NONE,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_active_loras=num_active_loras,
        num_ubatches=num_ubatches,
    )


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
    parallel_config: ParallelConfig | None = None,
    allow_ubatching: bool = False,
    uniform_decode: bool = False,
    allow_skip_drafts: bool = False,
    dp_sync_state: DPSyncState | None = None,
) -> tuple[BatchExecutionDescriptor, DPSyncState | None]:
    """Choose this rank's graph descriptor so that all DP ranks choose alike.

    ``cudagraph_manager`` may be None only with ``need_eager`` (profile run);
    ``parallel_config`` is needed only when microbatching is allowed.
    ``dp_sync_state`` is an agreement made over this same batch to reuse
    without a collective. Returns the descriptor and the agreement, which is
    None with one rank or when no rank has work.
    """
    if dp_size > 1 and dp_sync_state is not None:
        return serve_agreed(
            cudagraph_manager,
            num_reqs,
            num_tokens,
            uniform_token_count,
            dp_rank,
            need_eager or dp_sync_state.eager,
            num_active_loras,
            dp_sync_state,
        )
    own_choice = (
        no_graph(num_reqs, num_tokens, num_active_loras)
        if need_eager
        else graph_for(
            cudagraph_manager,
            num_reqs,
            num_tokens,
            uniform_token_count,
            num_active_loras,
            max_query_len,
        )
    )
    if dp_size == 1:
        return own_choice, None

    reports = exchange(
        [
            num_tokens,
            own_choice.cg_mode.value,
            uniform_token_count or 0,
            -1 if max_query_len is None else max_query_len,
            int(allow_ubatching),
            num_reqs,
            int(allow_skip_drafts),
        ],
        dp_size,
        dp_rank,
    )
    if reports.idle:
        # Nobody has work: no graph, and nothing for a later step to reuse.
        return no_graph(0, 0), None

    if reports.unanimous("allow_ubatching"):
        assert parallel_config is not None, "allowing microbatching needs its config"
        # Split only for a decode every rank shares; anything else is held to
        # the (higher) prefill threshold.
        shared_decode = uniform_decode and bool(
            (reports.row("uniform") == (uniform_token_count or 0)).all()
        )
        if check_ubatch_thresholds(
            parallel_config, reports.smallest, uniform_decode=shared_decode
        ):
            return split_alike(
                cudagraph_manager,
                reports,
                num_reqs,
                num_active_loras,
                get_num_ubatches(parallel_config),
            )

    if reports.anyone_eager:
        # One rank cannot replay a graph, so none may: a graph on some ranks
        # and eager on others run different collectives.
        return (
            no_graph(num_reqs, num_tokens, own_choice.num_active_loras),
            reports.state(reports.row("tokens"), eager=True),
        )

    # Request padding follows this rank's own request count: FULL graphs need
    # room for its requests, and PIECEWISE graphs pad none.
    agreed = graph_for(
        cudagraph_manager,
        num_reqs,
        reports.largest,
        reports.uniform,
        num_active_loras,
        reports.query_bound,
    )
    padded = torch.full_like(reports.row("tokens"), agreed.num_tokens)
    return agreed, reports.state(padded, eager=False)


def graph_for(
    manager: CudaGraphManager | None,
    num_reqs: int,
    num_tokens: int,
    uniform: int | None,
    num_active_loras: int,
    query_bound: int | None,
    num_ubatches: int = 1,
) -> BatchExecutionDescriptor:
    """The manager's best descriptor for a batch of this shape (NONE if it has none)."""
    assert manager is not None, "only a profile run has no manager, and it runs eager"
    return manager.dispatch(
        num_reqs,
        num_tokens,
        uniform,
        num_active_loras=num_active_loras,
        max_query_len=query_bound,
        num_ubatches=num_ubatches,
    )


def split_alike(
    manager: CudaGraphManager | None,
    reports: Reports,
    num_reqs: int,
    num_active_loras: int,
    parts: int,
) -> tuple[BatchExecutionDescriptor, DPSyncState]:
    """Microbatch every rank's batch at the largest count, as a graph only if all fill it.

    The expert all-to-all runs once per microbatch on every rank, so all ranks
    split the same size the same number of ways; a rank with fewer tokens pads.
    """
    chosen = no_graph(num_reqs, reports.largest, num_active_loras, parts)
    if manager is not None and not reports.anyone_eager:
        graph = graph_for(
            manager,
            num_reqs,
            reports.largest,
            reports.uniform,
            num_active_loras,
            reports.query_bound,
            parts,
        )
        # Replaying a graph whose last microbatch is empty on some rank sends
        # that rank into the all-to-all with nothing but padding: run eager then.
        if reports.smallest > (parts - 1) * (graph.num_tokens // parts):
            chosen = graph
    counts = torch.full_like(reports.row("tokens"), chosen.num_tokens)
    return chosen, reports.state(counts, eager=chosen.cg_mode == CUDAGraphMode.NONE)


def serve_agreed(
    manager: CudaGraphManager | None,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    dp_rank: int,
    eager: bool,
    num_active_loras: int,
    agreed: DPSyncState,
) -> tuple[BatchExecutionDescriptor, DPSyncState]:
    """Serve a batch already agreed on, e.g. a drafter's prefill of the target's batch."""
    if int(agreed.num_tokens_across_dp[dp_rank]) != num_tokens or (
        agreed.uniform_token_count not in (None, uniform_token_count)
    ):
        raise AssertionError("the reused agreement was made over another batch")
    if eager:
        return no_graph(num_reqs, num_tokens, num_active_loras), agreed
    # Every rank holds the same (possibly drafter's) table and asks it only
    # agreed values (size, length, the most requests any rank has), so every
    # rank gets the same descriptor back. Its own request count or query-length
    # bound could split them: ask for graphs that take any query length.
    chosen = graph_for(
        manager,
        agreed.num_reqs,
        num_tokens,
        agreed.uniform_token_count,
        num_active_loras,
        None,
    )
    if chosen.cg_mode == CUDAGraphMode.NONE:
        # No graph: run this rank's own batch, which eager never pads.
        return no_graph(num_reqs, num_tokens, num_active_loras), agreed
    if chosen.num_tokens == num_tokens:
        return chosen, agreed
    # That table padded further: report what every rank now runs.
    grown = torch.full_like(agreed.num_tokens_across_dp, chosen.num_tokens)
    return chosen, replace(agreed, num_tokens_across_dp=grown)
