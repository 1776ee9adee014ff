"""A correct V1-runner DP sync with the vLLM 0.33.0 API, the twin every v1-v33 faulty target edits.

Written for dpsim from the documented contract of ``coordinate_batch_across_dp``
(not from vLLM's text). It replaces ``vllm/v1/worker/dp_utils.py`` as a
``--target`` file on top of release 0.33.0 with ``--runner v1``: the release's
own ``GPUModelRunner._determine_batch_execution_and_padding`` calls it after
dispatching the rank's batch, and dispatches again at the count it returns,
restricted to the mode it returns.

What the ranks agree on, and why:

- the CUDA-graph mode is the least any rank can run (NONE < PIECEWISE < FULL):
  one eager rank makes every rank eager, or graphs and eager forwards would
  issue different collectives;
- microbatching is all or nothing: every rank must clear its own threshold,
  and the split is dropped when the smallest rank's real tokens would not
  reach the last microbatch of the largest padded batch (that microbatch
  would hold only padding);
- under a graph, or when microbatching, every rank runs the largest padded
  count, so that the MoE all-to-all moves one shape; otherwise (all eager,
  no split) each rank runs its own padded count and the returned row says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist
from vllm.config import ParallelConfig
from vllm.distributed.parallel_state import get_dp_group
from vllm.v1.worker.ubatch_utils import check_ubatch_thresholds, is_last_ubatch_empty

#: The exchanged table's rows: one value per rank in each.
VOTES = ("unpadded", "padded", "split", "mode")
_ROW = {name: index for index, name in enumerate(VOTES)}

_coordination_off: ContextVar[bool] = ContextVar(
    "dpsim_v1_twin_coordination_off", default=False
)


@contextmanager
def skip_dp_coordination() -> Iterator[None]:
    """Within this block, callers decide alone, without talking to other DP ranks."""
    token = _coordination_off.set(True)
    try:
        yield
    finally:
        _coordination_off.reset(token)


def should_skip_dp_coordination() -> bool:
    return _coordination_off.get()


@dataclass(frozen=True)
class Votes:
    """The all-reduced table, read as what the group decided."""

    table: torch.Tensor

    def row(self, name: str) -> torch.Tensor:
        return self.table[_ROW[name]]

    @property
    def mode(self) -> int:
        return int(self.row("mode").min())

    def split(self, parts: int) -> bool:
        if not bool((self.row("split") == 1).all()):
            return False
        smallest = int(self.row("unpadded").min())
        largest = int(self.row("padded").max())
        return not is_last_ubatch_empty(smallest, largest, parts)

    def counts(self, pad: bool) -> torch.Tensor:
        padded = self.row("padded").to("cpu")
        if pad:
            return torch.full_like(padded, int(padded.max()))
        return padded.clone()


def _where_to_reduce(
    parallel_config: ParallelConfig,
) -> tuple[str | torch.device, object]:
    """The device and group of the exchange: the DP group's own device unless
    told to keep DP synchronisation off NCCL (then its CPU group)."""
    coordinator = get_dp_group()
    if parallel_config.disable_nccl_for_dp_synchronization:
        return "cpu", coordinator.cpu_group
    return coordinator.device, coordinator.device_group


def exchange(column: list[int], parallel_config: ParallelConfig) -> Votes:
    """Share this rank's column with every DP rank (one all-reduce)."""
    size = parallel_config.data_parallel_size
    table = torch.zeros(len(VOTES), size, dtype=torch.int32)
    table[:, parallel_config.data_parallel_rank] = torch.tensor(
        column, dtype=torch.int32
    )
    device, group = _where_to_reduce(parallel_config)
    table = table.to(device)
    dist.all_reduce(table, group=group)
    return Votes(table)


def coordinate_batch_across_dp(
    num_tokens_unpadded: int,
    allow_microbatching: bool,
    parallel_config: ParallelConfig,
    num_tokens_padded: int | None = None,
    uniform_decode: bool | None = None,
    cudagraph_mode: int = 0,
) -> tuple[bool, torch.Tensor | None, int]:
    """Agree with the other DP ranks on microbatching, token counts and graph mode.

    ``num_tokens_padded`` is this rank's count after its own (graph) padding,
    ``cudagraph_mode`` the runtime mode its own dispatch chose (0 NONE,
    1 PIECEWISE, 2 FULL), ``uniform_decode`` needed only when microbatching is
    allowed. Returns whether every rank microbatches, each rank's count (None
    with one rank) and the mode every rank runs.
    """
    if parallel_config.data_parallel_size == 1:
        return False, None, cudagraph_mode
    padded = num_tokens_unpadded if num_tokens_padded is None else num_tokens_padded
    wants_split = False
    if allow_microbatching:
        assert uniform_decode is not None, "microbatching needs uniform_decode"
        wants_split = check_ubatch_thresholds(
            parallel_config, num_tokens_unpadded, uniform_decode=uniform_decode
        )
    if should_skip_dp_coordination():
        # Deciding alone: this rank stands for every rank.
        split = wants_split and not is_last_ubatch_empty(
            num_tokens_unpadded, padded, parallel_config.num_ubatches
        )
        alone = torch.full(
            (parallel_config.data_parallel_size,), padded, dtype=torch.int32
        )
        return split, alone, cudagraph_mode
    assert padded >= num_tokens_unpadded, "padding cannot remove tokens"
    votes = exchange(
        [num_tokens_unpadded, padded, int(wants_split), cudagraph_mode],
        parallel_config,
    )
    mode = votes.mode
    split = votes.split(parallel_config.num_ubatches)
    # A replayed graph, or a split, fixes the shape: every rank runs the largest.
    return split, votes.counts(pad=mode != 0 or split), mode
