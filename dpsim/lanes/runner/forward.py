"""Forwards stood in for: models, captured graphs and the forward context.

A real forward runs the model on a GPU; what matters for DP is the MoE
dispatch/combine it issues on the expert-parallel group, at the shape the
real code chose. Every stood-in forward here issues exactly those collectives
through :func:`dpsim.scenarios.ranks.moe_collectives`, the one model of a
forward's EP collectives that the sync lane's scenarios use too, so a runner
lane trace and a sync lane trace speak of a forward alike:

* :class:`FakeModel` is the model the real code calls eagerly or under
  piecewise graphs (``model(**inputs)``, ``run_pw_graph``); it reads the
  shape and the graph mode from the running rank's forward context, as a
  vLLM MoE layer reads ``get_forward_context()``;
* :class:`FakeGraph` is a captured FULL graph in the real
  ``ModelCudaGraphManager``'s ``graphs`` table (:func:`install_graphs`); its
  ``replay()`` issues the collectives of its descriptor's shape, one per
  microbatch;
* :class:`ForwardContexts` stands in for ``vllm.forward_context``'s
  ``set_forward_context``: vLLM keeps the forward context in a module global
  that each worker process (thread) owns; virtual ranks share one thread, so
  the stand-in keeps one context stack per virtual rank (per greenlet). Under
  DP it builds the release's own ``DPMetadata`` when the release's
  ``forward_context.py`` gives one, so vLLM's own check that this rank's
  count is its entry in the agreed counts runs.

A model or graph may be given an ``on_forward(num_tokens)`` callback, called
before each forward's collectives: the speculators pass the sync recorder's
``record_drafter_forward`` so drafter forwards are counted per step. Outputs
are CPU tensors of zeros shaped as the real code needs downstream (hidden
states ``[tokens, HIDDEN_SIZE]``, logits ``[rows, vocab]``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from greenlet import getcurrent

from dpsim.lanes.runner.strict import StrictObject, asked_at, gap
from dpsim.records.groups import EP_GROUP
from dpsim.scenarios.ranks import _MoEParallelConfig, moe_collectives, program_world

#: The width of fake hidden states: small, the values are never read.
HIDDEN_SIZE = 4
#: The graph mode name of an eager forward (``CUDAGraphMode.NONE``).
EAGER = "NONE"


@dataclass(frozen=True)
class ForwardContext:
    """What one ``set_forward_context`` block told the forward: the padded
    token count, the graph mode's name, the agreed per-rank counts (None
    without DP) and the number of microbatches."""

    num_tokens: int
    mode: str
    num_tokens_across_dp: tuple[int, ...] | None
    num_ubatches: int


def _mode_name(mode: Any) -> str:
    """A vLLM ``CUDAGraphMode`` member's name (None is vLLM's default, NONE)."""
    return EAGER if mode is None else str(mode.name)


class ForwardContexts:
    """``set_forward_context`` for one loaded release, per virtual rank.

    ``dp_metadata_make`` is the release's ``DPMetadata.make`` (None when the
    release's ``forward_context.py`` could not give it: then the agreed counts
    are still required under DP, but vLLM's own count check is not run).
    """

    def __init__(self, dp_metadata_make: Callable[..., Any] | None = None) -> None:
        self._dp_metadata_make = dp_metadata_make
        # One stack per greenlet (virtual rank), as vLLM has one per process.
        self._stacks: weakref.WeakKeyDictionary[Any, list[ForwardContext]] = (
            weakref.WeakKeyDictionary()
        )

    def current(self) -> ForwardContext | None:
        """The running rank's innermost forward context, if it is in one."""
        stack = self._stacks.get(getcurrent())
        return stack[-1] if stack else None

    @contextmanager
    def set_forward_context(
        self,
        attn_metadata: Any,
        vllm_config: Any,
        num_tokens: int | None = None,
        num_tokens_across_dp: torch.Tensor | None = None,
        cudagraph_runtime_mode: Any = None,
        batch_descriptor: Any = None,
        ubatch_slices: Any = None,
        slot_mapping: Any = None,
        skip_compiled: bool = False,
        is_padding: torch.Tensor | None = None,
    ) -> Iterator[None]:
        """The stand-in, with vLLM 0.29-0.33's signature (any other keyword
        is a ``TypeError``, as it would be in vLLM)."""
        if num_tokens is None:
            raise gap(
                "set_forward_context without num_tokens (vLLM derives it from the "
                f"attention metadata; not modelled) at {asked_at()}"
            )
        if ubatch_slices is not None:
            # The lane runs no UBatchRunner (microbatching is refused).
            raise gap(f"set_forward_context with ubatch_slices at {asked_at()}")
        parallel = vllm_config.parallel_config
        across: tuple[int, ...] | None = None
        if parallel.data_parallel_size > 1:
            if num_tokens_across_dp is None:
                # vLLM then coordinates afresh (V1's coordinate_batch_across_dp,
                # one more DP all-reduce): a path the lane does not model.
                raise gap(
                    "set_forward_context under DP without num_tokens_across_dp "
                    f"(vLLM would coordinate afresh; not modelled) at {asked_at()}"
                )
            across = tuple(int(n) for n in num_tokens_across_dp.tolist())
            if self._dp_metadata_make is not None:
                self._dp_metadata_make(
                    _MoEParallelConfig(
                        parallel.data_parallel_size, parallel.data_parallel_rank
                    ),
                    num_tokens,
                    num_tokens_across_dp,
                )
        context = ForwardContext(
            num_tokens=int(num_tokens),
            mode=_mode_name(cudagraph_runtime_mode),
            num_tokens_across_dp=across,
            num_ubatches=1,
        )
        stack = self._stacks.setdefault(getcurrent(), [])
        stack.append(context)
        try:
            yield
        finally:
            stack.pop()


OnForward = Callable[[int], None]


def forward(
    num_tokens: int, mode: str, num_ubatches: int, on_forward: OnForward | None
) -> None:
    """One stood-in forward on the running rank: ``on_forward`` if given, then
    its MoE collectives on the EP group (:func:`moe_collectives`)."""
    if on_forward is not None:
        on_forward(num_tokens)
    world = program_world()
    moe_collectives(
        world.dist,
        world.group(EP_GROUP),
        num_tokens,
        eager=mode == EAGER,
        num_ubatches=num_ubatches,
    )


class FakeModel(StrictObject):
    """A model called eagerly or under piecewise graphs, inside
    ``set_forward_context``: it forwards at the context's shape and returns
    zero hidden states, one row per input position.

    It takes the inputs vLLM's runners pass (``input_ids``, ``positions``,
    ``inputs_embeds``, ``intermediate_tensors``) and those named in
    ``extra_inputs`` (a drafter's ``hidden_states``); any other input is a
    gap. It answers ``compute_logits``; anything else vLLM asks of a model is
    a gap, but for the probes in ``ABSENT`` (optional hooks a plain decoder
    does not define, so ``getattr(model, name, None)`` is None as in vLLM).
    """

    OWNER = "model"
    ABSENT = frozenset({"get_mtp_target_hidden_states"})

    def __init__(
        self,
        contexts: ForwardContexts,
        vocab_size: int,
        *,
        extra_inputs: Collection[str] = (),
        on_forward: OnForward | None = None,
    ) -> None:
        self.contexts = contexts
        self.vocab_size = vocab_size
        self.extra_inputs = frozenset(extra_inputs)
        self.on_forward = on_forward

    def __call__(
        self,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        intermediate_tensors: Any = None,
        **other: Any,
    ) -> torch.Tensor:
        unknown = sorted(set(other) - self.extra_inputs)
        if unknown:
            raise gap(f"model called with {unknown} (not modelled) at {asked_at()}")
        context = self.contexts.current()
        if context is None:
            raise gap(f"model called outside set_forward_context at {asked_at()}")
        forward(context.num_tokens, context.mode, context.num_ubatches, self.on_forward)
        rows = positions.shape[-1] if positions is not None else context.num_tokens
        return torch.zeros(rows, HIDDEN_SIZE)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden_states.shape[0], self.vocab_size)


class FakeGraph(StrictObject):
    """A captured FULL graph: replaying it forwards at its descriptor's
    token count, split over its microbatches."""

    OWNER = "captured graph"

    def __init__(
        self, num_tokens: int, num_ubatches: int, on_forward: OnForward | None
    ) -> None:
        self.num_tokens = num_tokens
        self.num_ubatches = num_ubatches
        self.on_forward = on_forward

    def replay(self) -> None:
        forward(self.num_tokens, "FULL", self.num_ubatches, self.on_forward)


def full_descriptors(manager: Any) -> list[Any]:
    """Every FULL descriptor a real ``CudaGraphManager``'s table can dispatch
    to (what capture would have captured), in table order: its token-keyed
    candidates, then (0.34+) its uniform decode graphs, which dispatch
    looks up by query length and request count instead."""
    tables = [*manager._candidates.values()]
    tables += manager.__dict__.get("_decode_descs", {}).values()
    return list(
        dict.fromkeys(
            desc
            for candidates in tables
            for desc in candidates
            if desc.cg_mode.name == "FULL"
        )
    )


def install_graphs(
    manager: Any, *, hidden_states: bool = True, on_forward: OnForward | None = None
) -> None:
    """Give a real graph manager (built by
    :func:`dpsim.targets.manager.build_manager`, marked captured) a fake
    captured graph for every FULL descriptor it can dispatch to, and, for a
    ``ModelCudaGraphManager`` (``hidden_states``), the static hidden-state
    buffer its ``run_fullgraph`` slices, as capture leaves them."""
    full = full_descriptors(manager)
    for desc in full:
        # Descriptors before 0.30 have no microbatch count: one microbatch.
        ubatches = desc.num_ubatches if hasattr(desc, "num_ubatches") else 1
        manager.graphs[desc] = FakeGraph(desc.num_tokens, max(ubatches, 1), on_forward)
    if hidden_states:
        largest = max((desc.num_tokens for desc in full), default=0)
        manager.hidden_states = torch.zeros(largest, HIDDEN_SIZE)
