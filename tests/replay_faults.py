"""Hand-written dp_utils-shaped targets with known faults, for cex and replay tests.

Each runs against vLLM 0.20.0's manager and enums (its API: a token-count
tensor as the agreement). They are dpsim's own code, written for the tests,
not vLLM's.
"""

from __future__ import annotations

from pathlib import Path

from dpsim.capture.policy import CapturePolicy
from dpsim.scenarios import Case, RankBatch

BASE = "0.20.0"

_HEADER = """\
import torch
import torch.distributed as dist
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_dp_group
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor


def _counts(num_tokens, dp_size, dp_rank):
    counts = torch.zeros(dp_size, dtype=torch.int32)
    counts[dp_rank] = num_tokens
    dist.all_reduce(counts, group=get_dp_group().cpu_group)
    return counts
"""

#: An idle rank returns before the all-reduce: its peers hang in it.
IDLE_RETURNS_EARLY = (
    _HEADER
    + """

def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                            uniform_token_count, dp_size, dp_rank):
    if num_tokens == 0:
        idle = BatchExecutionDescriptor(
            cg_mode=CUDAGraphMode.NONE, num_tokens=0, num_reqs=0
        )
        return idle, torch.zeros(dp_size, dtype=torch.int32)
    counts = _counts(num_tokens, dp_size, dp_rank)
    return cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count), counts
"""
)

#: Every rank syncs, then pads to its *own* graph: the forward pass's
#: collectives get different shapes on different ranks.
PADS_LOCALLY = (
    _HEADER
    + """

def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                            uniform_token_count, dp_size, dp_rank):
    counts = _counts(num_tokens, dp_size, dp_rank)
    return cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count), counts
"""
)

#: Every rank syncs, and every rank runs the largest count eagerly: the
#: forward pass's collectives agree everywhere (no-hang holds; it wastes
#: graphs, which is not what these tests judge).
FIXED = (
    _HEADER
    + """

def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                            uniform_token_count, dp_size, dp_rank):
    counts = _counts(num_tokens, dp_size, dp_rank)
    most = int(counts.max())
    eager = BatchExecutionDescriptor(
        cg_mode=CUDAGraphMode.NONE, num_tokens=most, num_reqs=num_reqs
    )
    return eager, counts
"""
)

#: The idle rank sleeps (in C, no loop to tick) where it should sync: only a
#: wall-clock watchdog ends it.
IDLE_SLEEPS = (
    _HEADER
    + """
import time


def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                            uniform_token_count, dp_size, dp_rank):
    if num_tokens == 0:
        time.sleep(120)
    counts = _counts(num_tokens, dp_size, dp_rank)
    return cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count), counts
"""
)

POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8), cudagraph_mode="FULL", max_num_seqs=8
)


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(source)
    return path


def decode(tokens: int) -> RankBatch:
    """``tokens`` one-token requests; 0 makes the rank idle."""
    return RankBatch(
        num_reqs=tokens,
        num_tokens=tokens,
        uniform_token_count=1 if tokens else None,
        kind="decode" if tokens else "idle",
    )


def step_case(*tokens: int, profile: str = "contract") -> Case:
    return Case(
        scenario="step",
        profile=profile,
        policy=POLICY,
        steps=(tuple(decode(count) for count in tokens),),
    )


def idle_case_on_033(directory: Path) -> Path:
    """The 0.33.0 contract-profile case `dpsim check` first found: a rank with
    one token beside an idle one, FULL graphs of size 1. Written as a file
    whatever its verdict under the scenario semantics of the day."""
    from dpsim import cex
    from dpsim.properties import PROPERTY_NAMES, judge
    from dpsim.scenarios import run_case
    from dpsim.targets import load_target

    case = Case(
        scenario="step",
        profile="contract",
        policy=CapturePolicy(
            capture_sizes=(1,), cudagraph_mode="FULL", max_num_seqs=16
        ),
        steps=(
            (
                RankBatch(1, 1, 1, 1, uniform_decode=True),
                RankBatch(0, 0, kind="idle"),
            ),
        ),
    )
    target = load_target("0.33.0")
    result = run_case(target, case)
    verdicts = tuple(judge(case, result))
    return cex.write(
        cex.files.build(target, case, result, verdicts, PROPERTY_NAMES), directory
    )
