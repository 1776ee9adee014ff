"""Contract-profile steps drawn on purpose where one agreed value decides the outcome.

Free draws reach some branch combinations only about once in a thousand
cases. The agreed query-length bound is one: it matters only when every rank
passes a bound (else none is agreed), the ranks fall on both sides of the
decode length (a varlen decode graph, captured for bounds up to it, serves
one rank and not the other), nobody forces eager and the padded count stays
inside the graphs. :func:`bound_straddles` draws exactly such steps, so the
agreement's ``max`` of the bounds is tested on every table that has varlen
decode graphs: taking the ``min`` (or one rank's own) then hands the longer
rank a graph too short for its requests, which the ``coverage`` property
sees. In half of them the longer rank passes no bound at all (a batch with a
prefill), where no bound may be agreed: agreeing one when *any* rank passes
one hands that rank a varlen decode graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import strategies as st

from dpsim.capture.once import BOOLEANS, ints
from dpsim.records.case import RankBatch
from dpsim.records.policy import CapturePolicy

#: Draws one step's batches for ``dp_size`` ranks.
StepOf = Callable[[st.DrawFn, int], list[RankBatch]]


def bound_straddles(
    policy: CapturePolicy, features: frozenset[str], loras: st.SearchStrategy[int]
) -> StepOf | None:
    """Steps whose ranks' query bounds straddle the decode length, or None
    where the bound decides nothing: a table without varlen decode graphs
    (the only ones captured with a bound), a decode length of one, a sync
    that takes no bound."""
    query_len = policy.decode_query_len
    if not policy.varlen_decode or query_len < 2 or "max_query_len" not in features:
        # No graph takes a bound: the agreed one changes nothing.
        return None
    has = features.__contains__
    largest = max(policy.capture_sizes, default=8)
    # Small enough that both shapes fit inside the largest graph.
    most_reqs = max(1, min(policy.max_num_seqs, largest // (2 * query_len + 2)))
    requests = st.integers(1, most_reqs)
    within = st.integers(1, query_len)
    beyond = st.integers(query_len + 1, 2 * query_len + 2)

    def shape(draw: st.DrawFn, bound: int) -> RankBatch:
        reqs = draw(requests)
        # One request of ``bound`` tokens, the others 1..bound each.
        tokens = draw(ints(reqs - 1 + bound, reqs * bound))
        return RankBatch(
            num_reqs=reqs,
            num_tokens=tokens,
            max_query_len=bound,
            num_active_loras=draw(loras) if has("num_active_loras") else 0,
            allow_skip_drafts=has("allow_skip_drafts") and draw(BOOLEANS),
            kind="batch",
        )

    def step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        short, long = shape(draw, draw(within)), shape(draw, draw(beyond))
        if draw(BOOLEANS):
            # The longer rank passes no bound, as a batch with a prefill does
            # (0.33's runner drops it): then no bound is agreed at all.
            long = replace(long, max_query_len=None)
        pick = st.sampled_from((short, long))
        # Both sides on the first two ranks (where there are two); the rest
        # from either.
        return [short, long, *(draw(pick) for _ in range(dp_size - 2))][:dp_size]

    return step
