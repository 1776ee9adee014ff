"""``idle``: no rank with work means no agreement and no graph; any work means one.

Asserts, for every completed sync: when no rank has tokens, every rank gets an
eager descriptor with 0 tokens and no agreement, so the caller skips the
forward pass on all ranks alike; when some rank has tokens (and there is more
than one rank), every rank gets an agreement to run the forward with.

Why: an all-idle step must be skipped by every rank together (one rank running
a forward alone waits forever in its first MoE collective), and a busy step
must give idle ranks what they need to run their dummy batch in lockstep.
Guards: idle ranks and dummy runs (25906, 28774, vllm-ascend 2454).

Not run on the V1 runner: its caller method coordinates whatever it is
given, an empty batch included (0.33's agrees eager counts of 0 and runs the
forward), and its callers never give it an all-idle step (an idle rank runs
``_dummy_run`` with a token of its own, drawn as a ``dummy`` batch), so
there is no skip to judge; ``no-hang`` judges that every rank joins.
"""

from __future__ import annotations

from .base import EAGER, Evidence, Property, Verdict

NAME = "idle"


def judge(evidence: Evidence) -> Verdict | None:
    dp_size = evidence.case.dp_size
    for phase in evidence.complete_phases:
        if not phase.any_work:
            for rank, (descriptor, agreement) in enumerate(
                zip(phase.descriptors, phase.agreements, strict=True)
            ):
                if descriptor.cg_mode != EAGER or descriptor.num_tokens != 0:
                    return Verdict(
                        NAME,
                        phase.name,
                        (rank,),
                        f"no rank has work, yet rank {rank} runs "
                        f"{descriptor.cg_mode} with {descriptor.num_tokens} tokens",
                    )
                if agreement is not None:
                    return Verdict(
                        NAME,
                        phase.name,
                        (rank,),
                        f"no rank has work, yet rank {rank} got an agreement to run",
                    )
        elif dp_size > 1:
            for rank, agreement in enumerate(phase.agreements):
                if agreement is None:
                    return Verdict(
                        NAME,
                        phase.name,
                        (rank,),
                        f"some rank has work, yet rank {rank} got no agreement",
                    )
    return None


PROPERTY = Property(
    NAME,
    "no rank with work means no sync result and no graph",
    "idle ranks and dummy runs (25906, 28774)",
    judge,
    not_for_v1="V1's caller syncs every step it is given, an empty one "
    "too; an idle rank runs a dummy batch of its own",
)
