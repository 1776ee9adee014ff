"""What the rebuilt V1 ``GPUModelRunner`` is given in place of GPU work.

:class:`V1RunnerStandIns` is the rebuilt runner's base: the methods that are
GPU work or ``InputBatch`` bookkeeping (:mod:`.model_runner` says which and
why); :class:`PersistentBatch` the slice of V1's ``InputBatch`` the DP path
reads; :class:`V1ForwardContexts` the per-rank ``set_forward_context``; the
rest small stand-ins the runner's globals name. Every one is strict (an
attribute it was not written for is a gap that refuses the run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from dpsim.lanes.runner.forward import ForwardContexts
from dpsim.lanes.runner.model_runner import NoLoRADummyRuns, _Buffer, _ignore
from dpsim.lanes.runner.strict import StrictObject, gap, standin


class V1ForwardContexts(ForwardContexts):
    """The lane's per-rank ``set_forward_context`` for the V1 runner, which
    also does what the release's own does when a caller under DP passes no
    agreed counts: it coordinates afresh, calling ``coordinate_batch_across_dp``
    with the rank's parallel config, no microbatching (and, 0.12-0.16, no DP
    padding), so that all-reduce happens on the simulator's DP group and a
    rank making it alone is caught (vLLM 56281's class)."""

    def __init__(
        self,
        dp_metadata_make: Callable[..., Any] | None,
        coordinate: Callable[..., Any],
    ) -> None:
        super().__init__(dp_metadata_make)
        #: The module global ``coordinate_batch_across_dp`` of the rebuilt classes.
        self.coordinate = coordinate
        self._padding = "allow_dp_padding" in inspect.signature(coordinate).parameters

    @contextlib.contextmanager
    def set_forward_context(
        self,
        attn_metadata: Any,
        vllm_config: Any,
        num_tokens: int | None = None,
        num_tokens_across_dp: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Iterator[None]:
        parallel = vllm_config.parallel_config
        if (
            num_tokens_across_dp is None
            and num_tokens is not None
            and parallel.data_parallel_size > 1
        ):
            extra = {"allow_dp_padding": False} if self._padding else {}
            num_tokens_across_dp = self.coordinate(
                num_tokens_unpadded=num_tokens,
                parallel_config=parallel,
                allow_microbatching=False,
                **extra,
            )[1]
        with super().set_forward_context(
            attn_metadata,
            vllm_config,
            num_tokens,
            num_tokens_across_dp,
            *args,
            **kwargs,
        ):
            yield


def to_tensor(data: Any, device: Any = None, dtype: Any = None, **kwargs: Any) -> Any:
    """``async_tensor_h2d``: the host data as a CPU tensor."""
    tensor = torch.as_tensor(np.asarray(data))
    return tensor if dtype is None else tensor.to(dtype)


def execute_model_state(*fields: Any) -> tuple[Any, ...]:
    return tuple(fields)


class NeverInstance:
    """A class nothing the lane hands vLLM is an instance of."""


class NoCudagraphStat:
    """``CUDAGraphStat``: built only with CUDA-graph metrics on, which are off."""

    def __init__(self, **fields: Any) -> None:
        raise gap("CUDAGraphStat built: CUDA-graph metrics are off in the lane")


class AsyncV1Output(StrictObject):
    """``AsyncGPUModelRunnerOutput`` without its CUDA stream and event: the
    output (sampled token ids already lists) is there at once."""

    OWNER = "AsyncGPUModelRunnerOutput"

    def __init__(self, model_runner_output: Any, **other: Any) -> None:
        self.model_runner_output = model_runner_output
        self.sampled_token_ids_cpu = None
        self.async_copy_ready_event = None

    def get_output(self) -> Any:
        return self.model_runner_output


class PersistentBatch(StrictObject):
    """The slice of V1's ``InputBatch`` the DP path reads: the batch's
    request ids in order (kept requests first, in their order, then new ones
    as they arrive), each request's computed tokens, no LoRA, and the
    sampling metadata's presence."""

    OWNER = "InputBatch"

    def __init__(self, vocab_size: int) -> None:
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.lora_id_to_lora_request: dict[int, Any] = {}
        self.vocab_size = vocab_size
        self.num_computed_tokens_cpu = np.zeros(0, dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(0, dtype=np.int32)
        self.sampling_metadata = standin("SamplingMetadata", output_token_ids=[])
        self.prev_sampled_token_ids: Any = None
        self.block_table = standin(
            "MultiGroupBlockTable", commit_block_table=_ignore, block_tables=[]
        )

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def set_async_sampled_token_ids(self, *args: Any) -> None:
        """The sampled ids are kept on the CPU already."""

    def update_async_output_token_ids(self) -> None:
        """No sampling parameter needs the output ids."""


@dataclasses.dataclass
class _Request:
    """What the runner keeps of one request: its token counts."""

    num_tokens: int
    num_computed_tokens: int

    def get_token_id(self, index: int) -> int:
        """Every token of the lane's requests is token 0."""
        return 0


@dataclasses.dataclass(frozen=True)
class _Step:
    """The shape of the step being run: per request, its scheduled tokens,
    their running sum, and its sequence length after the step."""

    num_scheduled_tokens: np.ndarray
    cu_num_tokens: np.ndarray
    seq_lens: np.ndarray

    def common_metadata(self, cls: type) -> Any:
        """The release's ``CommonAttentionMetadata`` of this step: the fields
        it requires (tables and slots zero, no KV cache here; a required
        field not among these is a gap)."""
        num_reqs = len(self.seq_lens)
        total = int(self.cu_num_tokens[-1])
        query_start = torch.from_numpy(
            np.concatenate(([0], self.cu_num_tokens)).astype(np.int32)
        )
        seq_lens = torch.from_numpy(self.seq_lens.astype(np.int32))
        computed = self.seq_lens - self.num_scheduled_tokens.astype(np.int32)
        values = {
            "query_start_loc": query_start,
            "query_start_loc_cpu": query_start.clone(),
            "seq_lens": seq_lens,
            # Up to 0.13: host copies are required fields.
            "seq_lens_cpu": seq_lens.clone(),
            "num_computed_tokens_cpu": torch.from_numpy(computed.astype(np.int32)),
            "num_reqs": num_reqs,
            "num_actual_tokens": total,
            "max_query_len": int(self.num_scheduled_tokens.max()),
            "max_seq_len": int(self.seq_lens.max()),
            "block_table_tensor": torch.zeros(num_reqs, 1, dtype=torch.int32),
            "slot_mapping": torch.zeros(total, dtype=torch.int64),
        }
        given = {}
        for field in dataclasses.fields(cls):
            if field.name in values:
                given[field.name] = values[field.name]
            elif (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise gap(
                    f"CommonAttentionMetadata requires {field.name}, which the "
                    "lane's stood-in attention metadata does not give"
                )
        return cls(**given)


def _trim_unproposed_drafts(scheduler_output: Any, in_batch: set[str]) -> None:
    spec = scheduler_output.scheduled_spec_decode_tokens
    for req_id in scheduler_output.scheduled_cached_reqs.req_ids:
        count = len(spec.get(req_id, ()))
        if req_id in in_batch and count:
            scheduler_output.total_num_scheduled_tokens -= count
            scheduler_output.num_scheduled_tokens[req_id] -= count
            spec.pop(req_id, None)


class V1RunnerStandIns(NoLoRADummyRuns):
    """The base of the rebuilt V1 runner: the methods that are GPU work or
    InputBatch bookkeeping (see the module docstring)."""

    OWNER = "GPUModelRunner"

    def _update_states(self, scheduler_output: Any) -> None:
        """The persistent batch after ``scheduler_output``: finished and
        unscheduled requests out, new ones in, computed tokens as the
        scheduler says (``CachedRequestData.num_computed_tokens``).

        As 0.12-0.13's real method does under async scheduling, a request
        still in the batch whose scheduled drafts are placeholders for drafts
        never proposed (``_draft_token_ids`` None) has them taken out of the
        scheduler output (its token counts and its draft list)."""
        runner: Any = self
        requests: dict[str, _Request] = runner.requests
        batch: PersistentBatch = runner.input_batch
        if (
            runner._dpsim_kit.trims_unproposed_drafts
            and runner.use_async_scheduling
            and runner._draft_token_ids is None
        ):
            _trim_unproposed_drafts(scheduler_output, set(batch.req_ids))
        for req_id in scheduler_output.finished_req_ids:
            requests.pop(req_id, None)
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            requests[new.req_id] = _Request(
                len(new.prompt_token_ids), int(new.num_computed_tokens)
            )
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed in zip(
            cached.req_ids, cached.num_computed_tokens, strict=True
        ):
            request = requests[req_id]
            request.num_computed_tokens = int(computed)
            request.num_tokens = max(request.num_tokens, int(computed))
        kept = [r for r in batch.req_ids if r in scheduled and r in requests]
        added = [r for r in scheduled if r not in kept]
        batch.req_ids = kept + added
        batch.req_id_to_index = {r: i for i, r in enumerate(batch.req_ids)}
        batch.num_computed_tokens_cpu = np.array(
            [requests[r].num_computed_tokens for r in batch.req_ids], dtype=np.int32
        )

    def _prepare_inputs(
        self, scheduler_output: Any, num_scheduled_tokens: np.ndarray
    ) -> tuple[Any, ...]:
        """The logits rows and spec-decode metadata of the real batch, as
        the real method makes them (with drafts scheduled, the release's own
        ``_calc_spec_decode_metadata``), and the maximum number of sampled
        tokens per request; the batch's shape is kept for the attention
        metadata (:meth:`_build_attention_metadata`)."""
        runner: Any = self
        batch: PersistentBatch = runner.input_batch
        spec = scheduler_output.scheduled_spec_decode_tokens
        drafts = np.array([len(spec.get(r, ())) for r in batch.req_ids], dtype=np.int32)
        cu_num_tokens = np.cumsum(num_scheduled_tokens, dtype=np.int32)
        computed = np.array(
            [runner.requests[r].num_computed_tokens for r in batch.req_ids],
            dtype=np.int32,
        )
        seq_lens = computed + num_scheduled_tokens.astype(np.int32)
        batch.num_tokens_no_spec = seq_lens - drafts
        runner._dpsim_step = _Step(num_scheduled_tokens, cu_num_tokens, seq_lens)
        if spec:
            metadata = runner._calc_spec_decode_metadata(drafts, cu_num_tokens)
            rows = metadata.logits_indices
        else:
            metadata = None
            rows = torch.from_numpy((cu_num_tokens - 1).astype(np.int64))
        result = (rows, metadata, 1 + int(drafts.max(initial=0)))
        # Before 0.28: no maximum of sampled tokens.
        return result[: runner._dpsim_kit.result_sizes["_prepare_inputs"]]

    def _get_slot_mappings(self, **kwargs: Any) -> tuple[None, None]:
        """No KV cache layers: no slot mappings."""
        return None, None

    def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """No attention layers: empty metadata. With a drafter, the common
        metadata it reads is the release's own ``CommonAttentionMetadata``
        of the step's batch (its sequence lengths: the drafter fit check)."""
        runner: Any = self
        step: _Step | None = runner._dpsim_step
        if runner.drafter is None or step is None:
            return {}, None
        return {}, step.common_metadata(runner._dpsim_common_metadata)

    def _preprocess(
        self, scheduler_output: Any, num_input_tokens: int, intermediate_tensors: Any
    ) -> tuple[Any, ...]:
        """Zero token ids and positions of the padded shape; no embeddings,
        no extra model inputs, no EC connector output."""
        runner: Any = self
        return (
            runner.input_ids.gpu[:num_input_tokens],
            None,
            runner._dpsim_positions[:num_input_tokens],
            None,
            {},
            None,
        )

    def _init_model_kwargs(self, num_reqs: int | None = None) -> dict[str, Any]:
        return {}

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        """One sampled token (id 0) per request, its drafts' places rejected
        (-1) as the rejection sampler's rows have them: the modelled
        scheduler decides acceptance itself."""
        num_reqs = self.input_batch.num_reqs
        width = 1
        if spec_decode_metadata is not None:
            width += max(spec_decode_metadata.num_draft_tokens, default=0)
        sampled = torch.full((num_reqs, width), -1, dtype=torch.int64)
        sampled[:, 0] = 0
        return standin(
            "SamplerOutput", sampled_token_ids=sampled, logprobs_tensors=None
        )

    def _copy_draft_token_ids_to_cpu(
        self, scheduler_output: Any, zeros_only: bool = False
    ) -> None:
        """The drafts' device-to-host copy, done at once; as the real one,
        skipped under async scheduling when no sampling parameter needs them."""
        runner: Any = self
        drafts = runner._draft_token_ids
        if torch.is_tensor(drafts):
            runner.prev_num_spec_tokens = drafts.shape[1]
        if runner.use_async_scheduling and not (
            scheduler_output.has_structured_output_requests
            or runner.input_batch.sampling_metadata.output_token_ids
        ):
            return
        runner._draft_token_req_ids = list(runner.input_batch.req_ids)
        if torch.is_tensor(drafts):
            runner._dpsim_drafts_cpu = (
                torch.zeros_like(drafts) if zeros_only else drafts.clone()
            )

    def _get_draft_token_ids_cpu(self) -> tuple[list[list[int]], list[str]]:
        runner: Any = self
        if isinstance(runner._draft_token_ids, list):
            return runner._draft_token_ids, runner.input_batch.req_ids
        req_ids = runner._draft_token_req_ids
        if req_ids is None:
            return [], []
        return runner._dpsim_drafts_cpu[: len(req_ids)].tolist(), req_ids

    def _copy_valid_sampled_token_count(self, *args: Any) -> None:
        """The valid-count device-to-host copy under async scheduling: read
        back only by the bookkeeping, which is stood in for."""

    def _update_states_after_model_execute(self, *args: Any) -> None:
        """Hybrid (Mamba) models' accepted-token bookkeeping: not such a model."""

    def _bookkeeping_sync(
        self,
        scheduler_output: Any,
        sampler_output: Any,
        logits: Any,
        hidden_states: Any,
        num_scheduled_tokens: int,
        *args: Any,
    ) -> tuple[Any, ...]:
        """The output's per-request lists: one token for a request whose
        prompt is done, none for a partial prefill (vLLM discards it)."""
        runner: Any = self
        batch: PersistentBatch = runner.input_batch
        scheduled = scheduler_output.num_scheduled_tokens
        valid = []
        for req_id in batch.req_ids:
            request = runner.requests[req_id]
            done = request.num_computed_tokens + scheduled[req_id] >= request.num_tokens
            valid.append([0] if done else [])
        # 0.28+ also return the NaN counts on the device (second).
        nans = (None,) * (runner._dpsim_kit.result_sizes["_bookkeeping_sync"] - 7)
        return (
            None,
            *nans,
            None,
            valid,
            {},
            list(batch.req_ids),
            dict(batch.req_id_to_index),
            [],
        )

    @contextlib.contextmanager
    def maybe_get_kv_connector_output(
        self, scheduler_output: Any, **kwargs: Any
    ) -> Iterator[None]:
        """No KV connector: no connector output."""
        yield None

    def finalize_kv_connector(self) -> None:
        """No KV connector."""

    def clear_kv_connector_metadata(self) -> None:
        """No KV connector (0.17's name for the step after drafting)."""

    def _register_layerwise_nvtx_hooks(self) -> None:
        """NVTX tracing is off."""

    def _get_or_create_async_output_copy_stream(self) -> None:
        return None


class CopiedBuffer(_Buffer):
    """A ``CpuGpuBuffer`` whose host-to-device copy is the same array."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.cpu = self.gpu

    def copy_to_gpu(self, *args: Any) -> None:
        """The "GPU" tensor shares the host array."""
