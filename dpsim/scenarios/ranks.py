"""What one virtual rank does in a scenario: syncs, then the forward pass.

Every sync a rank makes is recorded as a ``sync`` event (a
:class:`~dpsim.records.sync.SyncRecord`) so properties can judge it
afterwards; nothing here judges. After each sync the rank issues the collectives its forward pass would
issue with the chosen shape (:func:`forward`), so ranks that chose differently
diverge in the simulator the way they would on GPUs: a mismatch or a hang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from dpsim.records.case import RankBatch
from dpsim.records.groups import EP_GROUP
from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import (
    EXPECT_EVENT,
    SYNC_EVENT,
    Descriptor,
    ExpectRecord,
    SyncRecord,
)
from dpsim.targets import runtime
from dpsim.targets.adapters import agreement_of, describe
from dpsim.targets.load import Target

from .expect import table_choices

_FORWARD_DTYPE = torch.int8


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
    def record(self, kind: str, payload: dict[str, Any]) -> None: ...
    def set_skip_dp_coordination(self, flag: bool) -> None: ...


def program_world() -> ProgramWorld:
    world = runtime.current()
    if world is runtime.NO_WORLD:
        raise RuntimeError(
            "a scenario program ran outside a world: run it through "
            "dpsim.scenarios.run_case (simulated) or dpsim.replay (real processes)"
        )
    return cast(ProgramWorld, world)


def record(kind: str, payload: dict[str, Any]) -> None:
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
    # Only a solo call needs the world here; record() finds it itself.
    world = program_world() if solo else None
    if world is not None:
        world.set_skip_dp_coordination(True)
    try:
        native_descriptor, native_agreement = setting.target.api.call(
            manager,
            batch,
            setting.dp_size,
            rank,
            parallel_config=setting.parallel_config,
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
        record(SYNC_EVENT, raised.to_json())
        raise
    finally:
        if world is not None:
            world.set_skip_dp_coordination(False)
    descriptor = describe(native_descriptor)
    returned = SyncRecord(
        phase,
        batch,
        reused=reuse is not None,
        solo=solo,
        descriptor=descriptor,
        agreement=agreement_of(native_agreement),
    )
    record(SYNC_EVENT, returned.to_json())
    return descriptor, native_agreement


def expect(
    rank: int,
    phase: str,
    manager: Any,
    step: tuple[RankBatch, ...],
    microbatching: Any,
) -> Callable[[str], None]:
    """What a correct sync would choose for ``step``, worked out once (on rank
    0) and recorded for ``phase`` now; the returned function records it for a
    later phase over the same step (a solo repeat) without working it out again."""
    choices = table_choices(manager, step, microbatching) if rank == 0 else None

    def record_for(phase: str) -> None:
        if choices is not None:
            record(EXPECT_EVENT, ExpectRecord(phase, choices).to_json())

    record_for(phase)
    return record_for


def no_rank_has_work(descriptor: Descriptor, agreement: Any) -> bool:
    """Whether the sync said that no rank has work, so every rank skips the step.

    Judged by the agreement, which is identical on every rank (its docstring
    asks callers to branch on it), not by this rank's own token count: a rank
    with no tokens of its own in a busy eager step must still join its peers'
    collectives. (vLLM's model runner branches on ``batch_desc.num_tokens``
    instead; README, "What dpsim found", shows where that goes wrong.)
    """
    return agreement is None and descriptor.num_tokens == 0


def forward(descriptor: Descriptor, agreement: Any) -> None:
    """The collectives a forward pass with ``descriptor`` issues on the EP group.

    A replayed graph has a fixed shape, so every rank's MoE dispatch moves the
    padded per-microbatch count; eager ranks exchange their real counts
    instead. When no rank has work, no rank runs a forward.
    """
    if no_rank_has_work(descriptor, agreement):
        return
    world = program_world()
    group = world.group(EP_GROUP)
    dist = world.dist
    microbatches = max(descriptor.num_ubatches, 1)
    if descriptor.cg_mode == CudagraphMode.NONE:
        count = torch.tensor([descriptor.num_tokens], dtype=torch.int32)
        gathered = torch.empty(group.size(), dtype=torch.int32)
        for _ in range(microbatches):
            dist.all_gather_into_tensor(gathered, count, group=group)
        return
    per_microbatch = -(-descriptor.num_tokens // microbatches)
    activations = torch.zeros(per_microbatch, dtype=_FORWARD_DTYPE)
    for _ in range(microbatches):
        dist.all_reduce(activations, group=group)
