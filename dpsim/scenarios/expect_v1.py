"""What a correct V1 coordination chooses for a step: the V1 runner's oracle.

The V1 runner decides around its sync (``_determine_batch_execution_and_padding``):
each rank asks its ``CudagraphDispatcher`` for its own batch (any mode but
FULL on a step with encoder inputs of an encoder-decoder model or with cascade
attention), the ranks agree
on the least of those modes (one eager rank makes every rank eager), on
microbatching (every rank votes for it and every rank's tokens reach into the
last microbatch of the largest padded batch) and, when the agreed mode replays
a graph or the step is microbatched, on the largest padded count; each rank
then dispatches again at its agreed count, restricted to the agreed mode.

As :mod:`dpsim.scenarios.expect` does for V2, this asks the release's own
dispatcher for every table lookup, so no table logic is rewritten here, and
records the result as an :class:`~dpsim.records.sync.ExpectRecord` for
``graph-choice`` and ``ubatch-decision``. A dispatcher that cannot be asked
for a restricted lookup (0.12's takes neither ``invalid_modes`` nor
``disable_full``) leaves such a step unjudged rather than guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode, Microbatching
from dpsim.records.sync import Choice
from dpsim.targets.adapters import parameters_of, plain_mode
from dpsim.targets.v1.api import DUMMY_KINDS, request_counts
from dpsim.targets.v1.dispatcher import model_is_encoder_decoder

#: The order ``coordinate_batch_across_dp`` takes the least of (0, 1, 2).
_LEVEL = {CudagraphMode.NONE: 0, CudagraphMode.PIECEWISE: 1, CudagraphMode.FULL: 2}


class _Unanswerable(Exception):
    """The release's dispatcher cannot be asked the lookup a step needs."""


def forced_uniform_decode(batch: RankBatch) -> bool | None:
    """The ``force_uniform_decode`` a caller passes for ``batch``: ``_dummy_run``
    passes its own flag, ``execute_model`` none (the method then works it out
    from the per-request counts); a contract batch flagged uniform forces it."""
    if batch.kind in DUMMY_KINDS:
        return batch.uniform_decode
    return True if batch.uniform_decode else None


def longest_request(batch: RankBatch) -> int:
    """The most tokens one request of ``batch`` schedules, as the V1 adapter
    derives per-request counts from it (:func:`request_counts`)."""
    return max(request_counts(batch), default=0)


def is_uniform_decode(batch: RankBatch, decode_query_len: int) -> bool:
    """Whether the caller treats ``batch`` as a uniform decode (its
    ``_is_uniform_decode``: every request ``decode_query_len`` tokens)."""
    forced = forced_uniform_decode(batch)
    if forced is not None:
        return forced
    longest = longest_request(batch)
    return longest == decode_query_len and batch.num_tokens == longest * batch.num_reqs


@dataclass(frozen=True)
class _Vote:
    """One rank's side of the all-reduce: its mode, padded count and split vote."""

    mode: CudagraphMode
    padded: int
    split: bool


def v1_choices(
    dispatcher: Any,
    step: Sequence[RankBatch],
    settings: Microbatching | None,
    decode_query_len: int,
    *,
    cascade_read: bool = True,
) -> tuple[Choice, ...] | None:
    """Each rank's expected (cg_mode, num_tokens, num_ubatches); None where the
    step is not judged (one rank: no coordination; a lookup the dispatcher
    cannot answer). ``cascade_read``: whether the caller method reads its
    ``use_cascade_attn`` (0.32 keeps the parameter and ignores it)."""
    if len(step) < 2:
        return None
    if not cascade_read and any(batch.cascade_attn for batch in step):
        step = [replace(batch, cascade_attn=False) for batch in step]
    uniform = [is_uniform_decode(batch, decode_query_len) for batch in step]
    try:
        votes = [
            _vote(dispatcher, batch, flag, settings)
            for batch, flag in zip(step, uniform, strict=True)
        ]
        synced = min((vote.mode for vote in votes), key=_LEVEL.__getitem__)
        parts = _parts(step, votes, settings)
        largest = max(vote.padded for vote in votes)
        pad = synced != CudagraphMode.NONE or parts > 1
        shared = decode_query_len if all(uniform) else None
        return tuple(
            _redispatch(
                dispatcher,
                batch,
                flag,
                largest if pad else vote.padded,
                synced,
                parts,
                Choice(CudagraphMode.NONE, 0, parts, largest, shared, None),
            )
            for batch, flag, vote in zip(step, uniform, votes, strict=True)
        )
    except _Unanswerable:
        return None
    except AssertionError:
        # The release's own dispatcher asserted on a lookup the ranks' real
        # calls make too: each rank's call raises it where it stands, and
        # no-error reports it there. The oracle runs inside rank 0's program,
        # so raising here would blame rank 0 before it ever reached its sync.
        return None


def _vote(
    dispatcher: Any, batch: RankBatch, uniform: bool, settings: Microbatching | None
) -> _Vote:
    if batch.need_eager:
        mode, padded = CudagraphMode.NONE, batch.num_tokens
    else:
        # An encoder-decoder model's step with encoder outputs replays no FULL
        # graph on that rank (the caller's has_encoder_output), nor does a
        # step with cascade attention.
        encoder = batch.num_encoder_reqs > 0 and model_is_encoder_decoder(dispatcher)
        mode, padded = _lookup(
            dispatcher,
            batch.num_tokens,
            uniform,
            batch,
            None,
            disable_full=encoder or batch.cascade_attn,
        )
    threshold = (
        None
        if settings is None
        else settings.decode_token_threshold
        if uniform
        else settings.prefill_token_threshold
    )
    split = (
        batch.allow_ubatching
        and threshold is not None
        and batch.num_tokens >= threshold
    )
    return _Vote(mode, padded, split)


def _parts(
    step: Sequence[RankBatch], votes: list[_Vote], settings: Microbatching | None
) -> int:
    """Microbatches: every rank votes to split and every rank's real tokens
    reach into the last microbatch of the largest padded batch."""
    if settings is None or not all(vote.split for vote in votes):
        return 1
    parts = settings.num_ubatches
    smallest = min(batch.num_tokens for batch in step)
    largest = max(vote.padded for vote in votes)
    return parts if smallest > (largest // parts) * (parts - 1) else 1


def _redispatch(
    dispatcher: Any,
    batch: RankBatch,
    uniform: bool,
    count: int,
    synced: CudagraphMode,
    parts: int,
    agreed: Choice,
) -> Choice:
    if batch.need_eager or synced == CudagraphMode.NONE:
        mode, tokens = CudagraphMode.NONE, count
    else:
        # 0.12 dispatches again with the rank's own cascade flag; later
        # releases restrict to the agreed mode, which is then below FULL.
        mode, tokens = _lookup(
            dispatcher, count, uniform, batch, synced, disable_full=batch.cascade_attn
        )
    return Choice.unchecked(
        mode, tokens, parts, agreed.largest, agreed.uniform, agreed.bound
    )


def _lookup(
    dispatcher: Any,
    tokens: int,
    uniform: bool,
    batch: RankBatch,
    only: CudagraphMode | None,
    *,
    disable_full: bool = False,
) -> tuple[CudagraphMode, int]:
    """The dispatcher's choice for ``tokens`` as (mode, padded count): any mode
    (``only`` None, a rank's own lookup; any but FULL with ``disable_full``),
    or ``only`` that mode else eager at ``tokens`` (the lookup at the agreed
    count, restricted to the agreed mode)."""
    accepted = parameters_of(dispatcher.dispatch)
    if "num_tokens" not in accepted:
        raise _Unanswerable  # 0.11's dispatcher takes a descriptor, not counts
    kwargs: dict[str, Any] = {
        "num_tokens": tokens,
        "uniform_decode": uniform,
        "has_lora": batch.num_active_loras > 0,
    }
    if "num_active_loras" in accepted:
        kwargs["num_active_loras"] = batch.num_active_loras
    if only == CudagraphMode.PIECEWISE or disable_full:
        if "invalid_modes" in accepted:
            kwargs["invalid_modes"] = {_native(dispatcher, CudagraphMode.FULL)}
        elif "disable_full" in accepted:
            kwargs["disable_full"] = True
        elif disable_full and "use_cascade_attn" in accepted:
            kwargs["use_cascade_attn"] = True  # 0.12: its one way to leave FULL out
        elif disable_full:
            raise _Unanswerable  # 0.12's dispatcher cannot leave FULL out
    native_mode, descriptor = dispatcher.dispatch(**kwargs)
    mode = plain_mode(native_mode)
    if only is None:
        return mode, int(descriptor.num_tokens)
    if _LEVEL[mode] > _LEVEL[only]:
        # Only 0.12's dispatcher gets here: it cannot be told to leave FULL out.
        raise _Unanswerable
    if mode != only:
        return CudagraphMode.NONE, tokens
    return mode, int(descriptor.num_tokens)


def _native(dispatcher: Any, mode: CudagraphMode) -> Any:
    """The release's own enum member for ``mode``."""
    return getattr(type(dispatcher.cudagraph_mode), mode.value)
