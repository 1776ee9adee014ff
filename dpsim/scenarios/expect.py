"""What a correct sync chooses for a step, from every rank's batch: the oracle.

Safety properties judge ranks against each other, so a sync that is wrong on
every rank alike (always eager, padding to a graph larger than needed, never
microbatching) passes them all, and such a sync throws away what DP padding
and CUDA graphs exist for. The documented contract says what the choice
should be: the ranks agree on the largest token count, the uniform decode
length they share, the largest query-length bound (none if any rank has
none) and whether to microbatch; one rank that cannot replay a graph makes
every rank eager; otherwise each rank runs what the capture table gives that
agreed batch with its own request and LoRA counts.

The oracle asks the version's own manager (``dispatch``) for those choices, so
no table logic is rewritten here; it runs once per step, in rank 0's program,
and is recorded as an ``expect`` event (an
:class:`~dpsim.records.sync.ExpectRecord`) for the ``graph-choice`` property.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode, Microbatching
from dpsim.records.sync import Choice
from dpsim.targets.adapters import describe, dispatcher, plain_mode


def expected_split(batches: Sequence[RankBatch], settings: Microbatching | None) -> int:
    """Microbatches the step splits into: with two or more ranks, all allow it
    and the smallest reaches the threshold (decode when every rank runs the
    same uniform decode, prefill otherwise)."""
    if settings is None or len(batches) < 2:
        return 1  # one rank skips the sync and everything it agrees
    if not all(batch.allow_ubatching for batch in batches):
        return 1
    shared_decode = len({batch.uniform_token_count for batch in batches}) == 1 and all(
        batch.uniform_decode for batch in batches
    )
    threshold = (
        settings.decode_token_threshold
        if shared_decode
        else settings.prefill_token_threshold
    )
    smallest = min(batch.num_tokens for batch in batches)
    return settings.num_ubatches if smallest >= threshold else 1


@dataclass(frozen=True)
class _Agreed:
    """The batch the ranks agree on; see :class:`~dpsim.records.sync.Choice`."""

    largest: int
    uniform: int | None
    bound: int | None


def table_choices(
    manager: Any, step: Sequence[RankBatch], settings: Microbatching | None
) -> tuple[Choice, ...] | None:
    """Each rank's expected (cg_mode, num_tokens, num_ubatches), with what the
    ranks agreed; None where there is nothing to judge (no manager: a profile
    run; no work anywhere: the ``idle`` property's domain)."""
    tokens = [batch.num_tokens for batch in step]
    if manager is None or not any(tokens):
        return None
    largest = max(tokens)
    smallest = min(tokens)
    uniforms = {batch.uniform_token_count for batch in step}
    uniform = uniforms.pop() if len(uniforms) == 1 else None
    bounds = [batch.max_query_len for batch in step]
    bound = None if None in bounds else max(b for b in bounds if b is not None)
    parts = expected_split(step, settings)
    anyone_eager = any(batch.need_eager for batch in step)
    agreed = _Agreed(largest, uniform, bound)
    if parts > 1:
        return tuple(
            _split_choice(manager, batch, agreed, smallest, parts, anyone_eager)
            for batch in step
        )
    ask = dispatcher(manager, "num_active_loras", "max_query_len")
    if anyone_eager or any(
        _alone(ask, manager, batch) == CudagraphMode.NONE for batch in step
    ):
        none = CudagraphMode.NONE
        return tuple(
            Choice.unchecked(none, count, 1, largest, uniform, bound)
            for count in tokens
        )
    return tuple(
        _described(
            ask(
                manager, batch.num_reqs, largest, uniform, batch.num_active_loras, bound
            ),
            agreed,
        )
        for batch in step
    )


def _alone(ask: Callable[..., Any], manager: Any, batch: RankBatch) -> CudagraphMode:
    """The mode this rank's own batch gets from the table: its vote (``ask``
    is the table's :func:`~dpsim.targets.adapters.dispatcher` of LoRA count
    and query bound)."""
    return plain_mode(
        ask(
            manager,
            batch.num_reqs,
            batch.num_tokens,
            batch.uniform_token_count,
            batch.num_active_loras,
            batch.max_query_len,
        ).cg_mode
    )


def _split_choice(
    manager: Any,
    batch: RankBatch,
    agreed: _Agreed,
    smallest: int,
    parts: int,
    anyone_eager: bool,
) -> Choice:
    # Every rank pads to the largest; a microbatched graph only if one serves
    # and every rank has tokens in its last microbatch (ubatch-split).
    eager = _choice(CudagraphMode.NONE, agreed.largest, parts, agreed)
    if anyone_eager:
        return eager
    ask = dispatcher(manager, "num_active_loras", "num_ubatches")
    graph = describe(
        ask(
            manager,
            batch.num_reqs,
            agreed.largest,
            agreed.uniform,
            batch.num_active_loras,
            parts,
        )
    )
    if graph.cg_mode == CudagraphMode.NONE or smallest <= (parts - 1) * (
        graph.num_tokens // parts
    ):
        return eager
    return _choice(graph.cg_mode, graph.num_tokens, parts, agreed)


def _described(native: Any, agreed: _Agreed) -> Choice:
    # Read as describe() reads them, without the whole descriptor (int()
    # only of what is not an int already): one per rank per judged step.
    mode = plain_mode(native.cg_mode)
    tokens = native.num_tokens
    parts = getattr(native, "num_ubatches", 1)
    return Choice.unchecked(
        mode,
        tokens if type(tokens) is int else int(tokens),
        parts if type(parts) is int else int(parts),
        agreed.largest,
        agreed.uniform,
        agreed.bound,
    )


def _choice(mode: CudagraphMode, tokens: int, parts: int, agreed: _Agreed) -> Choice:
    return Choice.unchecked(
        mode, tokens, parts, agreed.largest, agreed.uniform, agreed.bound
    )
