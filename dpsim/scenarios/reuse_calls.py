"""The contract profile's drafter reuse calls: what a prefill passes beside a reused agreement.

``dispatch_cg_and_sync_dp``'s docstring lets a call reusing an agreement pass
"this same padded ``num_tokens`` and the same ``uniform_token_count``", and
says ``num_reqs`` "may differ" (at most one request per real token); its
query-length bound and LoRA count are the call's own (the dispatch on this
rank's manager uses them; the agreement does not hold them). vLLM's drafters
pass their batch's request count, no bound and no LoRA count, which the
caller profile keeps; the contract profile draws the rest too: request
counts other than the target's, a bound or none (below, at and above the
decode length, where varlen decode graphs stop serving), and any LoRA count
up to the largest case of the table the prefill dispatches on (the
drafter's): more adapters than that are never active at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from hypothesis import strategies as st

from dpsim.records.case import RankBatch, ReuseCall
from dpsim.records.policy import CapturePolicy

#: Draws one step's reuse calls, one per rank, from that step's batches.
ReuseCallsOf = Callable[[st.DrawFn, tuple[RankBatch, ...]], tuple[ReuseCall, ...]]


def reuse_calls(
    policy: CapturePolicy, features: frozenset[str], loras: st.SearchStrategy[int]
) -> ReuseCallsOf:
    """Reuse calls for ``policy``'s drafter prefills, as the sync's parameters
    (``features``) allow: a version without a query bound or LoRA count
    parameter gets none drawn."""
    query_len = policy.decode_query_len
    max_reqs = policy.max_num_seqs
    bounds = st.one_of(
        st.none(),
        st.sampled_from(sorted({1, max(1, query_len - 1), query_len, query_len + 1})),
        st.integers(1, 2 * query_len + 2),
    )
    with_bound = "max_query_len" in features
    with_loras = "num_active_loras" in features

    @functools.lru_cache(maxsize=256)
    def request_counts(own: int, most: int) -> st.SearchStrategy[int]:
        # Built once per pair: Hypothesis validates a strategy on first draw.
        return st.one_of(
            st.just(own), st.sampled_from(sorted({1, most})), st.integers(1, most)
        )

    def one(draw: st.DrawFn, batch: RankBatch) -> ReuseCall:
        # At most one request per real token (of the agreed uniform length,
        # where there is one): the padded count only adds padding. The
        # target's count first: the simplest call is vLLM's own.
        most = min(max_reqs, batch.num_tokens // (batch.uniform_token_count or 1))
        reqs = (
            draw(request_counts(batch.num_reqs, most)) if most >= 1 else batch.num_reqs
        )
        return ReuseCall(
            num_reqs=reqs,
            max_query_len=draw(bounds) if with_bound else None,
            num_active_loras=draw(loras) if with_loras else 0,
        )

    def step(draw: st.DrawFn, batches: tuple[RankBatch, ...]) -> tuple[ReuseCall, ...]:
        # Ranks given one batch share its call, as they share palettes.
        shared: dict[RankBatch, ReuseCall] = {}
        calls = []
        for batch in batches:
            if batch not in shared:
                shared[batch] = one(draw, batch)
            calls.append(shared[batch])
        return tuple(calls)

    return step
