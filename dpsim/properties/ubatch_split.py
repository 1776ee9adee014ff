"""``ubatch-split``: a microbatched graph is only replayed when every rank fills it.

Asserts, for every completed sync whose descriptor replays a graph split into
``n > 1`` microbatches: each rank's real tokens reach into its last
microbatch, i.e. ``tokens > (n - 1) * (graph_tokens // n)``.

Why: a rank whose last microbatch is empty replays a FULL microbatched graph
over nothing but padding, while the others run real work through the same
expert all-to-all; vLLM falls back to eager exactly to avoid this. Guards:
microbatching boundary cases (57020, open upstream: counts [64, 128] with a
128-token graph pass the guard ``2*min < graph_tokens``).

For the V1 runner the same, ``num_tokens`` being the padded count the caller
re-dispatched at: V1 guards this with ``is_last_ubatch_empty`` on the
smallest real and largest padded counts.
"""

from __future__ import annotations

from .base import EAGER, Evidence, Property, Verdict

NAME = "ubatch-split"


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.complete_phases:
        for rank, descriptor in enumerate(phase.descriptors):
            parts = descriptor.num_ubatches
            if parts <= 1 or descriptor.cg_mode == EAGER:
                continue
            filled_before_last = (parts - 1) * (descriptor.num_tokens // parts)
            tokens = phase.all_inputs[rank].num_tokens
            if tokens <= filled_before_last:
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank} replays a {descriptor.cg_mode} graph of "
                    f"{descriptor.num_tokens} tokens in {parts} microbatches with "
                    f"{tokens} real tokens: its last microbatch is empty",
                )
    return None


PROPERTY = Property(
    NAME,
    "a microbatched graph replays only when every rank's last microbatch has tokens",
    "microbatching boundary cases (57020)",
    judge,
)
