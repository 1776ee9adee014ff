"""``drafter-forwards``: every rank runs the same number of drafter forwards per forward step.

Asserts, for the runner lane's traces: for every forward step ``K`` (the
rank's K-th model-runner sync, ``iter K model``; see
:mod:`dpsim.lanes.runner.syncs`), the drafter forwards each rank ran after
that sync and before its next one (``drafter_forward`` events, one per
stood-in drafter forward, FULL replay or eager alike) are as many on every
rank. A rank whose step ``K`` ended (it made its next model sync, its
program finished, or it entered the engine loop's own all-reduce on
``engine_dp``, which comes after a step's forwards) has a final count; a rank
stopped inside step ``K`` (hung, raised, out of budget) has a count that can
only grow, so the property fails only when a final count is below another
rank's count for the same step, never on a count still open.

Why: every drafter forward of a DP+EP deployment issues the MoE collectives;
a rank that drafts fewer steps (its own ``num_speculative_tokens`` where the
agreed one belongs, a drafter skipped on an idle rank, an early return near
``max_model_len``) leaves the others waiting in an expert all-to-all. The
simulator shows that as a hang; this property names the step and the counts.
Guards: speculators running a different number of forwards on some ranks
(27691, 40589/44185, 35243's dummy-run drafting).

Runner lane only: the sync lane's programs run no drafter forwards.
"""

from __future__ import annotations

from dpsim.records.groups import ENGINE_DP_GROUP
from dpsim.records.sync import SYNC_EVENT
from dpsim.records.trace import RankState

from .base import Evidence, Property, Verdict

NAME = "drafter-forwards"
#: The event a stood-in drafter forward leaves (``dpsim.lanes.runner.syncs``).
DRAFTER_FORWARD_EVENT = "drafter_forward"
_MODEL_PHASE = " model"


def forwards_per_step(evidence: Evidence) -> list[tuple[dict[int, int], int | None]]:
    """Per rank: drafter forwards per forward step, and the step still open
    (None when the rank finished, so every count is final)."""
    counted: list[tuple[dict[int, int], int | None]] = []
    for trace in evidence.result.ranks:
        counts: dict[int, int] = {}
        step = 0
        started = 0  # collectives entered when the open step began
        for event in trace.events:
            if event.kind == SYNC_EVENT:
                phase = str(event.payload["phase"])
                if phase.endswith(_MODEL_PHASE):
                    step = int(phase.split()[1])
                    started = event.after_collectives
                    counts.setdefault(step, 0)
            elif event.kind == DRAFTER_FORWARD_EVENT:
                counts[step] = counts.get(step, 0) + 1
        finished = trace.state == RankState.FINISHED or any(
            # The engine loop's all-reduce comes after a step's forwards:
            # a rank that entered it has drafted all it will for the step.
            record.group == ENGINE_DP_GROUP
            for record in trace.collectives[started:]
        )
        counted.append((counts, None if finished else step))
    return counted


def judge(evidence: Evidence) -> Verdict | None:
    per_rank = forwards_per_step(evidence)
    steps = sorted({step for counts, _ in per_rank for step in counts})
    for step in steps:
        for rank, (counts, open_step) in enumerate(per_rank):
            if step == open_step or step not in counts:
                continue  # still open, or never reached (another property's)
            final = counts.get(step, 0)
            for other, (other_counts, _) in enumerate(per_rank):
                ran = other_counts.get(step, 0)
                if ran > final:
                    return Verdict(
                        NAME,
                        f"iter {step}",
                        (rank, other),
                        f"rank {rank} ran {final} drafter forwards in forward "
                        f"step {step}, rank {other} ran {ran}",
                    )
    return None


PROPERTY = Property(
    NAME,
    "every rank runs the same number of drafter forwards per forward step",
    "drafters running more or fewer forwards on some ranks (27691, 40589, 35243)",
    judge,
    not_for_v1="the V1 runner's traces come from the sync lane, which runs no "
    "drafter forwards",
)
