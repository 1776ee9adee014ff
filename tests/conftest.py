"""Shared test helpers.

Real vLLM source is never committed: tests that need it load releases from
the dpsim cache (``make test`` fetches them first) or derive files from a
cached release's own sources at test time.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from dpsim.targets import Target, load_target
from dpsim.targets.cache import ensure_release


@pytest.fixture
def release() -> Callable[[str], Target]:
    """Load a release from the dpsim cache (fetching it if it is missing)."""
    return load_target


@pytest.fixture
def release_file() -> Callable[[str, str], Path]:
    """The path of one source file inside a cached release."""

    def locate(version: str, relative: str) -> Path:
        return ensure_release(version) / relative

    return locate


@pytest.fixture
def write_module(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a hand-written module (dedented) and return its path."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


# A small dp_utils with vLLM 0.20's API, written for these tests. PAD_FROM
# decides whose token count the shared graph is chosen from.
HAND_WRITTEN = """
import torch
import torch.distributed as dist
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_dp_group
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor


def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                            uniform_token_count, dp_size, dp_rank, need_eager=False):
    if dp_size == 1:
        return cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count), None
    votes = torch.zeros(2, dp_size, dtype=torch.int32)
    votes[0][dp_rank] = num_tokens
    votes[1][dp_rank] = 0 if need_eager else 1
    dist.all_reduce(votes, group=get_dp_group().cpu_group)
    counts = votes[0]
    if int(counts.max()) == 0:
        return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=0, num_reqs=0), None
    if int(votes[1].min()) == 0:
        own = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)
        return own, counts
    chosen = cudagraph_manager.dispatch(num_reqs, PAD_FROM, None)
    if chosen.cg_mode == CUDAGraphMode.NONE:
        chosen = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)
        return chosen, counts
    counts[:] = chosen.num_tokens
    return chosen, counts
"""


@pytest.fixture
def per_rank_padding(write_module: Callable[[str, str], Path]) -> Path:
    """A dp_utils (0.20 API) whose ranks each pad to their own count: a bug."""
    return write_module(
        "per_rank_padding.py", HAND_WRITTEN.replace("PAD_FROM", "num_tokens")
    )


@pytest.fixture
def agreed_padding(write_module: Callable[[str, str], Path]) -> Path:
    """The same dp_utils padding every rank to the agreed maximum: correct."""
    return write_module(
        "agreed_padding.py", HAND_WRITTEN.replace("PAD_FROM", "int(counts.max())")
    )
