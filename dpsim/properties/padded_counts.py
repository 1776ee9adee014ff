"""``padded-counts``: the agreed per-rank counts are what each rank will run.

Asserts, for every completed sync with an agreement: entry ``r`` of the agreed
``num_tokens_across_dp`` equals the token count of the descriptor rank ``r``
runs (padded when a graph replays, the rank's own count when eager).

Why: the forward context hands ``num_tokens_across_dp`` to the MoE layers,
which size every rank's share of the all-to-all from it. If it says 8 where a
rank runs 16, tokens are dropped or buffers overrun. Guards: the agreement not
updated with the padded size; dummy batches not shaped like real ones
(30119, 35243, 35376); drafters padding further than the target agreed.

For the V1 runner the same: ``num_tokens_across_dp`` as
``coordinate_batch_across_dp`` returned it against the ``BatchDescriptor`` the
caller re-dispatched (vLLM asserts the two match in the caller and again in
``DPMetadata.make``).
"""

from __future__ import annotations

from .base import Evidence, Property, Verdict

NAME = "padded-counts"


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.complete_phases:
        runs = phase.padded_counts
        agreements = phase.agreements
        if phase.agreements_differ is None:
            # Every rank's agreement equals rank 0's, counts included: rank
            # 0's answers for all, and names the first rank as the loop would.
            agreements = agreements[:1]
        for rank, agreement in enumerate(agreements):
            if agreement is None:
                continue
            agreed = agreement.num_tokens_across_dp
            if agreed == runs:
                continue  # the usual case, seen in one comparison
            if len(agreed) != len(runs):
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank}'s agreed counts have {len(agreed)} entries "
                    f"for {len(runs)} ranks",
                )
            for other, (said, ran) in enumerate(zip(agreed, runs, strict=True)):
                if said != ran:
                    return Verdict(
                        NAME,
                        phase.name,
                        (rank, other),
                        f"rank {rank}'s agreement says rank {other} runs {said} "
                        f"tokens; it runs {ran}",
                    )
    return None


PROPERTY = Property(
    NAME,
    "the agreed per-rank counts equal what each rank will run",
    "agreement not updated with padding; dummy batches (30119, 35243, 35376)",
    judge,
)
