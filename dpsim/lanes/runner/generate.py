"""Hypothesis strategies for the runner lane: engine options and per-rank request streams.

What the modelled scheduler (:mod:`dpsim.lanes.runner.scheduler`) plays is
drawn here, adversarial but realistic: idle ranks (no request at all), ranks
whose requests arrive late (a new wave after the others went idle), KV-transfer
waits (a rank with requests and 0 tokens scheduled), long prompts that are
chunked, requests that end at ``max_model_len`` (where drafts are clamped),
k = 1..7 speculative tokens with per-verification acceptance, unequal loads,
many small requests.

On the V1 model runner (``runner="v1"``) the drafter is V1's EAGLE or MTP
``EagleProposer``, and requests near ``max_model_len`` start on either side
of the drafter fit check (``max_seq_len + k <= max_model_len``: a rank whose
batch fails it skips drafting while the others draft, vLLM bugs 40589 and
44185): their prompts end up to k + 1 tokens before the end, and such a
request runs to ``max_model_len``. The V2 lane's draws are unchanged by it.

Small by default: the lane costs about 1 ms per rank-iteration, so a rank
gets at most :data:`MAX_REQUESTS` requests arriving within
``max_iterations`` engine-loop iterations, each bounded so that a rank's work
fits in about that many iterations (a chunked prompt takes up to three
chunks, an output at most :data:`MAX_OUTPUT` tokens unless it runs to
``max_model_len``). Over 300 drawn streams, a rank's modelled scheduler
ran empty after 8-16 engine-loop iterations typically (arrivals included),
39 at most (six requests queued behind ``max_num_seqs`` 1, KV waits).
Every choice shrinks towards less: fewer ranks, fewer
requests, earlier arrivals, short prompts and outputs, no waits, no
speculator.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from dpsim.lanes.runner.stream import (
    EXECUTORS,
    EngineOptions,
    RankStream,
    RequestScript,
    speculators_of,
)

__all__ = [
    "MAX_ITERATIONS",
    "MAX_REQUESTS",
    "engine_options",
    "rank_streams",
    "workloads",
]

#: Engine-loop iterations within which a rank's requests arrive, by default.
MAX_ITERATIONS = 8
#: Requests per rank, at most.
MAX_REQUESTS = 6
#: Output tokens of a request that does not run to max_model_len, at most.
MAX_OUTPUT = 6
#: Iterations a request may wait for a remote KV transfer, at most.
MAX_KV_WAIT = 3
#: Largest k drawn (vLLM's practical range for AR and MTP drafters).
MAX_K = 7


def engine_options(
    *,
    speculators: tuple[str | None, ...] | None = None,
    async_scheduling: bool | None = None,
    runner: str = "v2",
) -> st.SearchStrategy[EngineOptions]:
    """Engine options: small budgets and model lengths so chunking and the
    ``max_model_len`` edge are reached in a few iterations.

    ``speculators`` limits the drafter drawn (None: none; by default none or
    any of ``runner``'s); ``async_scheduling`` fixes it when not None.
    """
    if speculators is None:
        speculators = (None, *speculators_of(runner))
    return _engine_options(speculators, async_scheduling)


@st.composite
def _engine_options(
    draw: Any, speculators: tuple[str | None, ...], fixed_async: bool | None
) -> EngineOptions:
    speculator = draw(st.sampled_from(speculators))
    k = 0 if speculator is None else draw(st.integers(1, MAX_K))
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max(max_num_seqs, k + 1, 8), 64))
    # At most three chunks for any prompt: a rank's work stays small.
    max_model_len = draw(st.integers(max(16, k + 3), min(96, 3 * budget + 1)))
    # A threshold of at most k cuts a request padded to 1 + k drafts, where
    # vLLM's scheduler asserts (the modelled scheduler refuses it): above k.
    threshold = draw(st.one_of(st.just(0), st.integers(k + 1, budget)))
    return EngineOptions(
        async_scheduling=(draw(st.booleans()) if fixed_async is None else fixed_async),
        dp_sync_interval=draw(st.sampled_from((16, 1, 2, 4, 8))),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        long_prefill_token_threshold=threshold,
        prefill_schedule_interval=draw(st.sampled_from((1, 2, 4))),
        speculator=speculator,
        num_speculative_tokens=k,
    )


def rank_streams(
    dp_size: int,
    options: EngineOptions,
    *,
    max_iterations: int = MAX_ITERATIONS,
    runner: str = "v2",
) -> st.SearchStrategy[tuple[RankStream, ...]]:
    """One stream per rank for ``options``; request ids are ``r<rank>-<n>``,
    unique across ranks."""
    near = _near_end(options, runner)
    return st.tuples(
        *(_rank_stream(rank, options, max_iterations, near) for rank in range(dp_size))
    )


def _near_end(options: EngineOptions, runner: str) -> int:
    """How many tokens before ``max_model_len`` a "near the end" prompt may
    end: 3 (a few outputs reach it), or on V1 up to k + 1, so the drafter fit
    check is drawn on both sides of its edge."""
    if runner == "v1":
        return max(3, options.num_speculative_tokens + 1)
    return 3


@st.composite
def _rank_stream(
    draw: Any, rank: int, options: EngineOptions, max_iterations: int, near: int
) -> RankStream:
    count = draw(st.integers(0, MAX_REQUESTS))
    arrivals = sorted(draw(st.integers(0, max_iterations - 1)) for _ in range(count))
    return RankStream(
        tuple(
            draw(_request(f"r{rank}-{index}", arrival, options, near))
            for index, arrival in enumerate(arrivals)
        )
    )


@st.composite
def _request(
    draw: Any, req_id: str, arrival: int, options: EngineOptions, near: int
) -> RequestScript:
    most = options.max_model_len - 1
    budget = options.max_num_batched_tokens
    kinds = [st.integers(1, min(8, most))]
    if budget < most:
        # Long enough to be chunked: up to three chunks.
        kinds.append(st.integers(budget + 1, min(3 * budget, most)))
    # Near max_model_len: a few output tokens reach it.
    kinds.append(st.integers(max(1, most - near), most))
    prompt_len = draw(st.one_of(kinds))
    room = options.max_model_len - prompt_len
    lengths = [st.integers(1, MAX_OUTPUT)]
    if room <= max(MAX_OUTPUT, near + 1):
        # Runs to max_model_len (check_stop ends it there, before max_tokens).
        lengths.append(st.integers(room, room + 2))
    output_len = draw(st.one_of(lengths))
    kv_wait = draw(st.one_of(st.just(0), st.integers(1, MAX_KV_WAIT)))
    k = options.num_speculative_tokens
    accepted: tuple[int, ...] = ()
    if k:
        accepted = tuple(draw(st.lists(st.integers(0, k), max_size=3)))
    return RequestScript(
        req_id=req_id,
        arrival=arrival,
        prompt_len=prompt_len,
        output_len=output_len,
        kv_wait=kv_wait,
        accepted=accepted,
    )


def workloads(
    *,
    min_ranks: int = 2,
    max_ranks: int = 4,
    max_iterations: int = MAX_ITERATIONS,
    options: st.SearchStrategy[EngineOptions] | None = None,
    runner: str = "v2",
) -> st.SearchStrategy[tuple[EngineOptions, tuple[RankStream, ...]]]:
    """Engine options with one stream per rank (``min_ranks..max_ranks``
    ranks, shrinking towards fewer) for ``runner``'s model runner."""
    return _workloads(
        min_ranks,
        max_ranks,
        max_iterations,
        options if options is not None else engine_options(runner=runner),
        runner,
    )


@st.composite
def _workloads(
    draw: Any,
    min_ranks: int,
    max_ranks: int,
    max_iterations: int,
    options_strategy: st.SearchStrategy[EngineOptions],
    runner: str,
) -> tuple[EngineOptions, tuple[RankStream, ...]]:
    dp_size = draw(st.integers(min_ranks, max_ranks))
    options = draw(options_strategy)
    streams = draw(
        rank_streams(dp_size, options, max_iterations=max_iterations, runner=runner)
    )
    # Drawn last: the streams do not depend on it, and the draws before it
    # stay those of the lane before the executor was an option.
    executor = draw(st.sampled_from(EXECUTORS))
    return replace(options, executor=executor), streams
