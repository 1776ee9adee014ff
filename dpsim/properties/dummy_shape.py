"""``dummy-shape``: an idle rank's dummy batch is dispatched like a real one.

Asserts, for the runner lane's traces, for every model-runner sync a rank made
for a dummy batch (``iter K model`` with inputs of kind ``dummy``: the sync
``_dummy_run`` reached through ``execute_model``), that its inputs are ones a
real step of the same deployment could pass:

1. ``1 <= num_reqs <= max_num_seqs`` and ``num_reqs <= num_tokens <=
   max_num_batched_tokens`` (every request schedules a token; the scheduler's
   budgets hold);
2. a uniform decode length, when the dummy declares one, is the deployment's
   decode length ``1 + num_speculative_tokens`` (what a real decode step of
   the engine schedules per request), and then ``num_tokens == num_reqs *
   (1 + num_speculative_tokens)``;
3. a query-length bound, when declared, lies between the batch's mean request
   length (rounded up) and its token count;
4. it does not ask for eager (``need_eager``): a real step of the engine loop
   never does, outside profiling.

The drafter's syncs under a dummy run are not judged here: their inputs are
derived from the target's (``reuse``, ``agreement`` and ``drafter-forwards``
judge them).

Why: the dummy batch is the idle rank's vote in the step's DP sync. A vote no
real batch could cast (a uniform length of 1 where real decodes are 1 + k, a
token count beyond the budget, eager) drags the agreement away from what the
busy ranks need: graphs lost or mismatched padding (30119, 35243, 35376, the
dummy-run class of UPSTREAM_BUGS.md).

Runner lane only: the sync lane draws dummy batches itself.
"""

from __future__ import annotations

from typing import Any

from dpsim.records.case import RankBatch

from .base import Evidence, Property, Verdict

NAME = "dummy-shape"
_MODEL_PHASE = " model"


def unlike_real(batch: RankBatch, options: Any) -> str | None:
    """Why no real step of a deployment with ``options`` (the runner lane's
    ``EngineOptions``) passes ``batch``; None when one could."""
    decode = options.decode_query_len
    if not 1 <= batch.num_reqs <= options.max_num_seqs:
        return f"{batch.num_reqs} requests (a real step has 1..{options.max_num_seqs})"
    if not batch.num_reqs <= batch.num_tokens <= options.max_num_batched_tokens:
        return (
            f"{batch.num_tokens} tokens for {batch.num_reqs} requests (a real step "
            f"has {batch.num_reqs}..{options.max_num_batched_tokens})"
        )
    uniform = batch.uniform_token_count
    if uniform is not None and uniform != decode:
        return f"a uniform decode of {uniform} where real decodes are of {decode}"
    if uniform is not None and batch.num_tokens != batch.num_reqs * decode:
        return (
            f"a uniform decode of {uniform} with {batch.num_tokens} tokens for "
            f"{batch.num_reqs} requests"
        )
    bound = batch.max_query_len
    shortest_bound = -(-batch.num_tokens // batch.num_reqs)
    if bound is not None and not shortest_bound <= bound <= batch.num_tokens:
        return (
            f"a query-length bound of {bound} for {batch.num_tokens} tokens in "
            f"{batch.num_reqs} requests"
        )
    if batch.need_eager:
        return "it asks for eager, which a real step never does"
    return None


def judge(evidence: Evidence) -> Verdict | None:
    options = getattr(evidence.case, "options", None)
    if options is None:
        return None  # a sync-lane case: its dummy batches are drawn, not run
    for phase in evidence.phases:
        if not phase.name.endswith(_MODEL_PHASE):
            continue
        for rank, record in enumerate(phase.records):
            if record is None or record.inputs.kind != "dummy":
                continue
            reason = unlike_real(record.inputs, options)
            if reason is not None:
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank}'s dummy batch is unlike any real one: {reason}",
                )
    return None


PROPERTY = Property(
    NAME,
    "an idle rank's dummy batch passes the sync what a real step could",
    "dummy batches not shaped like real ones (30119, 35243, 35376)",
    judge,
    not_for_v1="the V1 runner's traces come from the sync lane, whose dummy "
    "batches are drawn, not run",
)
