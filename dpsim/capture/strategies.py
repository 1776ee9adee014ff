"""Hypothesis strategies for capture policies.

Two families, because they answer different questions. *Realistic* policies
look like what vLLM computes or what operators write (the default grid,
powers of two, step-8/16 lists, typical max_num_seqs, spec decode 1..8), so a
failure there is a production bug. *Adversarial* policies are still valid but
odd (a single size 96, sizes beyond max_num_seqs x decode length, a
max_capture_size below the largest size, LoRA cases without 0, a drafter table
unlike the target's, microbatching thresholds near zero), so a failure there
is a contract bug that real configurations merely have not hit yet.

Given a release's :class:`~dpsim.targets.buildable.BuildRules` (the caller
profile), both families stay inside what that release's own config code
builds: LoRA cases come from its ``get_lora_capture_cases``, microbatching
thresholds are lifted to what its ``ParallelConfig`` accepts, and a capture
ceiling its ``CompilationConfig`` would refuse is left to default. Without
rules (the contract profile) every valid table may be drawn.

Every strategy takes :class:`~dpsim.records.policy.Capabilities` so a version
is only given features it has. Shrinking is designed in: every choice lists
its simplest option first (``sampled_from`` and ``one_of`` shrink towards
their first element, integers towards their lower bound), so a failing
example shrinks to something like ``capture_sizes=[1], cudagraph_mode=FULL``.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import strategies as st

from dpsim.records.policy import (
    ALL_CAPABILITIES,
    Capabilities,
    CapturePolicy,
    CudagraphMode,
    Microbatching,
    vllm_default_max_capture_size,
    vllm_default_sizes,
)
from dpsim.targets.buildable import BuildRules

from .once import BOOLEANS, ints

__all__ = [
    "MODES_SIMPLEST_FIRST",
    "adversarial_policies",
    "policies",
    "realistic_policies",
    "realistic_sizes",
]

#: FULL first: one descriptor per size, the easiest table to read.
MODES_SIMPLEST_FIRST = (
    CudagraphMode.FULL,
    CudagraphMode.PIECEWISE,
    CudagraphMode.FULL_DECODE_ONLY,
    CudagraphMode.FULL_AND_PIECEWISE,
    CudagraphMode.NONE,
)
_CAPTURING_MODES = MODES_SIMPLEST_FIRST[:-1]
_MODE_CHOICE = st.sampled_from(MODES_SIMPLEST_FIRST)
_CAPTURING_MODE_CHOICE = st.sampled_from(_CAPTURING_MODES)

_TYPICAL_MAX_NUM_SEQS = (16, 32, 64, 128, 256, 512, 1024)
_MAX_NUM_SEQS_CHOICE = st.sampled_from(_TYPICAL_MAX_NUM_SEQS)
_CEILINGS = (1, 8, 16, 32, 64, 128, 256, 512)


def _powers_of_two(ceiling: int) -> tuple[int, ...]:
    return tuple(1 << k for k in range(ceiling.bit_length()) if 1 << k <= ceiling)


def _stepped(step: int, ceiling: int) -> tuple[int, ...]:
    return tuple(range(step, ceiling + 1, step)) or (step,)


_CEILING_CHOICE = st.sampled_from(_CEILINGS)
_SHAPE_CHOICE = st.sampled_from(("default", "powers_of_two", "step8", "step16"))


@st.composite
def realistic_sizes(draw: st.DrawFn) -> tuple[int, ...]:
    """Capture-size lists of the shapes vLLM and operators use."""
    ceiling = draw(_CEILING_CHOICE)
    shape = draw(_SHAPE_CHOICE)
    if shape == "default":
        return vllm_default_sizes(ceiling)
    if shape == "powers_of_two":
        return _powers_of_two(ceiling)
    return _stepped(8 if shape == "step8" else 16, max(ceiling, 8))


#: max_loras values of realistic deployments, simplest first.
_TYPICAL_MAX_LORAS = (4, 8, 1, 2, 16)


# Cached, as the two below: a policy draw asks for them every time (see
# dpsim.capture.once).
@functools.lru_cache(maxsize=256)
def _lora_cases(
    capabilities: Capabilities, adversarial: bool, rules: BuildRules | None
) -> st.SearchStrategy:
    if not capabilities.has_lora:
        return st.none()
    if rules is not None:
        # What the release's own get_lora_capture_cases gives for a LoRA
        # configuration: 0 always among them.
        max_loras = (
            st.integers(1, 16) if adversarial else st.sampled_from(_TYPICAL_MAX_LORAS)
        )
        return st.one_of(
            st.none(),
            st.builds(rules.lora_cases, max_loras, st.booleans(), st.booleans()),
        )
    if adversarial:
        # Cases without 0, gaps, a single large case: all valid input to the
        # manager, none what vLLM's own get_lora_capture_cases produces.
        return st.one_of(
            st.none(),
            st.lists(st.integers(0, 16), min_size=1, max_size=5, unique=True).map(
                lambda cases: tuple(sorted(cases))
            ),
        )
    # What vLLM produces: [0] (no LoRA), [0, max_loras + 1] without
    # specialisation, powers of two up to max_loras plus max_loras + 1 with it.
    return st.sampled_from(
        (None, (0,), (0, 5), (0, 1, 2, 4, 5), (0, 9), (0, 1, 2, 4, 8, 9))
    )


@functools.lru_cache(maxsize=256)
def _microbatching(
    capabilities: Capabilities, adversarial: bool, rules: BuildRules | None
) -> st.SearchStrategy:
    if not capabilities.has_microbatching:
        return st.none()
    if adversarial:
        settings = st.builds(
            Microbatching,
            num_ubatches=st.integers(2, 4),
            decode_token_threshold=st.integers(0, 64),
            prefill_token_threshold=st.integers(0, 1024),
        )
    else:
        settings = st.builds(
            Microbatching,
            num_ubatches=st.just(2),
            decode_token_threshold=st.sampled_from((32, 16, 64, 128)),
            prefill_token_threshold=st.sampled_from((512, 256, 1024, 2048)),
        )
    if rules is not None:
        settings = settings.map(rules.fit_thresholds)
    return st.one_of(st.none(), settings)


@st.composite
def _realistic(
    draw: st.DrawFn,
    capabilities: Capabilities,
    with_drafter: bool,
    rules: BuildRules | None = None,
) -> CapturePolicy:
    mode = draw(_MODE_CHOICE)
    max_num_seqs = draw(_MAX_NUM_SEQS_CHOICE)
    decode_query_len = draw(ints(1, 8))
    # Draw the sizes even when they are then replaced: Hypothesis ranks
    # shorter choice sequences as simpler, so a branch that skipped draws
    # would beat [1] during shrinking.
    sizes = draw(_REALISTIC_SIZES)
    if draw(BOOLEANS):
        # Exactly what vLLM computes when the user configures nothing.
        ceiling = vllm_default_max_capture_size(max_num_seqs, decode_query_len)
        sizes = vllm_default_sizes(ceiling)
    varlen = (
        capabilities.has_varlen_decode
        and decode_query_len > 1
        and mode in (CudagraphMode.FULL_AND_PIECEWISE, CudagraphMode.FULL_DECODE_ONLY)
        and draw(BOOLEANS)
    )
    drafter = None
    if with_drafter and decode_query_len > 1 and draw(BOOLEANS):
        # vLLM's drafters capture one-token decode steps over their own sizes.
        drafter = draw(_realistic_drafters(capabilities, rules))
    return CapturePolicy(
        capture_sizes=sizes,
        cudagraph_mode=mode,
        max_num_seqs=max_num_seqs,
        decode_query_len=decode_query_len,
        lora_capture_cases=draw(_lora_cases(capabilities, False, rules)),
        varlen_decode=varlen,
        max_capture_size=None,
        microbatching=draw(_microbatching(capabilities, False, rules)),
        drafter=drafter,
    )


@functools.lru_cache(maxsize=256)
def _realistic_drafters(
    capabilities: Capabilities, rules: BuildRules | None
) -> st.SearchStrategy[CapturePolicy]:
    return _realistic(capabilities, with_drafter=False, rules=rules).map(
        lambda d: replace(d, decode_query_len=1, microbatching=None)
    )


_REALISTIC_SIZES = realistic_sizes()


def realistic_policies(
    capabilities: Capabilities = ALL_CAPABILITIES,
    *,
    with_drafter: bool = True,
    rules: BuildRules | None = None,
) -> st.SearchStrategy[CapturePolicy]:
    """Policies shaped like vLLM's defaults and common operator settings."""
    return _realistic(capabilities, with_drafter, rules)


#: Sizes that are valid but nobody's default: odd, non-multiples of 8, and
#: one larger than any default ceiling.
_ODD_SIZES = (96, 7, 13, 100, 1000, 3, 257)


# Each element is one choice of branch plus one value whichever branch,
# so the list [1] stays the simplest draw.
_ADVERSARIAL_SIZE_LISTS = st.lists(
    st.one_of(st.integers(1, 2048), st.sampled_from(_ODD_SIZES)),
    min_size=1,
    max_size=10,
    unique=True,
)


@st.composite
def _adversarial_sizes(draw: st.DrawFn) -> tuple[int, ...]:
    return tuple(sorted(draw(_ADVERSARIAL_SIZE_LISTS)))


@st.composite
def _adversarial(
    draw: st.DrawFn,
    capabilities: Capabilities,
    with_drafter: bool,
    rules: BuildRules | None = None,
) -> CapturePolicy:
    sizes = draw(_ADVERSARIAL_SIZES)
    mode = draw(_CAPTURING_MODE_CHOICE)
    max_num_seqs = draw(ints(1, 1024))
    decode_query_len = draw(ints(1, 8))
    # Possibly below the largest size: the manager then drops decode graphs
    # that a size would otherwise give.
    max_capture_size = draw(_CEILING_OR_NONE)
    if (
        rules is not None
        and max_capture_size is not None
        and not rules.accepts_ceiling(sizes, max_capture_size)
    ):
        max_capture_size = None
    varlen = capabilities.has_varlen_decode and draw(BOOLEANS)
    drafter = None
    if with_drafter and draw(BOOLEANS):
        drafter = draw(_adversarial_drafters(capabilities, rules))
    return CapturePolicy(
        capture_sizes=sizes,
        cudagraph_mode=mode,
        max_num_seqs=max_num_seqs,
        decode_query_len=decode_query_len,
        lora_capture_cases=draw(_lora_cases(capabilities, True, rules)),
        varlen_decode=varlen,
        max_capture_size=max_capture_size,
        microbatching=draw(_microbatching(capabilities, True, rules)),
        drafter=drafter,
    )


_ADVERSARIAL_SIZES = _adversarial_sizes()
_CEILING_OR_NONE = st.one_of(st.none(), st.integers(1, 2048))


@functools.lru_cache(maxsize=256)
def _adversarial_drafters(
    capabilities: Capabilities, rules: BuildRules | None
) -> st.SearchStrategy[CapturePolicy]:
    return _adversarial(capabilities, with_drafter=False, rules=rules)


def adversarial_policies(
    capabilities: Capabilities = ALL_CAPABILITIES,
    *,
    with_drafter: bool = True,
    rules: BuildRules | None = None,
) -> st.SearchStrategy[CapturePolicy]:
    """Valid but odd policies: sparse sizes, tight ceilings, unusual cases."""
    return _adversarial(capabilities, with_drafter, rules)


def policies(
    capabilities: Capabilities = ALL_CAPABILITIES,
    *,
    with_drafter: bool = True,
    rules: BuildRules | None = None,
) -> st.SearchStrategy[CapturePolicy]:
    """Either family; shrinks towards the realistic one, whose minimum is
    ``capture_sizes=[1]``, FULL, max_num_seqs 16, no spec decode.

    With ``rules``, only what that release's config code builds."""
    return st.one_of(
        realistic_policies(capabilities, with_drafter=with_drafter, rules=rules),
        adversarial_policies(capabilities, with_drafter=with_drafter, rules=rules),
    )
