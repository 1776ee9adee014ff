"""``no-hang``: every rank issues the same collectives, in the same order, and none waits.

Asserts that the simulated run ended with every collective complete: the sync's
own all-reduce and the collectives each rank's forward pass issued with the
shape it chose. The simulator decides this exactly (no timeouts): a
collective whose members disagree on op, shape or dtype is a mismatch; one
some rank never enters is a hang; a rank that spins forever exceeds its step
budget. A rank that *raised* is ``no-error``'s to report.

Why: this is the production failure itself: NCCL/gloo deadlocks, size
mismatches, hours of hung GPUs. Guards: a collective skipped or issued a
different number of times on some ranks (18724, 26086, 27691, 28774, 40589,
vllm-ascend 2454); an extra collective or a different tensor shape
(56281, vllm-ascend 9689).

For the V1 runner the same: the sync's all-reduce on the DP device group, and
the forward's collectives for the mode, padded count and microbatch split the
caller method chose.
"""

from __future__ import annotations

from dpsim.records.trace import Outcome, RankState

from .base import Evidence, Property, Verdict

NAME = "no-hang"
_FAILING = {
    Outcome.HANG: "hang",
    Outcome.MISMATCH: "mismatch",
    Outcome.BUDGET: "budget",
}


#: Read once: reading a member off its enum class costs about a function call
#: on Python 3.11.
_OK = Outcome.OK
_RAISED = RankState.RAISED


def judge(evidence: Evidence) -> Verdict | None:
    result = evidence.result
    outcome = result.outcome
    # The usual run first, in one string comparison: looking an outcome up
    # in _FAILING runs the enum's Python __hash__.
    if outcome == _OK:
        return None
    if any(trace.state == _RAISED for trace in result.ranks):
        return None
    if outcome not in _FAILING:
        return None
    stuck = tuple(
        trace.rank for trace in result.ranks if trace.state != RankState.FINISHED
    )
    finished = len(result.ranks) - len(stuck)
    return Verdict(
        NAME,
        None,
        stuck,
        f"{_FAILING[result.outcome]}: {finished} of {len(result.ranks)} ranks "
        f"finished; stuck: {', '.join(map(str, stuck))}",
    )


PROPERTY = Property(
    NAME,
    "every rank issues the same collectives in the same order, and none is left waiting",
    "collectives skipped, repeated or reshaped on some ranks (18724, 26086, 28774, 40589)",
    judge,
)
