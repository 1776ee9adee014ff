"""What one virtual rank does in a scenario: syncs, then the forward pass.

Every sync a rank makes is recorded as a ``sync`` event (a
:class:`~dpsim.records.sync.SyncRecord`) so properties can judge it
afterwards; nothing here judges. After each sync the rank issues the collectives its forward pass would
issue with the chosen shape (:func:`forward`), so ranks that chose differently
diverge in the simulator the way they would on GPUs: a mismatch or a hang.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from dpsim.records.case import RankBatch
from dpsim.records.groups import EP_GROUP
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.records.sync import (
    EXPECT_EVENT,
    RUNNER_EVENT,
    SYNC_EVENT,
    Descriptor,
    ExpectRecord,
    SyncRecord,
)
from dpsim.records.trace import Payload
from dpsim.targets import runtime
from dpsim.targets.load import Target
from dpsim.targets.v1.api import V1API
from dpsim.targets.v1.load import V1Target

from .expect import table_choices
from .expect_v1 import v1_choices

_FORWARD_DTYPE = torch.int8
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class ProgramWorld(Protocol):
    """What a rank's program needs from the world it runs in, beyond the target's.

    The simulator's ``SimWorld`` and the replay lane's real-process world both
    provide it, so the same programs run on virtual ranks and on real process
    groups. Reached through ``runtime.current()`` directly: one global read
    per call, no cheaper than the simulator's own helpers but no dearer.
    """

    @property
    def dist(self) -> Any: ...
    def group(self, name: str) -> Any: ...
    def record(self, kind: str, payload: Payload) -> None: ...
    def set_skip_dp_coordination(self, flag: bool) -> None: ...


def program_world() -> ProgramWorld:
    world = runtime.current()
    if world is runtime.NO_WORLD:
        raise RuntimeError(
            "a scenario program ran outside a world: run it through "
            "dpsim.scenarios.run_case (simulated) or dpsim.replay (real processes)"
        )
    return cast(ProgramWorld, world)


def record(kind: str, payload: Payload) -> None:
    """Add an event to the running rank's trace, in whichever world it runs."""
    program_world().record(kind, payload)


@dataclass(frozen=True)
class RankSetting:
    """What a rank's program needs besides its batches, shared by all ranks.

    One manager per table serves every rank: ``dispatch`` only reads it, and
    every rank of a deployment builds the same table from the same config.
    """

    target: Target
    dp_size: int
    manager: Any
    drafter_prefill_manager: Any
    drafter_decode_manager: Any
    parallel_config: Any
    #: Each rank's own ``ParallelConfig`` (its ``data_parallel_rank``), for
    #: the V1 caller, which reads the rank off it; V2 is told the rank and
    #: shares ``parallel_config``.
    rank_parallel_configs: tuple[Any, ...] = ()

    def parallel_config_of(self, rank: int) -> Any:
        if self.rank_parallel_configs:
            return self.rank_parallel_configs[rank]
        return self.parallel_config


def sync(
    setting: RankSetting,
    rank: int,
    phase: str,
    manager: Any,
    batch: RankBatch,
    *,
    reuse: Any = None,
    solo: bool = False,
) -> tuple[Descriptor, Any]:
    """One call into the target, recorded; returns (descriptor, native agreement).

    ``solo`` makes the call inside vLLM's ``skip_dp_coordination()``: the rank
    answers alone, as if every rank had its batch (non-MoE DP, vLLM 24828).
    """
    world = program_world()
    api = setting.target.api
    if solo:
        world.set_skip_dp_coordination(True)
    try:
        native_descriptor, native_agreement = api.call(
            manager,
            batch,
            setting.dp_size,
            rank,
            parallel_config=setting.parallel_config_of(rank),
            reuse=reuse,
        )
    except Exception as error:
        raised = SyncRecord(
            phase,
            batch,
            reused=reuse is not None,
            solo=solo,
            error=f"{type(error).__name__}: {error}",
        )
        world.record(SYNC_EVENT, raised.to_json())
        raise
    finally:
        if solo:
            world.set_skip_dp_coordination(False)
    descriptor = api.describe(native_descriptor)
    returned = SyncRecord.returned(
        phase,
        batch,
        reuse is not None,
        solo,
        descriptor,
        api.agreement(native_agreement),
    )
    world.record(SYNC_EVENT, returned.to_event())
    return descriptor, native_agreement


def mark_runner(setting: RankSetting) -> None:
    """Say in the trace that the V1 runner made it, so properties judge it as
    V1's (a trace without the mark is V2's, as every trace before V1 was)."""
    if setting.target.runner == "v1":
        record(RUNNER_EVENT, {"runner": "v1"})


def expect(
    setting: RankSetting,
    rank: int,
    phase: str,
    manager: Any,
    step: tuple[RankBatch, ...],
    policy: CapturePolicy,
) -> Callable[[str], None]:
    """What a correct sync would choose for ``step``, worked out once (on rank
    0) and recorded for ``phase`` now; the returned function records it for a
    later phase over the same step (a solo repeat) without working it out again."""
    if rank != 0:
        return _record_nothing  # every other rank, every step
    if setting.target.runner == "v1":
        api = setting.target.api
        choices = v1_choices(
            manager,
            step,
            policy.microbatching,
            policy.decode_query_len,
            cascade_read=isinstance(api, V1API) and api.reads("cascade_attn"),
        )
    else:
        choices = table_choices(manager, step, policy.microbatching)

    def record_for(phase: str) -> None:
        if choices is not None:
            record(EXPECT_EVENT, ExpectRecord(phase, choices).to_event())

    record_for(phase)
    return record_for


def _record_nothing(phase: str) -> None:
    """What :func:`expect` returns on a rank that works nothing out."""


def no_rank_has_work(descriptor: Descriptor, agreement: Any) -> bool:
    """Whether the sync said that no rank has work, so every rank skips the step.

    Judged by the agreement, which is identical on every rank (its docstring
    asks callers to branch on it), not by this rank's own token count: a rank
    with no tokens of its own in a busy eager step must still join its peers'
    collectives. (vLLM's model runner branches on ``batch_desc.num_tokens``
    instead; docs/findings.md shows where that goes wrong.)
    """
    return agreement is None and descriptor.num_tokens == 0


def forward(
    setting: RankSetting, rank: int, descriptor: Descriptor, agreement: Any
) -> None:
    """The collectives a forward pass with ``descriptor`` issues on the EP group.

    A replayed graph has a fixed shape, so every rank's MoE dispatch moves the
    padded per-microbatch count; eager ranks exchange their real counts
    instead. When no rank has work, no rank runs a forward. A V1 forward first
    builds the release's own ``DPMetadata`` as ``set_forward_context`` does
    (:func:`_v1_dp_metadata`), so vLLM's own count assertions run.
    """
    if no_rank_has_work(descriptor, agreement):
        return
    if setting.target.runner == "v1":
        _v1_dp_metadata(setting, rank, descriptor, agreement)
    world = program_world()
    moe_collectives(
        world.dist,
        world.group(EP_GROUP),
        descriptor.num_tokens,
        eager=descriptor.cg_mode == CudagraphMode.NONE,
        num_ubatches=descriptor.num_ubatches,
    )


def moe_collectives(
    dist: Any, group: Any, num_tokens: int, *, eager: bool, num_ubatches: int
) -> None:
    """The MoE dispatch/combine of one forward of ``num_tokens`` on ``group``.

    The one model of a forward's EP collectives, shared by the sync lane's
    scenarios (:func:`forward`) and the runner lane's stood-in models and
    graphs (``dpsim.lanes.runner.forward``), so both lanes' traces speak of a
    forward alike. A replayed graph (or a piecewise-compiled forward) has a
    fixed shape, so it moves the padded per-microbatch count, and ranks whose
    shapes differ mismatch; an eager forward exchanges its real count instead
    (an all-gather every rank joins whatever its count).
    """
    microbatches = max(num_ubatches, 1)
    if eager:
        count = _count_tensor(num_tokens)
        gathered = _gather_buffer(group.size())
        for _ in range(microbatches):
            dist.all_gather_into_tensor(gathered, count, group=group)
        return
    activations = _zero_activations(-(-num_tokens // microbatches))
    for _ in range(microbatches):
        dist.all_reduce(activations, group=group)


# A forward's tensors, made once per value and shared by every rank and every
# forward since: each made afresh cost about 10 k instructions, a third of
# every forward's own work. Sharing cannot show: a count is only read (the
# gather's input), a gather buffer only written (and never read), and the EP
# group, which only these forwards use, only ever all-reduces zeros, so the
# activations written back are zeros again. The traces keep the stacked
# inputs and the results, which are the values they held when made afresh.
@functools.lru_cache(maxsize=1024)
def _count_tensor(num_tokens: int) -> torch.Tensor:
    # torch.full: the same one-element tensor as torch.tensor([n]), in a
    # third of the time; a count int32 cannot hold keeps torch.tensor's own
    # refusal (raised, so never kept).
    if _INT32_MIN <= num_tokens <= _INT32_MAX:
        return torch.full((1,), num_tokens, dtype=torch.int32)
    return torch.tensor([num_tokens], dtype=torch.int32)


@functools.lru_cache(maxsize=64)
def _gather_buffer(group_size: int) -> torch.Tensor:
    return torch.empty(group_size, dtype=torch.int32)


@functools.lru_cache(maxsize=256)
def _zero_activations(per_microbatch: int) -> torch.Tensor:
    return torch.zeros(per_microbatch, dtype=_FORWARD_DTYPE)


@dataclass(frozen=True)
class _MoEParallelConfig:
    """What ``DPMetadata.make`` reads of a ``ParallelConfig``, for one rank of
    a DP MoE deployment; anything else it reads fails naming the attribute."""

    data_parallel_size: int
    data_parallel_rank: int
    is_moe_model: bool = True
    use_sequence_parallel_moe: bool = False


def _v1_dp_metadata(
    setting: RankSetting, rank: int, descriptor: Descriptor, agreement: Any
) -> None:
    """Build the release's ``DPMetadata`` as ``set_forward_context`` does for
    ``execute_model``'s forward: this rank's padded count and the agreed
    counts. Its assertion that the two match is vLLM's own check; raised
    here, it ends the rank as it would end the engine (``no-error``)."""
    target = setting.target
    if not isinstance(target, V1Target):
        return
    metadata = target.forward_context.__dict__.get("DPMetadata")
    agreed = target.api.agreement(agreement)
    if metadata is None or agreed is None:
        return  # no DP metadata in this release, or one rank: none is built
    metadata.make(
        _MoEParallelConfig(setting.dp_size, rank),
        descriptor.num_tokens,
        torch.tensor(agreed.num_tokens_across_dp, dtype=torch.int32),
    )
