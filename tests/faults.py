"""Hand-written dp_utils-shaped targets with known faults, for the tests.

The ``*_SOURCE``-style constants are dpsim's own code, written for the tests
against vLLM 0.20.0's manager and enums (its API: a token-count tensor as the
agreement), not vLLM's. ``faulty_source`` instead derives a faulty file at
test time from a cached release's own dp_utils.py (never committed) with one
line changed, so the suite has a real bug to find in real code.
"""

from __future__ import annotations

from pathlib import Path

from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.targets.cache import ensure_release

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


def v1_mode_not_synced_on_033(directory: Path) -> Path:
    """A V1-runner counterexample file: the corpus's ``v1-mode-not-synced``
    twin (each rank returns its own graph mode) under 0.33.0's real caller, on
    the 2-rank decode step `dpsim check --runner v1` shrank to: one rank
    replays a FULL graph of 2 tokens, the other (4 tokens, past the largest
    graph) runs eager, and their MoE collectives differ (a hang)."""
    from dpsim import cex
    from dpsim.corpus import entry
    from dpsim.corpus.model import materialize
    from dpsim.properties import PROPERTY_NAMES, judge
    from dpsim.scenarios import run_case
    from dpsim.targets import load_target

    source = materialize(entry("v1-mode-not-synced"), directory)
    case = Case(
        scenario="step",
        profile="caller",
        policy=CapturePolicy(
            capture_sizes=(2,),
            cudagraph_mode="FULL",
            max_num_seqs=2,
            decode_query_len=2,
            lora_capture_cases=(0, 2),
        ),
        steps=(
            tuple(
                RankBatch(
                    num_reqs=requests,
                    num_tokens=2 * requests,
                    uniform_token_count=2,
                    max_query_len=2,
                    allow_ubatching=True,
                    kind="decode",
                )
                for requests in (1, 2)
            ),
        ),
    )
    target = load_target("0.33.0", source, runner="v1")
    result = run_case(target, case)
    verdicts = tuple(judge(case, result))
    return cex.write(
        cex.files.build(target, case, result, verdicts, PROPERTY_NAMES),
        directory / "out",
    )


#: A dp_utils that votes on tokens, eager mode and the uniform decode length
#: (0.20 API), as vLLM's does. ``PAD_FROM``
#: decides whose token count the shared graph is chosen from: the rank's own
#: (a bug) or the agreed maximum (correct).
VOTING = (
    _HEADER
    + """

def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                            uniform_token_count, dp_size, dp_rank, need_eager=False):
    if dp_size == 1:
        return cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count), None
    # A rank votes for graphs only if its own batch gets one.
    wants_graph = not need_eager and cudagraph_manager is not None and (
        cudagraph_manager.dispatch(num_reqs, num_tokens, uniform_token_count).cg_mode
        != CUDAGraphMode.NONE
    )
    votes = torch.zeros(3, dp_size, dtype=torch.int32)
    votes[0][dp_rank] = num_tokens
    votes[1][dp_rank] = int(wants_graph)
    votes[2][dp_rank] = uniform_token_count or 0
    dist.all_reduce(votes, group=get_dp_group().cpu_group)
    counts = votes[0]
    if int(counts.max()) == 0:
        return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=0, num_reqs=0), None
    if int(votes[1].min()) == 0:
        own = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)
        return own, counts
    shared = int(votes[2][0]) if bool((votes[2] == votes[2][0]).all()) else 0
    chosen = cudagraph_manager.dispatch(num_reqs, PAD_FROM, shared or None)
    if chosen.cg_mode == CUDAGraphMode.NONE:
        chosen = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)
        return chosen, counts
    counts[:] = chosen.num_tokens
    return chosen, counts
"""
)


RELEASE = BASE
DP_UTILS = "v1/worker/gpu/dp_utils.py"

#: Each rank pads to its own token count instead of the maximum: ranks
#: disagree only when their batches differ, so a search has to look for it
#: (the simplest case, Hypothesis' first, passes).
OWN_PADDING = (
    "synced_num_tokens = int(num_tokens_across_dp.max().item())",
    "synced_num_tokens = num_tokens",
)


def faulty_source(change: tuple[str, str]) -> str:
    original = (ensure_release(RELEASE) / DP_UTILS).read_text()
    before, after = change
    assert original.count(before) == 1, f"{RELEASE}'s dp_utils changed: {before!r}"
    return original.replace(before, after)


def write_faulty(change: tuple[str, str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(faulty_source(change))
    return path
