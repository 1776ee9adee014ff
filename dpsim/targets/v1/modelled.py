"""A modelled V1 caller for vLLM 0.11.x, where the real one cannot be cut out.

In 0.11.1 and 0.11.2 ``coordinate_batch_across_dp`` is called from inside
``GPUModelRunner._prepare_inputs`` (about 250 lines of GPU buffer work) and
``_dummy_run``, and the cudagraph dispatch happens later in
``execute_model``; there is no method that only decides. This module is
written from scratch after those lines of ``vllm/v1/worker/gpu_model_runner.py``
0.11.1 and calls the release's REAL sync, ``CudagraphDispatcher`` and
``BatchDescriptor``. It follows 0.11.1's lines (0.11.2 has the same code
there): the sync in ``_prepare_inputs`` (1287-1307), ``_get_num_input_tokens``
(2276-2292), ``execute_model``'s choice of the count it runs and its dispatch
(2736-2770), and ``_dummy_run``'s batch, sync and dispatch (3622-3830):

* ``execute_model`` (a regular batch): ``_prepare_inputs`` pads the token
  count for cudagraphs first (``_get_num_input_tokens``: the capture table's
  padding when cudagraphs are on and the batch fits the largest graph),
  computes ``uniform_decode`` from the request counts, syncs with
  ``allow_dp_padding`` = the compilation mode is not NONE and the request
  counts; ``execute_model`` then runs at the agreed count (its own padded
  count when the sync agreed nothing) and dispatches a ``BatchDescriptor`` of
  that count, uniform flag and LoRA state.
* ``_dummy_run`` (dummy and profile runs): syncs the unpadded count with the
  given uniform flag; a profile run does not dispatch (mode NONE), an eager
  one (``cudagraph_runtime_mode=NONE``) dispatches but runs NONE.

``need_eager`` on a regular batch runs it NONE after the dispatch, as
``execute_model`` does when ``calculate_kv_scales`` is set (its only way to
run a batch eagerly with graphs captured; the padding is decided before).

Left out: sequence-parallel padding (off by default), cascade attention
(0.11's ``execute_model`` can pass it, but this model takes no flag, so a case
carrying it is refused and the caller profile draws none on 0.11), everything
after the dispatch (attention metadata, the
forward itself), and the microbatch slice padding ``execute_model`` applies
after the sync (it changes no count the ranks agree on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsim.targets.v1.caller import RunnerState

#: The parameters the modelled caller takes (as :class:`~dpsim.targets.v1.api.V1API`
#: offers them): the 0.12 caller's, plus which of vLLM's two call sites it is.
PARAMETERS = (
    "num_tokens",
    "num_reqs",
    "num_scheduled_tokens_np",
    "max_num_scheduled_tokens",
    "allow_microbatching",
    "force_eager",
    "force_uniform_decode",
    "force_has_lora",
    "dummy_run",
    "is_profile",
)


@dataclass(frozen=True)
class ModelledCaller:
    """The 0.11.x caller, modelled (see the module docstring)."""

    sync: Any
    descriptor: type
    mode_enum: Any
    parameters: tuple[str, ...] = PARAMETERS
    #: It reads every parameter it takes.
    ignored: tuple[str, ...] = ()

    def invoke(self, state: RunnerState, arguments: dict[str, Any]) -> tuple[Any, ...]:
        dispatcher = state.dispatcher
        config = dispatcher.vllm_config
        none = self.mode_enum.NONE
        counts = arguments["num_scheduled_tokens_np"]
        total = int(arguments["num_tokens"])
        num_reqs = int(arguments["num_reqs"])
        largest = int(arguments["max_num_scheduled_tokens"])
        dummy = bool(arguments["dummy_run"])
        cudagraphs_on = state.cudagraph_mode != none
        if dummy:
            uniform = bool(arguments["force_uniform_decode"])
            padded = total
            has_lora = (
                bool(arguments["force_has_lora"]) and config.lora_config is not None
            )
        else:
            uniform = largest == state.uniform_decode_query_len and (
                total == num_reqs * largest
            )
            padded = total
            sizes = config.compilation_config.cudagraph_capture_sizes
            if cudagraphs_on and sizes and total <= max(sizes):
                padded = config.pad_for_cudagraph(total)
            has_lora = state.num_active_loras > 0
        ubatch_slices, across = self.sync(
            num_tokens_unpadded=total,
            parallel_config=state.parallel_config,
            allow_microbatching=arguments["allow_microbatching"],
            allow_dp_padding=cudagraphs_on,
            num_tokens_padded=padded,
            uniform_decode=uniform,
            num_scheduled_tokens_per_request=counts,
        )
        rank = state.parallel_config.data_parallel_rank
        if across is not None:
            runs_at = int(across[rank].item())
        else:
            runs_at = total if dummy else padded
        if arguments["is_profile"]:
            mode, descriptor = none, None
        else:
            mode, descriptor = dispatcher.dispatch(
                self.descriptor(
                    num_tokens=runs_at, uniform_decode=uniform, has_lora=has_lora
                )
            )
        if arguments["force_eager"]:
            mode = none
        if descriptor is None:
            descriptor = self.descriptor(num_tokens=runs_at)
        return mode, descriptor, ubatch_slices, across
