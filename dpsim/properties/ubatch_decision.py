"""``ubatch-decision``: a step is microbatched exactly when the agreed votes say so.

Asserts, for every sync that all ranks made afresh, with some work, on a
version that microbatches: the step is split into the configured number of
microbatches if and only if every rank allowed it and the smallest rank's
token count reaches the threshold, the decode threshold when every rank runs
the same uniform decode and the prefill threshold otherwise; when it is not
split, every rank runs one batch.

Why: the decision is taken once for all ranks from agreed values, because
expert all-to-all needs every rank to split alike (``agreement`` catches ranks
deciding differently). A decision agreed but wrong passes every other
property: splitting below the threshold runs two half-empty microbatches,
never splitting throws away the overlap DBO exists for, and a decode held to
the prefill threshold does both. Guards: microbatching decided from the wrong
votes or counts (51700's threshold on the smallest rank, 57020's boundary).

For the V1 runner the decision is ``coordinate_batch_across_dp``'s: every
rank votes to split when it allows it and its own token count reaches the
threshold its own batch calls for (decode for a uniform decode, else
prefill), and the split is kept only when every rank's tokens reach into the
last microbatch of the largest padded batch; the expected count is the V1
oracle's (:mod:`dpsim.scenarios.expect_v1`), which asks the release's
dispatcher for each rank's padded vote.
"""

from __future__ import annotations

from dpsim.records.case import RankBatch
from dpsim.records.policy import Microbatching
from dpsim.scenarios.expect import expected_split

from .base import Evidence, Property, Verdict

NAME = "ubatch-decision"


def judge(evidence: Evidence) -> Verdict | None:
    settings = evidence.case.policy.microbatching
    if settings is None:
        return None
    if evidence.runner == "v1":
        return _judge_v1(evidence, settings)
    for phase in evidence.complete_phases:
        if not phase.any_work or phase.any_reused:
            continue
        ranks = range(len(phase.records))
        inputs = [phase.inputs(rank) for rank in ranks]
        expected = expected_split(inputs, settings)
        for rank in ranks:
            parts = phase.descriptor(rank).num_ubatches or 1
            if parts != expected:
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank} runs {parts} microbatch(es), but the votes "
                    f"{_votes(inputs)} with thresholds decode "
                    f"{settings.decode_token_threshold} / prefill "
                    f"{settings.prefill_token_threshold} call for {expected}",
                )
    return None


def _judge_v1(evidence: Evidence, settings: Microbatching) -> Verdict | None:
    expected = evidence.expected
    for phase in evidence.complete_phases:
        choices = expected.get(phase.name)
        if choices is None:
            continue  # a step the oracle could not judge
        for rank, choice in enumerate(choices):
            parts = phase.descriptor(rank).num_ubatches or 1
            if parts != choice.num_ubatches:
                inputs = [phase.inputs(other) for other in range(len(choices))]
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank} runs {parts} microbatch(es), but the votes "
                    f"{_votes(inputs)} with thresholds decode "
                    f"{settings.decode_token_threshold} / prefill "
                    f"{settings.prefill_token_threshold} and every rank's last "
                    f"microbatch of {choice.largest} tokens call for "
                    f"{choice.num_ubatches}",
                )
    return None


def _votes(inputs: list[RankBatch]) -> str:
    return (
        "["
        + ", ".join(
            f"{batch.num_tokens} tokens"
            + (" decode" if batch.uniform_decode else "")
            + ("" if batch.allow_ubatching else " no-split")
            for batch in inputs
        )
        + "]"
    )


PROPERTY = Property(
    NAME,
    "microbatched exactly when every rank allows it and the smallest reaches "
    "the threshold",
    "microbatching decided from the wrong votes or counts (51700, 57020)",
    judge,
)
