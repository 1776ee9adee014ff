"""A stand-in for the real DP sync, for the simulator's own tests.

It does what ``dispatch_cg_and_sync_dp`` does per rank, and reaches the world
the way a loaded target does (``runtime.DIST_PROXY`` for ``torch.distributed``,
``runtime.current().dp_group()`` for ``get_dp_group()``): fill a (5, dp_size)
int32 tensor with this rank's row, all-reduce it over the DP CPU group, then
agree on a padded size with a handful of small torch ops. It needs no vLLM
release, so the simulator's tests (and its overhead, ``measure_overhead``)
run on a realistic sync without one.
"""

from __future__ import annotations

import torch

from dpsim.targets import runtime

dist = runtime.DIST_PROXY

_CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def batch_of(rank: int) -> tuple[int, int, int | None, int | None]:
    """A per-rank batch: (num_tokens, num_reqs, uniform_token_count, max_query_len)."""
    num_reqs = 1 + (rank * 7) % 13
    uniform = 1 if rank % 3 else None
    num_tokens = num_reqs if uniform else num_reqs * 3
    return num_tokens, num_reqs, uniform, (uniform or 3)


def sync_like_program(rank: int) -> list[int]:
    """One rank's DP sync: returns [padded_tokens, cg_mode, uniform, max_query, max_reqs]."""
    group = runtime.current().dp_group()
    dp_size = group.world_size
    num_tokens, num_reqs, uniform, max_query_len = batch_of(rank)
    cg_mode = 2 if rank % 5 else 1

    tensor = torch.zeros(5, dp_size, dtype=torch.int32, device="cpu")
    tensor[0][rank] = num_tokens
    tensor[1][rank] = cg_mode
    tensor[2][rank] = uniform or 0
    tensor[3][rank] = max_query_len or -1
    tensor[4][rank] = num_reqs
    dist.all_reduce(tensor, group=group.cpu_group)

    num_tokens_across_dp = tensor[0]
    uniform_across_dp = tensor[2]
    first_uniform = int(uniform_across_dp[0])
    synced_uniform: int | None = first_uniform
    if first_uniform == 0 or not torch.all(uniform_across_dp == first_uniform):
        synced_uniform = None
    if torch.all(num_tokens_across_dp == 0).item():
        return [0, 0, 0, 0, 0]
    synced_cg_mode = int(tensor[1].min().item())
    synced_tokens = int(num_tokens_across_dp.max().item())
    synced_max_query = -1
    if bool(torch.all(tensor[3] != -1).item()):
        synced_max_query = int(tensor[3].max().item())
    padded = next(
        (size for size in _CAPTURE_SIZES if size >= synced_tokens), synced_tokens
    )
    num_tokens_across_dp[:] = padded
    return [
        int(num_tokens_across_dp[rank].item()),
        synced_cg_mode,
        synced_uniform or 0,
        synced_max_query,
        int(tensor[4].max().item()),
    ]
