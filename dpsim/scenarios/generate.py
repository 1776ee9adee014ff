"""Hypothesis strategies for cases, in two profiles.

``caller``   what vLLM's own model runner passes, under tables the release's
             own config code builds (:mod:`dpsim.targets.buildable`): batches
             built from requests
             (decodes of ``decode_query_len`` tokens, speculative decodes with
             fewer drafts on some requests, prefills, mixes), idle
             ranks running the dummy batch vLLM gives them (with the LoRA
             count vLLM gives a dummy batch), the uniform count
             from the version's own helper where dpsim loads it, and the
             query-length bound dropped for prefills where that version's
             model runner drops it.
``contract`` everything the function's documented contract allows, under
             any valid table (LoRA cases without 0, thresholds of 0): 0-token
             ranks, any consistent uniform count, any query-length bound,
             need_eager / microbatching / skip-draft votes on any subset.

Token counts aim at the edges of the capture table (0, 1, each capture size
and one either side, above the largest), where padding decisions flip.
Strategies shrink towards the smallest case: 2 ranks, one step, decodes of
one request, the simplest policy.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from dpsim.capture import strategies as policy_strategies
from dpsim.capture.once import BOOLEANS, ints, sampled
from dpsim.errors import UsageError
from dpsim.records.case import PROFILES, Case, RankBatch
from dpsim.records.policy import (
    Capabilities,
    CapturePolicy,
    CudagraphMode,
    Microbatching,
)
from dpsim.targets.buildable import BuildRules, rules_of
from dpsim.targets.load import Target

from .programs import SCENARIOS
from .reuse_calls import reuse_calls
from .steer import bound_straddles

DEFAULT_RANKS = (2, 16)


@contextlib.contextmanager
def seeded_draws_only() -> Iterator[None]:
    """Make a seed alone decide the cases drawn, whatever else is loaded.

    Hypothesis occasionally draws constants harvested from the source of every
    local module imported so far: the user's scripts and tests, dpsim itself,
    the vLLM files dpsim loads, each mutant under test. Which of those a
    process has loaded then changes the cases a seed gives, so a check's
    counterexample differed between the command line, pytest and a mutation
    worker, and two mutants saw different cases. Inside this block the
    harvested pool is empty; Hypothesis's own built-in constants still apply.
    Harmless where that internal is absent (other Hypothesis versions).
    """
    from hypothesis.internal.conjecture import providers

    harvest = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if harvest is None or cache is None or not hasattr(providers, "Constants"):
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = harvest
        cache.cache.clear()


@dataclass(frozen=True)
class CallerModel:
    """How one version's model runner turns a batch into sync inputs."""

    features: frozenset[str]
    #: The version's own ``get_uniform_token_count(num_reqs, num_tokens,
    #: max_query_len)``, when its cudagraph_utils defines it (0.18-0.27).
    uniform_helper: Callable[[int, int, int], Any] | None
    #: 0.33's model runner passes ``max_query_len=None`` for batches with a prefill.
    drops_query_bound_on_prefill: bool
    #: What the release's config code builds, and the LoRA count of its dummy batch.
    rules: BuildRules

    @classmethod
    def of(cls, target: Target) -> CallerModel:
        runner = target.source_text("v1/worker/gpu/model_runner.py") or ""
        helper = target.cudagraph_utils.__dict__.get("get_uniform_token_count")
        return cls(
            features=frozenset(target.api.features),
            uniform_helper=helper if callable(helper) else None,
            drops_query_bound_on_prefill="max_query_len = None" in runner,
            rules=rules_of(target),
        )

    def uniform(self, lengths: list[int], has_prefill: bool) -> int | None:
        if self.uniform_helper is not None:
            value = self.uniform_helper(len(lengths), sum(lengths), max(lengths))
            return None if value is None else int(value)
        # 0.28+: get_uniform_decode_token_count: equal lengths, and no prefill.
        if not has_prefill and len(set(lengths)) == 1:
            return lengths[0]
        return None


def scenarios_for(target: Target) -> tuple[str, ...]:
    """The scenarios this version's API can run. The V1 runner's are ``step``,
    ``profile`` and ``ubatch`` (every V1 release microbatches with DBO); no
    ``drafter``: dpsim does not model V1's speculators."""
    if target.runner == "v1":
        return tuple(name for name in SCENARIOS if name != "drafter")
    supported = ["step", "drafter", "profile"]
    if target.api.has("allow_ubatching"):
        supported.append("ubatch")
    if (
        not target.api.has("need_eager")
        and target.api.entry != "sync_cudagraph_and_dp_padding"
    ):
        supported.remove("profile")
    return tuple(name for name in SCENARIOS if name in supported)


def token_counts(policy: CapturePolicy) -> st.SearchStrategy[int]:
    """Positive token counts, mostly at capture-table edges."""
    return _token_counts(policy.capture_sizes)


# The batch strategies below are cached by the values they are built from,
# not per policy: a search keeps drawing new policies (Hypothesis' engine
# for about one case in three), and a strategy object's first draw costs
# several draws (see
# dpsim.capture.once), while many policies share a table, an anchor or a
# request bound. Where a one_of is still new (a new anchor or bound), its
# branches come from caches, so only the one_of itself is worked out anew.
# Each branch position has its own cache (the _Branches below), never one
# shared with another position: a one_of drops a branch object it already
# has (by identity), so two equal lists sharing one object would change its
# branches, and so its choices.
@functools.lru_cache(maxsize=1024)
def _token_counts(capture_sizes: tuple[int, ...]) -> st.SearchStrategy[int]:
    largest = max(capture_sizes, default=8)
    edges = [*_edges_of(capture_sizes), largest + 1]
    return st.one_of(st.sampled_from(edges), ints(1, 2 * largest + 2))


@functools.lru_cache(maxsize=1024)
def anchors_of(
    landmarks: tuple[int, ...], capture_sizes: tuple[int, ...]
) -> st.SearchStrategy[int]:
    """A step's anchor: one of ``landmarks`` (sorted) or a token count."""
    tokens = _token_counts(capture_sizes)
    return st.one_of(st.sampled_from(landmarks), tokens) if landmarks else tokens


@functools.lru_cache(maxsize=4096)
def tokens_near(anchor: int, capture_sizes: tuple[int, ...]) -> st.SearchStrategy[int]:
    """Token counts around ``anchor``, else anywhere on the table's edges."""
    return st.one_of(_NEAR_TOKENS(tuple(_near(anchor))), _token_counts(capture_sizes))


def cases(
    target: Target,
    *,
    scenario: str,
    profile: str,
    ranks: tuple[int, int] = DEFAULT_RANKS,
    policy: CapturePolicy | None = None,
    max_steps: int = 2,
) -> st.SearchStrategy[Case]:
    """Cases for ``scenario`` on ``target``, drawn as ``profile`` allows."""
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    if scenario not in scenarios_for(target):
        raise UsageError(f"{target.label} cannot run the {scenario!r} scenario")
    low, high = ranks
    if not 1 <= low <= high:
        raise UsageError(f"bad rank range {low}..{high}")
    if target.runner == "v1":
        # Imported here: the V1 strategies build on this module's helpers.
        from .generate_v1 import V1Generation

        v1: V1Generation | None = V1Generation.of(target)
    else:
        v1 = None
    model = CallerModel.of(target) if v1 is None else None
    capabilities = Capabilities.of_target(target) if v1 is None else v1.capabilities
    rules = model.rules if model is not None else v1.rules if v1 else None
    policies = (
        st.just(policy)
        if policy is not None
        else policy_strategies.policies(
            capabilities,
            with_drafter=scenario == "drafter",
            rules=rules if profile == "caller" else None,
        )
    )
    fit_rules = rules if profile == "caller" else None

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        chosen = _fit_policy(draw, draw(policies), scenario, profile, fit_rules)
        dp_size = draw(ints(low, high))
        steps = draw(ints(1, max_steps))
        if v1 is not None:
            fitted = v1.fit(chosen)
            assume(fitted is not None)  # a table this release refuses to build
            assert fitted is not None
            chosen = (
                fitted if policy is not None else v1.model_kind(draw, fitted, profile)
            )
            batch = v1.batches(chosen, scenario, profile)
        elif profile == "caller":
            batch = _caller_batches(model, chosen, scenario)
        else:
            batch = _contract_batches(model, chosen, scenario)
        # The contract's drafter prefills pass their own request count, bound
        # and LoRA count beside the agreement they reuse (V1 has no drafter).
        reusing = (
            reuse_calls(chosen, model.features, active_loras(chosen.drafter or chosen))
            if scenario == "drafter" and profile == "contract" and model is not None
            else None
        )
        drawn = []
        for _ in range(steps):
            step = batch(draw, dp_size)
            drawn.append(tuple(step))
        return Case(
            scenario=scenario,
            profile=profile,
            policy=chosen,
            steps=tuple(drawn),
            num_speculative_steps=(
                chosen.decode_query_len - 1 if scenario == "drafter" else 0
            ),
            reuse_calls=(
                tuple(reusing(draw, step) for step in drawn) if reusing else ()
            ),
        )

    return draw_case()


def _fit_policy(
    draw: st.DrawFn,
    policy: CapturePolicy,
    scenario: str,
    profile: str,
    rules: BuildRules | None = None,
) -> CapturePolicy:
    """Give the scenario what it needs: a drafter's decode length, microbatching.

    vLLM's speculators build their managers from the target's own config, so
    under the caller profile a drafter table shares the target's request
    capacity (its sizes and mode may still differ, as the reuse path allows).
    Microbatching added here obeys ``rules`` (the caller profile's release).
    """
    if profile == "caller" and policy.drafter is not None:
        drafter = replace(policy.drafter, max_num_seqs=policy.max_num_seqs)
        if rules is not None:
            # Nor do they give a drafter LoRA cases or microbatched graphs.
            drafter = rules.drafter_table(drafter)
        policy = replace(policy, drafter=drafter)
    if scenario == "drafter" and policy.decode_query_len < 2:
        policy = replace(policy, decode_query_len=draw(ints(2, 8)))
    # Microbatched graphs are FULL graphs: most ubatch cases should have some
    # to choose from (the others still test eager splits).
    if (
        scenario == "ubatch"
        and policy.cudagraph_mode in (CudagraphMode.NONE, CudagraphMode.PIECEWISE)
        and draw(BOOLEANS)
    ):
        policy = replace(policy, cudagraph_mode=draw(sampled(FULL_CAPABLE_MODES)))
    if scenario == "ubatch" and policy.microbatching is None:
        # Thresholds at the table's edges, where the batches are drawn: a
        # threshold far above every batch would never microbatch at all.
        thresholds = sampled((0, *_edge_values(policy)))
        settings = Microbatching(
            num_ubatches=draw(ints(2, 3)),
            decode_token_threshold=draw(thresholds),
            prefill_token_threshold=draw(thresholds),
        )
        if rules is not None:
            settings = rules.fit_thresholds(settings)
        policy = replace(policy, microbatching=settings)
    return policy


#: Draws one step's batches for ``dp_size`` ranks. Plain functions of the
#: outer ``draw``, not composite strategies: Hypothesis inspects a composite's
#: source each time one is built, which cost half of a check's time.
BatchesOf = Callable[[st.DrawFn, int], list[RankBatch]]


@functools.lru_cache(maxsize=512)
def _caller_batches(
    model: CallerModel, policy: CapturePolicy, scenario: str
) -> BatchesOf:
    query_len = policy.decode_query_len
    max_reqs = policy.max_num_seqs
    # What this release's call takes, asked once per table, not per batch.
    takes_loras, takes_query_bound, takes_need_eager, takes_skip_drafts = (
        name in model.features
        for name in (
            "num_active_loras",
            "max_query_len",
            "need_eager",
            "allow_skip_drafts",
        )
    )
    allow_ubatching = (
        "allow_ubatching" in model.features and policy.microbatching is not None
    )
    marks_uniform_decode = "uniform_decode" in model.features
    sizes = policy.capture_sizes
    tokens = token_counts(policy)
    # Batches are sized around an anchor: a capture size, where padding
    # flips, or a microbatching threshold, where splitting does.
    anchors = anchors_of(tuple(sorted({*sizes, *_thresholds(policy)})), sizes)
    max_loras, dummy_loras = _lora_counts(model.rules, policy.lora_capture_cases)
    loras = active_loras(policy, max_loras)
    decode_threshold = (
        policy.microbatching.decode_token_threshold if policy.microbatching else 0
    )

    def real_loras(draw: st.DrawFn, num_reqs: int) -> int:
        # Each active adapter serves at least one of the batch's requests.
        return min(draw(loras), num_reqs) if takes_loras else 0

    decode_requests = _decode_requests(sizes, max_reqs, query_len)

    def finish(
        lengths: list[int], has_prefill: bool, kind: str, draw: st.DrawFn
    ) -> RankBatch:
        uniform = model.uniform(lengths, has_prefill)
        bound: int | None = max(lengths)
        if has_prefill and model.drops_query_bound_on_prefill:
            bound = None
        dummy = kind == "dummy"
        active = 0
        if takes_loras:
            active = (
                dummy_loras
                if kind in ("dummy", "profile")
                else real_loras(draw, len(lengths))
            )
        return RankBatch(
            num_reqs=len(lengths),
            num_tokens=sum(lengths),
            uniform_token_count=uniform,
            max_query_len=bound if takes_query_bound else None,
            # Encoder-decoder steps with encoder inputs skip graphs on that rank.
            need_eager=(
                draw(_ONE_IN_FOUR) if takes_need_eager and not dummy else False
            ),
            num_active_loras=active,
            allow_ubatching=allow_ubatching,
            uniform_decode=marks_uniform_decode and uniform == query_len,
            allow_skip_drafts=(
                draw(BOOLEANS) if takes_skip_drafts and not dummy else False
            ),
            kind=kind,
        )

    # Microbatched graphs serve only steps where every rank runs a uniform
    # decode near one graph's size; the ubatch scenario draws such steps on
    # purpose, since mixed palettes all but never produce one.
    mixes = KIND_MIXES
    if policy.microbatching is not None:
        # Half of a ubatch scenario's steps; one mix in five elsewhere.
        splits = len(KIND_MIXES) if scenario == "ubatch" else 1
        mixes = (*mixes, *[SPLIT] * splits)
    # A microbatched decode graph is captured only at sizes the threshold
    # admits and that whole decodes of at most max_num_seqs requests fill.
    graph_sizes = [
        size
        for size in policy.capture_sizes
        if decode_threshold <= size <= max_reqs * query_len
    ] or list(policy.capture_sizes)
    # Drawn alone, never as a one_of's branch: shared objects are safe here.
    split_anchors = sampled(tuple(graph_sizes)) if graph_sizes else anchors
    shorter_lengths = ints(1, query_len - 1) if query_len > 1 else None
    mix_choice = sampled(mixes)
    kind_choices = {kinds: sampled(kinds) for kinds in mixes}

    def one_rank(draw: st.DrawFn, kinds: tuple[str, ...], anchor: int) -> RankBatch:
        kind = draw(kind_choices[kinds])
        if kind == "dummy":
            # An idle rank runs vLLM's dummy batch: one request of one decode.
            return finish([query_len], False, kind, draw)
        if kind == "split":
            # A uniform decode that a microbatched graph of ``anchor`` tokens
            # serves: at least half of it (vLLM keeps the graph only while
            # twice the smallest rank reaches it) and at least the threshold.
            # Decode graphs are captured at sizes rounded up to whole requests.
            graph = -(-anchor // query_len) * query_len
            least = max(1, -(-graph // 2), decode_threshold)
            low = min(max_reqs, -(-least // query_len))
            high = max(low, min(max_reqs, graph // query_len))
            reqs = draw(ints(low, high))
            return finish([query_len] * reqs, False, "decode", draw)
        if kind == "varlen" and shorter_lengths is not None:
            # Speculative decodes whose requests got fewer drafts than the
            # most: 1..q tokens each, so ranks differ in the query-length
            # bound that varlen decode graphs are chosen by.
            reqs = draw(decode_requests)
            shorter = draw(shorter_lengths)
            short = draw(ints(1, reqs))
            lengths = [query_len] * (reqs - short) + [shorter] * short
            return finish(lengths, False, kind, draw)
        if kind in ("decode", "varlen"):
            reqs = draw(_decodes_near(anchor, sizes, max_reqs, query_len))
            return finish([query_len] * reqs, False, "decode", draw)
        total = draw(tokens_near(anchor, sizes))
        prefills = draw(ints(1, max(1, min(total, max_reqs))))
        lengths = _split(total, prefills)
        if kind == "mixed":
            decodes = draw(ints(0, max(0, max_reqs - prefills)))
            lengths = [query_len] * decodes + lengths
        return finish(lengths, True, kind, draw)

    def profile_step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        # Every rank profiles the same dummy batch, eager, with no manager.
        total = draw(tokens)
        lengths = _split(total, min(total, max_reqs))
        batch = replace(finish(lengths, False, "profile", draw), need_eager=True)
        return [batch] * dp_size

    def step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        # Swarm testing: each step allows a few kinds of batch, so that steps
        # where every rank decodes (where microbatched graphs live) are common.
        # Ranks take their batch from a palette of one to three shapes sized
        # around one anchor, often a capture size, so the relations between
        # ranks that padding decisions hinge on (max vs min, half a graph)
        # come up at any DP size.
        kinds = draw(mix_choice)
        anchor = draw(split_anchors if kinds == SPLIT else anchors)
        palette = [one_rank(draw, kinds, anchor) for _ in range(draw(_PALETTE_SIZES))]
        pick = st.sampled_from(palette)  # one strategy for every rank's draw
        batches = [draw(pick) for _ in range(dp_size)]
        if all(batch.kind == "dummy" for batch in batches):
            # With no work anywhere vLLM does not step at all.
            # That rank's batch is real work, with its own LoRA count.
            work = batches[0]
            batches[0] = replace(
                work, kind="decode", num_active_loras=real_loras(draw, work.num_reqs)
            )
        return batches

    return profile_step if scenario == "profile" else step


@functools.lru_cache(maxsize=256)
def _lora_counts(
    rules: BuildRules, cases: tuple[int, ...] | None
) -> tuple[int | None, int]:
    """The ``max_loras`` a table's LoRA cases come from, and the LoRA count
    vLLM's dummy and profile runs pass (their own, not a draw), by the
    cases: few cases recur across tables, and each new table asked the
    release's helpers for up to 64 LoRA configurations twice."""
    return rules.max_loras(cases), rules.dummy_batch_loras(cases)


@functools.lru_cache(maxsize=512)
def _contract_batches(
    model: CallerModel, policy: CapturePolicy, scenario: str
) -> BatchesOf:
    query_len = policy.decode_query_len
    max_reqs = policy.max_num_seqs
    has = model.features.__contains__
    counts = counts_or_none(policy.capture_sizes)
    loras = active_loras(policy)

    def one_rank(draw: st.DrawFn) -> RankBatch:
        tokens = draw(counts)
        uniform: int | None = None
        bound: int | None = None
        reqs = 0
        if tokens:
            divisors = tuple(
                u for u in range(1, 9) if tokens % u == 0 and tokens // u <= max_reqs
            )
            uniform = draw(_uniforms(divisors)) if divisors else None
            if uniform is not None:
                reqs = tokens // uniform
            else:
                reqs = draw(ints(1, max(1, min(tokens, max_reqs))))
            if has("max_query_len"):
                least = uniform or -(-tokens // reqs)
                bound = draw(_bounds(query_len, least, max(least, tokens)))
        profile_run = scenario == "profile"
        return RankBatch(
            num_reqs=reqs,
            num_tokens=tokens,
            uniform_token_count=uniform,
            max_query_len=bound,
            need_eager=profile_run or (has("need_eager") and draw(BOOLEANS)),
            num_active_loras=draw(loras) if has("num_active_loras") else 0,
            allow_ubatching=has("allow_ubatching") and draw(BOOLEANS),
            uniform_decode=has("uniform_decode") and uniform == query_len,
            allow_skip_drafts=has("allow_skip_drafts") and draw(BOOLEANS),
            kind="idle" if tokens == 0 else "batch",
        )

    straddle = (
        bound_straddles(policy, model.features, loras)
        if scenario != "profile"
        else None
    )

    def step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        if straddle is not None and draw(BOOLEANS):
            # Half the steps on tables with varlen decode graphs: ranks on
            # both sides of the decode length (see dpsim.scenarios.steer).
            return straddle(draw, dp_size)
        # As for callers: ranks share a palette of a few shapes (see above).
        palette = [one_rank(draw) for _ in range(draw(_PALETTE_SIZES))]
        pick = st.sampled_from(palette)  # one strategy for every rank's draw
        return [draw(pick) for _ in range(dp_size)]

    return step


@functools.lru_cache(maxsize=1024)
def _decode_requests(
    capture_sizes: tuple[int, ...], max_reqs: int, query_len: int
) -> st.SearchStrategy[int]:
    """Request counts whose decodes reach the table's edges, or any count."""
    edges = _edges_of(capture_sizes)
    reach = sorted({max(1, min(max_reqs, -(-t // query_len))) for t in edges})
    return st.one_of(st.sampled_from(reach), ints(1, max_reqs))


@functools.lru_cache(maxsize=4096)
def _decodes_near(
    anchor: int, capture_sizes: tuple[int, ...], max_reqs: int, query_len: int
) -> st.SearchStrategy[int]:
    # Cached by anchor too: a decode rank asks for it every time, and most
    # anchors recur (capture sizes), so the near counts need not be redone.
    near = requests_near(anchor, max_reqs, query_len)
    return _decodes_among(near, capture_sizes, max_reqs, query_len)


@functools.lru_cache(maxsize=4096)
def _decodes_among(
    near: tuple[int, ...], capture_sizes: tuple[int, ...], max_reqs: int, query_len: int
) -> st.SearchStrategy[int]:
    return st.one_of(
        NEAR_REQUESTS(near), _decode_requests(capture_sizes, max_reqs, query_len)
    )


def requests_near(anchor: int, max_reqs: int, query_len: int) -> tuple[int, ...]:
    """Request counts (sorted) whose decodes come to about ``anchor`` tokens."""
    near = {max(1, min(max_reqs, value // query_len)) for value in _near(anchor)}
    return tuple(sorted(near))


@functools.lru_cache(maxsize=1024)
def counts_or_none(capture_sizes: tuple[int, ...]) -> st.SearchStrategy[int]:
    """Token counts at the table's edges, or none at all (an idle rank)."""
    return st.one_of(_token_counts(capture_sizes), st.just(0))


@functools.lru_cache(maxsize=1024)
def _uniforms(divisors: tuple[int, ...]) -> st.SearchStrategy[int | None]:
    return st.one_of(st.none(), st.sampled_from(divisors))


def _bounds(query_len: int, least: int, most: int) -> st.SearchStrategy[int | None]:
    # Bounds at the decode length and one either side, where a varlen
    # decode graph (captured for bounds up to it) stops serving a rank:
    # ranks on both sides of it are where the agreed bound matters.
    edges = sorted(
        {
            value
            for value in (query_len - 1, query_len, query_len + 1, least)
            if least <= value <= most
        }
    )
    return _bounds_among(tuple(edges), least, most)


@functools.lru_cache(maxsize=8192)
def _bounds_among(
    edges: tuple[int, ...], least: int, most: int
) -> st.SearchStrategy[int | None]:
    return st.one_of(_NO_BOUND, _BOUND_EDGES(edges), ints(least, most))


class _Branches:
    """``st.sampled_from(values)`` for one branch position of one kind of
    one_of, one object per tuple of values (see above: never shared with
    another position)."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, ...], st.SearchStrategy[int]] = {}

    def __call__(self, values: tuple[int, ...]) -> st.SearchStrategy[int]:
        built = self._built.get(values)
        if built is None:
            if len(self._built) >= 8192:
                self._built.clear()
            built = self._built[values] = st.sampled_from(values)
        return built


_NEAR_TOKENS = _Branches()
NEAR_REQUESTS = _Branches()
_BOUND_EDGES = _Branches()
#: The bounds' "no bound" branch.
_NO_BOUND = st.none()


def active_loras(
    policy: CapturePolicy, max_loras: int | None = None
) -> st.SearchStrategy[int]:
    """Active LoRA counts: at most ``max_loras`` adapters are active in a
    batch; without it (the contract), any count up to the largest case."""
    if max_loras is not None:
        return ints(0, max_loras)
    cases = policy.lora_capture_cases or (0,)
    return ints(0, max(cases))


#: How many shapes a step's palette has.
_PALETTE_SIZES = ints(1, 3)
#: True one time in four (a caller batch's need_eager).
_ONE_IN_FOUR = st.sampled_from((False, False, False, True))

#: Which kinds of batch one step may mix (swarm testing); simplest first.
KIND_MIXES: tuple[tuple[str, ...], ...] = (
    ("decode",),
    ("decode", "dummy"),
    ("decode", "varlen"),
    ("decode", "dummy", "mixed", "prefill"),
    ("prefill", "mixed"),
)


def _thresholds(policy: CapturePolicy) -> tuple[int, ...]:
    """The positive microbatching thresholds, which the smallest rank must reach."""
    settings = policy.microbatching
    if settings is None:
        return ()
    values = (settings.decode_token_threshold, settings.prefill_token_threshold)
    return tuple(value for value in values if value > 0)


FULL_CAPABLE_MODES = (
    CudagraphMode.FULL,
    CudagraphMode.FULL_DECODE_ONLY,
    CudagraphMode.FULL_AND_PIECEWISE,
)

#: Every rank a uniform decode that one microbatched graph can serve.
SPLIT = ("split",)


def _near(anchor: int) -> list[int]:
    """Sizes whose relation to ``anchor`` flips padding and microbatching decisions."""
    half = anchor // 2
    return sorted(
        {
            value
            for value in (anchor, anchor - 1, anchor + 1, half, half + 1)
            if value > 0
        }
    )


def _edge_values(policy: CapturePolicy) -> list[int]:
    """1, each capture size and one either side, and the same around half of
    each size, where a microbatched split of that size changes hands."""
    return list(_edges_of(policy.capture_sizes))


@functools.lru_cache(maxsize=1024)
def _edges_of(capture_sizes: tuple[int, ...]) -> tuple[int, ...]:
    values = {1}
    for size in capture_sizes:
        half = size // 2
        values.update((size - 1, size, size + 1, half - 1, half, half + 1))
    return tuple(sorted(value for value in values if value > 0))


def _split(total: int, parts: int) -> list[int]:
    """``total`` tokens over ``parts`` requests, the remainder on the last ones."""
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base] * (parts - extra) + [base + 1] * extra
