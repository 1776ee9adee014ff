"""Hypothesis strategies for V1-runner batches, in the two profiles.

A V1 batch is what one rank passes to ``_determine_batch_execution_and_padding``,
carried by the same :class:`~dpsim.records.case.RankBatch` as V2's (the V1
adapter maps it: ``uniform_token_count`` u is u tokens per request, else
``max_query_len`` is the first request and the rest is split evenly;
``need_eager`` is ``force_eager``, ``uniform_decode`` forces the uniform-decode
flag, ``allow_ubatching`` is ``allow_microbatching``).

``caller``   what the V1 runner's own callers pass: ``execute_model``'s uniform
             decodes of ``uniform_decode_query_len`` tokens, speculative
             decodes with fewer drafts on some requests, prefills and mixed
             batches (never forcing eager or the uniform flag), with the LoRA
             count of the batch, allowing microbatching as 0.12-0.27 always
             do, and from 0.28 (``_allow_microbatching``) refusing it on some
             batches of two or more prefills, one longer than a decode: a
             prefill may read a cached prefix that another request of the
             step is writing, which only the KV cache's state decides; an
             idle rank's ``execute_dummy_batch`` (``_dummy_run`` of
             one token through 0.18, of ``uniform_decode_query_len`` tokens
             from 0.19, one request, ``force_uniform_decode=True``, no LoRA);
             every rank's profile run (``_dummy_run(is_profile=True)``:
             ``force_eager``, requests split evenly, no forced flag).
             Cascade attention (``use_cascade_attn``, 0.12-0.31) is drawn
             per rank on the steps vLLM can pass it for (see below).
``contract`` every call the method's signature allows: any request split of
             any token count (none at all included), ``force_eager``, the uniform flag forced on
             batches it can describe, any LoRA count, microbatching allowed
             or not, and ``use_cascade_attn`` on any rank's batch where the
             method takes it (0.12+).

Encoder inputs (``num_encoder_reqs``, ``execute_model``'s count of scheduled
encoder inputs) are drawn where the caller takes them (0.13+). ``caller``: a
quarter of the drawn policies serve an encoder-decoder model
(``encoder_decoder``), whose prefills all bring their encoder input (vLLM
disables chunked prefill for them) and whose decodes none; the other
(decoder-only, possibly multimodal) policies have encoder inputs on any number
of a step's prefills. ``contract``: either policy flag, and any count up to
the batch's requests on any step. Token counts aim at the capture table's
edges, as for V2 (:mod:`dpsim.scenarios.generate`).

Cascade attention, ``caller``: from 0.12 to 0.31 ``execute_model`` passes
``use_cascade_attn=True`` when ``_compute_cascade_attn_prefix_lens`` finds a
common prefix the attention backend takes (0.12.0 ``gpu_model_runner.py``
2906-2926), unless ``model_config.disable_cascade_attn`` or microbatching
(``enable_dbo``, from 0.14 ``use_ubatching``) turns it off; 0.32 sets
``cascade_attn_enabled = False``. The only backend that takes a prefix,
FlashAttention's ``use_cascade_attention``, wants at least 8 requests and a
prefix of 256 cached tokens on every one of them, then weighs the kernels by
the model's heads and the GPU's SMs. The prefix is the KV cache's state and
the weighing the deployment's, neither of which a batch's shape decides, so
each rank's step of 8 or more requests draws the flag, and every other step
(fewer requests, dummy and profile runs, any step of a microbatching policy)
passes False. A deployment with ``disable_cascade_attn`` is the case where
every such draw is False.

Cascade attention, ``contract``: the method takes ``use_cascade_attn`` from
0.12 to 0.33 (0.32 keeps it, ignored, "for out-of-tree model runners"), and
its signature ties it to nothing else, so every rank's batch of half the
steps draws it, idle, forced-eager and microbatched batches included (as the
contract draws ``force_eager`` and the uniform flag on any batch); the other
half of the steps keep every rank's FULL graphs within reach, which one
cascading rank of many would almost always rule out. 0.11's modelled caller
takes no flag, and no contract case carries one there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

from hypothesis import strategies as st

from dpsim.capture.once import BOOLEANS, ints, sampled
from dpsim.records.case import RankBatch
from dpsim.records.policy import Capabilities, CapturePolicy
from dpsim.targets.buildable import BuildRules, rules_for
from dpsim.targets.load import Target
from dpsim.targets.v1.dispatcher import lora_capture_cases, lora_settings

from .generate import (
    _PALETTE_SIZES,
    KIND_MIXES,
    NEAR_REQUESTS,
    active_loras,
    anchors_of,
    counts_or_none,
    requests_near,
    token_counts,
    tokens_near,
)

#: The first release whose ``execute_dummy_batch`` runs ``uniform_decode_query_len``
#: tokens (0.12-0.18 run one token).
_DUMMY_OF_DECODE_LENGTH = (0, 19)
#: How ``execute_model`` passes the flag where cascade attention can be on
#: (0.11-0.31); 0.32 passes False and leaves ``cascade_attn_enabled`` off.
_CASCADE_CALL = "use_cascade_attn=cascade_attn_prefix_lens is not None"
#: FlashAttention's ``use_cascade_attention``: fewer requests never cascade.
CASCADE_MIN_REQUESTS = 8
#: The batch kinds ``execute_model`` computes a common prefix for.
_CASCADE_KINDS = frozenset({"decode", "varlen", "prefill", "mixed"})

BatchesOf = Callable[[st.DrawFn, int], list[RankBatch]]


@dataclass(frozen=True)
class V1CallerModel:
    """How one release's V1 runner turns a batch into the caller's arguments."""

    #: Whether an idle rank's dummy batch has ``uniform_decode_query_len``
    #: tokens (0.19+) rather than one.
    dummy_of_decode_length: bool
    #: Whether the caller takes an active-LoRA count (0.17+), not only has_lora.
    lora_counts: bool
    #: Whether the caller takes ``num_encoder_reqs`` (0.13+).
    encoder_inputs: bool = False
    #: Whether ``execute_model`` may refuse microbatching for a step that
    #: splits a prefix from its writer (``_allow_microbatching``, 0.28+).
    microbatch_veto: bool = False
    #: Whether ``execute_model`` may pass ``use_cascade_attn=True`` (0.12-0.31).
    cascade_attn: bool = False
    #: Whether the caller method takes ``use_cascade_attn`` at all (0.12+).
    takes_cascade_attn: bool = False

    @classmethod
    def of_version(
        cls,
        version: str | None,
        lora_counts: bool,
        encoder_inputs: bool = False,
        microbatch_veto: bool = False,
        cascade_attn: bool = False,
        takes_cascade_attn: bool = False,
    ) -> V1CallerModel:
        key = _version_key(version)
        return cls(
            dummy_of_decode_length=key is None or key >= _DUMMY_OF_DECODE_LENGTH,
            lora_counts=lora_counts,
            encoder_inputs=encoder_inputs,
            microbatch_veto=microbatch_veto,
            cascade_attn=cascade_attn,
            takes_cascade_attn=takes_cascade_attn,
        )


@dataclass(frozen=True)
class V1Generation:
    """What generating cases for one V1 target needs: its caller model, the
    table features its dispatcher has, and the release's build rules."""

    model: V1CallerModel
    capabilities: Capabilities
    rules: BuildRules
    #: Whether ``ParallelConfig.num_ubatches`` exists (0.14+); before it
    #: every microbatched step splits in two.
    any_ubatch_count: bool

    @classmethod
    def of(cls, target: Target) -> V1Generation:
        runner = target.source_text("v1/worker/gpu_model_runner.py") or ""
        sync = target.source_text("v1/worker/dp_utils.py") or ""
        compilation = target.compilation.__dict__.get("CompilationConfig")
        return cls(
            model=V1CallerModel.of_version(
                target.version,
                lora_counts="force_num_active_loras" in runner,
                encoder_inputs=target.api.has("num_encoder_reqs"),
                microbatch_veto="def _allow_microbatching(" in runner,
                cascade_attn=_CASCADE_CALL in runner and target.api.has("cascade_attn"),
                takes_cascade_attn=target.api.has("cascade_attn"),
            ),
            capabilities=Capabilities(
                has_lora=True, has_varlen_decode=False, has_microbatching=True
            ),
            rules=_v1_rules(rules_for(target.package_dir, compilation), target),
            any_ubatch_count="num_ubatches" in sync,
        )

    def fit(self, policy: CapturePolicy) -> CapturePolicy | None:
        """``policy`` as this release configures it (None: it refuses to):
        a capture ceiling only at the largest size, and two microbatches
        where the count is not configurable. (Capture sizes are rounded for
        speculative decoding where the release does, when its dispatcher is
        built: :mod:`dpsim.targets.v1.dispatcher`.)"""
        ceiling = policy.max_capture_size
        if ceiling is not None and ceiling != max(policy.capture_sizes, default=0):
            # CompilationConfig.post_init_cudagraph_sizes asserts they match,
            # and the dispatcher indexes its padding table by it.
            return None
        settings = policy.microbatching
        if settings is not None and not self.any_ubatch_count:
            policy = replace(policy, microbatching=replace(settings, num_ubatches=2))
        return policy

    def model_kind(
        self, draw: st.DrawFn, policy: CapturePolicy, profile: str
    ) -> CapturePolicy:
        """``policy`` for a drawn model: encoder-decoder for a quarter of the
        caller profile's policies and half the contract's, where the caller
        takes encoder inputs (before that the flag would change nothing)."""
        if not self.model.encoder_inputs or policy.encoder_decoder:
            return policy
        odds = ints(0, 3) if profile == "caller" else ints(0, 1)
        return replace(policy, encoder_decoder=draw(odds) == 0)

    def batches(self, policy: CapturePolicy, scenario: str, profile: str) -> BatchesOf:
        if profile == "caller":
            return caller_batches(self.model, policy, scenario)
        return contract_batches(self.model, policy, scenario)


def _v1_rules(rules: BuildRules, target: Target) -> BuildRules:
    """``rules`` with the V1 dispatcher's LoRA cases where the release has no
    V2 rule for them (before 0.24): without one, the caller profile drew no
    LoRA table at all, and the dispatcher's LoRA paths went unrun."""
    if rules.lora_capture_cases_fn is not None:
        return rules
    return replace(
        rules, lora_capture_cases_fn=lora_capture_cases(target.manager_class)
    )


def _version_key(version: str | None) -> tuple[int, int] | None:
    if version is None:
        return None  # a tree of unknown version: the newer behaviour
    major, minor, *_ = (int(part) for part in version.split(".")[:2] if part.isdigit())
    return major, minor


@functools.lru_cache(maxsize=512)
def caller_batches(
    model: V1CallerModel, policy: CapturePolicy, scenario: str
) -> BatchesOf:
    """One step's batches as the V1 runner's callers pass them."""
    tokens = token_counts(policy)
    loras = _loras(model, policy)
    query_len = policy.decode_query_len
    max_reqs = policy.max_num_seqs
    dummy_tokens = query_len if model.dummy_of_decode_length else 1
    encoder_decoder = policy.encoder_decoder
    multimodal = model.encoder_inputs and not encoder_decoder
    threshold = (
        policy.microbatching.decode_token_threshold if policy.microbatching else 0
    )
    # Without microbatching configured the veto returns True at once.
    veto = model.microbatch_veto and policy.microbatching is not None
    # Microbatching (DBO) turns cascade attention off in execute_model.
    cascade = model.cascade_attn and policy.microbatching is None
    # Decode graphs live at capture sizes whole decodes fill; sizes around
    # them and around the threshold are where padding and splitting flip.
    sizes = policy.capture_sizes
    landmarks = sorted({*sizes, *([threshold] if threshold else [])})
    anchors = anchors_of(tuple(landmarks), sizes)
    shorter_lengths = ints(1, query_len - 1) if query_len > 1 else None
    mix_choice = sampled(KIND_MIXES)

    def batch(
        lengths: list[int], kind: str, draw: st.DrawFn, encoders: int = 0
    ) -> RankBatch:
        equal = len(set(lengths)) == 1
        active = min(draw(loras), len(lengths)) if kind != "dummy" else 0
        return RankBatch(
            num_reqs=len(lengths),
            num_tokens=sum(lengths),
            uniform_token_count=lengths[0] if equal else None,
            max_query_len=max(lengths),
            num_active_loras=active,
            allow_ubatching=True,
            uniform_decode=kind == "dummy",
            num_encoder_reqs=encoders,
            kind=kind,
        )

    def requests_around(draw: st.DrawFn, anchor: int) -> int:
        near = requests_near(anchor, max_reqs, query_len)
        return draw(_requests_among(near, max_reqs))

    def one_rank(
        draw: st.DrawFn, kinds: tuple[str, ...], anchor: int
    ) -> tuple[RankBatch, int]:
        """A rank's batch and how many of its requests are prefills."""
        kind = draw(sampled(kinds))
        if kind == "dummy":
            return batch([dummy_tokens], kind, draw), 0
        if kind == "decode":
            return batch([query_len] * requests_around(draw, anchor), kind, draw), 0
        if kind == "varlen" and shorter_lengths is not None:
            reqs = requests_around(draw, anchor)
            short = draw(ints(1, reqs))
            shorter = draw(shorter_lengths)
            lengths = [query_len] * (reqs - short) + [shorter] * short
            return batch(lengths, kind, draw), 0
        total = draw(tokens_near(anchor, sizes))
        prefills = draw(ints(1, max(1, min(total, max_reqs))))
        lengths = split_evenly(total, prefills)
        prefill_count = len(lengths)
        # No chunked prefill for encoder-decoder models: every prefill
        # brings its encoder input.
        encoders = prefill_count if model.encoder_inputs and encoder_decoder else 0
        longest_prefill = lengths[-1]
        if kind == "mixed":
            decodes = draw(ints(0, max(0, max_reqs - prefills)))
            lengths = [query_len] * decodes + lengths
        kind = "prefill" if kind == "varlen" else kind
        drawn = batch(lengths, kind, draw, encoders)
        if (
            veto
            and prefill_count > 1
            and longest_prefill > query_len
            and draw(BOOLEANS)
        ):
            # A reader (longer than a decode, on a cached prefix) and its
            # writer in one step: the veto settles it for every rank.
            drawn = replace(drawn, allow_ubatching=False)
        return drawn, prefill_count

    def profile_step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        # Every rank profiles the same batch: _dummy_run(is_profile=True).
        total = draw(tokens)
        lengths = split_evenly(total, min(total, max_reqs))
        profile = replace(
            batch(lengths, "profile", draw),
            need_eager=True,
            num_active_loras=0,
            uniform_token_count=None,
        )
        return [profile] * dp_size

    def step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        kinds = draw(mix_choice)
        anchor = draw(anchors)
        palette = [one_rank(draw, kinds, anchor) for _ in range(draw(_PALETTE_SIZES))]
        pick = st.sampled_from(palette)  # one strategy for every rank's draw
        picked = [draw(pick) for _ in range(dp_size)]
        batches = [entry for entry, _ in picked]
        if multimodal:
            # Drawn last, so the step's shape is drawn as before encoder
            # inputs were: how many of a multimodal model's prefills bring
            # one (ranks given the same batch keep sharing it).
            with_inputs = {
                id(entry): replace(entry, num_encoder_reqs=draw(ints(0, count)))
                for entry, count in palette
                if count
            }
            batches = [with_inputs.get(id(entry), entry) for entry in batches]
        if cascade:
            # Per rank, drawn last: ranks given the same batch may differ in
            # their KV caches' common prefix.
            batches = [
                replace(entry, cascade_attn=True)
                if cascades(entry) and draw(BOOLEANS)
                else entry
                for entry in batches
            ]
        if all(rank.kind == "dummy" for rank in batches):
            # With no work on any rank the engine does not step at all.
            batches[0] = batch([query_len], "decode", draw)
        return batches

    return profile_step if scenario == "profile" else step


@functools.lru_cache(maxsize=512)
def contract_batches(
    model: V1CallerModel, policy: CapturePolicy, scenario: str
) -> BatchesOf:
    """One step's batches as the caller method's signature allows them."""
    counts = counts_or_none(policy.capture_sizes)
    loras = _loras(model, policy)
    query_len = policy.decode_query_len
    max_reqs = policy.max_num_seqs

    def one_rank(draw: st.DrawFn) -> RankBatch:
        total = draw(counts)
        if total == 0:
            # Nothing scheduled: execute_model returns before the method, but
            # its signature takes it, and a sync must not hang on it.
            return RankBatch(
                num_reqs=0,
                num_tokens=0,
                need_eager=scenario == "profile" or draw(BOOLEANS),
                allow_ubatching=draw(BOOLEANS),
                kind="idle",
            )
        reqs = draw(ints(1, max(1, min(total, max_reqs))))
        uniform: int | None = None
        longest = draw(ints(-(-total // reqs), total - (reqs - 1)))
        if total % reqs == 0 and draw(BOOLEANS):
            uniform = longest = total // reqs
        # The uniform flag is forced only where it describes the batch: whole
        # decodes of the decode length, or one shorter request (a dummy run).
        describable = longest == query_len and total == query_len * reqs
        describable = describable or (reqs == 1 and total <= query_len)
        return RankBatch(
            num_reqs=reqs,
            num_tokens=total,
            uniform_token_count=uniform,
            max_query_len=longest,
            need_eager=scenario == "profile" or draw(BOOLEANS),
            num_active_loras=draw(loras),
            allow_ubatching=draw(BOOLEANS),
            uniform_decode=describable and draw(BOOLEANS),
            num_encoder_reqs=draw(ints(0, reqs)) if model.encoder_inputs else 0,
        )

    def step(draw: st.DrawFn, dp_size: int) -> list[RankBatch]:
        palette = [one_rank(draw) for _ in range(draw(_PALETTE_SIZES))]
        pick = st.sampled_from(palette)  # one strategy for every rank's draw
        batches = [draw(pick) for _ in range(dp_size)]
        if model.takes_cascade_attn and draw(BOOLEANS):
            # Per rank, drawn last: ranks given the same batch may differ.
            batches = [
                replace(entry, cascade_attn=True) if draw(BOOLEANS) else entry
                for entry in batches
            ]
        return batches

    return step


@functools.lru_cache(maxsize=4096)
def _requests_among(near: tuple[int, ...], max_reqs: int) -> st.SearchStrategy[int]:
    # Cached by value, not per policy: see dpsim.scenarios.generate.
    return st.one_of(NEAR_REQUESTS(near), ints(1, max_reqs))


def _loras(model: V1CallerModel, policy: CapturePolicy) -> st.SearchStrategy[int]:
    """Active LoRA counts: none without LoRA, at most the ``max_loras`` the
    table's LoRA cases come from; before 0.17 the caller passes only whether
    any is active, so 0 or 1 say all there is to say."""
    settings = lora_settings(policy.lora_capture_cases)
    if settings is None:
        return st.just(0)
    # At most max_loras adapters are active in a batch.
    most = settings[0]
    return active_loras(policy, most) if model.lora_counts else ints(0, min(most, 1))


def cascades(batch: RankBatch) -> bool:
    """Whether ``execute_model`` can pass ``use_cascade_attn=True`` for
    ``batch`` where the release and config allow it: a scheduled batch (not
    a dummy or profile run, which pass False) of enough requests."""
    return batch.kind in _CASCADE_KINDS and batch.num_reqs >= CASCADE_MIN_REQUESTS


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` tokens over ``parts`` requests, the remainder on the last one,
    as ``_dummy_run`` splits them."""
    parts = max(1, min(parts, total))
    base, extra = divmod(total, parts)
    return [base] * (parts - 1) + [base + extra]
