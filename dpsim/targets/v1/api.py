"""One call interface over the V1 runner's coordination, every release's.

:class:`V1API` satisfies :class:`~dpsim.targets.api.TargetAPI`: ``call`` maps
one rank's :class:`~dpsim.records.case.SyncInputs` to the arguments vLLM's
``execute_model`` (or ``_dummy_run``) passes the caller method, runs it on a
strict stand-in ``self`` with the real dispatcher, and returns the caller's
own result with what ``coordinate_batch_across_dp`` returned inside it;
``describe`` and ``agreement`` turn those into plain records.

The mapping, for the record: the per-request token counts are
``[u] * num_reqs`` for a uniform batch of ``u``-token requests, else the first
request has ``max_query_len`` tokens (the whole batch split evenly when there
is no bound) and the rest split as ``_dummy_run`` splits a batch (evenly, the
remainder on the last); ``need_eager`` is ``force_eager``;
``allow_ubatching`` is ``allow_microbatching``; ``uniform_decode`` sets
``force_uniform_decode`` (dummy and profile runs pass it either way, as
``_dummy_run`` does); a regular batch carries its LoRA count in the runner's
input batch, a dummy run passes ``force_has_lora``/``force_num_active_loras``;
``num_encoder_reqs`` is passed as is (0.13+; earlier callers refuse a nonzero
count), and the stand-in's ``model_config.is_encoder_decoder`` is the
policy's ``encoder_decoder``, read off the dispatcher's config;
``cascade_attn`` is ``use_cascade_attn`` (0.11's modelled caller refuses it).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dpsim.records.case import SyncInputs
from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import Agreement, Descriptor
from dpsim.targets.v1.caller import RunnerState
from dpsim.targets.v1.dispatcher import model_is_encoder_decoder

ENTRY = "coordinate_batch_across_dp"
#: RankBatch kinds made by ``_dummy_run``, which forces the uniform-decode flag.
DUMMY_KINDS = ("dummy", "profile")
#: SyncInputs field -> the caller parameter that must exist to honour it
#: (None: every caller honours it; the LoRA count travels in the runner).
_INPUT_PARAMETERS: dict[str, str | None] = {
    "max_query_len": "num_scheduled_tokens_np",
    "need_eager": "force_eager",
    "num_active_loras": None,
    "allow_ubatching": "allow_microbatching",
    "uniform_decode": "force_uniform_decode",
    "num_encoder_reqs": "num_encoder_reqs",
    "cascade_attn": "use_cascade_attn",
}


class CallerLike(Protocol):
    """The real caller method (:class:`~dpsim.targets.v1.caller.Caller`) or
    0.11's modelled one (:class:`~dpsim.targets.v1.modelled.ModelledCaller`)."""

    @property
    def parameters(self) -> tuple[str, ...]: ...

    @property
    def ignored(self) -> tuple[str, ...]: ...

    def invoke(
        self, state: RunnerState, arguments: dict[str, Any]
    ) -> tuple[Any, ...]: ...


_syncs: contextvars.ContextVar[list[tuple[Any, ...]] | None] = contextvars.ContextVar(
    "dpsim_v1_syncs", default=None
)


def recording(sync: Callable[..., Any]) -> Callable[..., Any]:
    """``sync`` (the loaded ``coordinate_batch_across_dp``), also telling the
    call in progress what it returned: the caller method keeps only part of it
    (the synced cudagraph mode it only uses, never returns)."""

    @functools.wraps(sync)
    def coordinate_batch_across_dp(*args: Any, **kwargs: Any) -> Any:
        returned = sync(*args, **kwargs)
        seen = _syncs.get()
        if seen is not None:
            seen.append(returned)
        return returned

    return coordinate_batch_across_dp


def request_counts(inputs: SyncInputs) -> list[int]:
    """Each request's scheduled tokens for one rank's batch (see the module)."""
    count, total = inputs.num_reqs, inputs.num_tokens
    if count <= 0:
        return []
    if inputs.uniform_token_count is not None:
        return [inputs.uniform_token_count] * count
    first: list[int] = []
    if inputs.max_query_len is not None and count > 1:
        first = [inputs.max_query_len]
        count, total = count - 1, total - inputs.max_query_len
    share = total // count
    rest = [share] * count
    rest[-1] += total % count
    return first + rest


@dataclass(frozen=True)
class V1Result:
    """What the caller method returned for one rank, and what it needs to be read."""

    returned: tuple[Any, ...]
    num_ubatches: int
    decode_query_len: int


@dataclass(frozen=True)
class V1API:
    """How to call one release's V1 coordination, and what it offers."""

    caller: CallerLike = field(repr=False)
    #: ``coordinate_batch_across_dp``'s parameters.
    parameters: tuple[str, ...]
    agreement_fields: tuple[str, ...]
    descriptor_fields: tuple[str, ...]
    collective: str
    tensor_rows: int | None
    mode_enum: Any = field(repr=False)
    entry: str = ENTRY
    reuse_parameter: str | None = None

    # Asked for every input of every call (has(), unsupported_input()), and
    # fixed by the caller's parameters: worked out once.
    @functools.cached_property
    def features(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, parameter in _INPUT_PARAMETERS.items()
            if parameter is None or parameter in self.caller.parameters
        )

    def has(self, feature: str) -> bool:
        return feature in self.features

    # Asked by the oracle for every step: worked out once.
    @functools.cached_property
    def features_read(self) -> tuple[str, ...]:
        """The features whose parameter the caller also reads: a parameter
        kept in the signature and ignored (0.32's ``use_cascade_attn``) is
        taken, but changes nothing."""
        return tuple(
            name
            for name in self.features
            if _INPUT_PARAMETERS[name] not in self.caller.ignored
        )

    def reads(self, feature: str) -> bool:
        return feature in self.features_read

    def unsupported_input(self, inputs: SyncInputs) -> str | None:
        """The first input set away from its default this caller cannot take."""
        for name in SyncInputs.__dataclass_fields__:
            default = SyncInputs.__dataclass_fields__[name].default
            if name in ("num_reqs", "num_tokens", "uniform_token_count"):
                continue
            if getattr(inputs, name) != default and not self.has(name):
                return name
        return None

    def call(
        self,
        table: Any,
        inputs: SyncInputs,
        dp_size: int,
        dp_rank: int,
        /,
        *,
        parallel_config: Any = None,
        reuse: Any = None,
    ) -> tuple[V1Result, Any]:
        """Run the release's caller method for one rank; return its result and
        what the sync inside it returned (None when it did not sync)."""
        unsupported = self.unsupported_input(inputs)
        if unsupported is not None:
            raise ValueError(f"the V1 runner's caller takes no {unsupported}")
        if reuse is not None:
            raise ValueError("the V1 runner's sync cannot reuse an agreement")
        if parallel_config is None:
            raise ValueError("the V1 runner's caller needs the rank's parallel_config")
        if (parallel_config.data_parallel_size, parallel_config.data_parallel_rank) != (
            dp_size,
            dp_rank,
        ):
            raise ValueError(
                f"parallel_config says rank {parallel_config.data_parallel_rank} of "
                f"{parallel_config.data_parallel_size}, the call rank {dp_rank} of {dp_size}"
            )
        decode_query_len = int(
            getattr(table, "uniform_decode_query_len", None)
            or 1 + table.vllm_config.num_speculative_tokens
        )
        state = RunnerState(
            uniform_decode_query_len=decode_query_len,
            dispatcher=table,
            parallel_config=parallel_config,
            cudagraph_mode=table.compilation_config.cudagraph_mode,
            num_active_loras=(0 if _dummy(inputs) else inputs.num_active_loras),
            encoder_decoder=model_is_encoder_decoder(table),
        )
        seen: list[tuple[Any, ...]] = []
        token = _syncs.set(seen)
        try:
            returned = self.caller.invoke(state, self._arguments(inputs))
        finally:
            _syncs.reset(token)
        should_ubatch = returned[2]
        ubatch = (
            bool(should_ubatch)
            if isinstance(should_ubatch, bool)
            else should_ubatch is not None
        )
        result = V1Result(
            returned=tuple(returned),
            num_ubatches=int(parallel_config.num_ubatches) if ubatch else 1,
            decode_query_len=decode_query_len,
        )
        return result, (seen[-1] if seen else None)

    def _arguments(self, inputs: SyncInputs) -> dict[str, Any]:
        counts = request_counts(inputs)
        dummy = _dummy(inputs)
        offered: dict[str, Any] = {
            "num_tokens": inputs.num_tokens,
            "num_reqs": inputs.num_reqs,
            "num_scheduled_tokens_np": np.array(counts, dtype=np.int32),
            "max_num_scheduled_tokens": max(counts, default=0),
            "use_cascade_attn": inputs.cascade_attn,
            "allow_microbatching": inputs.allow_ubatching,
            "force_eager": inputs.need_eager,
            "num_encoder_reqs": inputs.num_encoder_reqs,
            "force_uniform_decode": (
                inputs.uniform_decode if dummy or inputs.uniform_decode else None
            ),
        }
        if dummy:
            offered["force_has_lora"] = inputs.num_active_loras > 0
            offered["force_num_active_loras"] = inputs.num_active_loras
        # Only the modelled 0.11 caller takes these: which call site it is.
        offered["dummy_run"] = dummy
        offered["is_profile"] = getattr(inputs, "kind", "batch") == "profile"
        return {
            name: value
            for name, value in offered.items()
            if name in self.caller.parameters
        }

    def describe(self, native: V1Result) -> Descriptor:
        """The caller's chosen mode and batch descriptor as plain values."""
        mode, descriptor = native.returned[0], native.returned[1]
        uniform = bool(
            getattr(descriptor, "uniform", getattr(descriptor, "uniform_decode", False))
        )
        num_reqs = getattr(descriptor, "num_reqs", None)
        return Descriptor(
            cg_mode=CudagraphMode(mode.name),
            num_tokens=int(descriptor.num_tokens),
            num_reqs=None if num_reqs is None else int(num_reqs),
            uniform_token_count=native.decode_query_len if uniform else None,
            # Before 0.17 a key says only whether LoRA is on (the caller
            # passes no count then): read that as one active adapter.
            num_active_loras=int(
                getattr(
                    descriptor,
                    "num_active_loras",
                    getattr(descriptor, "has_lora", False),
                )
            ),
            num_ubatches=native.num_ubatches,
        )

    def agreement(self, native: Any) -> Agreement | None:
        """What ``coordinate_batch_across_dp`` returned, as plain values; None
        when the caller did not sync (one rank) or the sync agreed nothing."""
        if native is None or native[1] is None:
            return None
        ubatch = native[0] if isinstance(native[0], bool) else native[0] is not None
        synced = None
        if len(native) > 2:
            synced = CudagraphMode(self.mode_enum(int(native[2])).name)
        return Agreement(
            num_tokens_across_dp=tuple(int(v) for v in native[1].tolist()),
            cg_mode=synced,
            ubatch=bool(ubatch),
        )


def _dummy(inputs: SyncInputs) -> bool:
    return getattr(inputs, "kind", "batch") in DUMMY_KINDS
