"""The target's lines and branches no run can reach, each with its reason.

The mechanism, matching by text so an entry survives line moves between
releases, is :mod:`dpsim.coverage.marks`. ``dpsim check --coverage`` lists a
matched branch apart with its reason instead of as missing.

"Unreachable" means: not by ``dpsim check`` under its defaults (2..16 ranks,
the sync lane's callers), for the reason given; an entry with ``profiles``
holds for those profiles only (the caller profile draws only what vLLM's
callers pass, so a branch they never reach is marked for it alone, with the
caller's lines that show why). An entry the run does reach is
reported as reached, and one that matches nothing as stale, so the table
cannot quietly go out of date.
"""

from __future__ import annotations

from .marks import Unreachable

_V2 = "v1/worker/gpu/dp_utils.py"
_V1 = "v1/worker/dp_utils.py"
_V1_CALLER = "v1/worker/gpu_model_runner.py"
_V1_METHOD = "GPUModelRunner._determine_batch_execution_and_padding"
_V1_DISPATCHER = "v1/cudagraph_dispatcher.py"

#: Why vLLM's V2 callers never sync a step on which no rank has work.
_EVERY_RANK_HAS_WORK = (
    "vLLM's callers never reach this: every V2 rank that syncs has a token. "
    "execute_model (v1/worker/gpu/model_runner.py) returns before the sync "
    "when nothing is scheduled (0.29.0 line 1534, 0.33.0 line 1792), and a "
    "dummy run of no requests would raise at "
    "`max(scheduler_output.num_scheduled_tokens.values())` before it (0.29.0 "
    "line 1544, 0.33.0 line 1802); the worker's dummy batch has "
    "uniform_decode_query_len tokens, and the speculators sync only after a "
    "forward, with a token per request at least (0.29.0 "
    "spec_decode/autoregressive/speculator.py line 341). The contract profile "
    "reaches it: the signature takes 0 tokens"
)

#: Why a single DP rank is never simulated by ``check``.
_ONE_RANK = (
    "one DP rank: check draws 2..16 ranks by default, since a lone rank has "
    "nothing to agree on (`--ranks 1..16`, mutate's default, runs this branch)"
)

_RUNNER_HELPER = (
    "a helper the model runner calls, not the sync: the sync lane runs the "
    "sync functions under its modelled callers (the runner lane runs the "
    "model runner)"
)
_STOOD_IN_SWITCH = (
    "dpsim stands in should_skip_dp_coordination with a per-rank switch "
    "(targets/standins.py) that the scenario programs set for their solo "
    "syncs: one ContextVar would be shared by every virtual rank"
)
_DEVICE_GROUP = (
    "dpsim's V1 parallel config keeps vLLM's default "
    "disable_nccl_for_dp_synchronization=False (targets/v1/load.py): the CPU "
    "path only logs and picks the CPU group for the same all-reduce, which "
    "the simulator fakes alike"
)
_CALLER_GUARDS_DP = (
    "its only caller, _determine_batch_execution_and_padding, calls it only "
    "when data_parallel_size > 1"
)
_CALLER_PADS = (
    "its only caller, _determine_batch_execution_and_padding, always passes "
    "num_tokens_padded (the dispatcher's padded count)"
)
_ALWAYS_COUNTS = (
    "with more than one rank coordinate_batch_across_dp always returns the "
    "per-rank counts (None only for one rank, which check does not draw)"
)
_LORA_SLOTS = (
    "no batch has more adapters active than max_loras (the LoRA slots), and "
    "vLLM captures max_loras + 1 as its largest count (targets/v1/dispatcher.py "
    "lora_settings), so a captured count at least as large always exists"
)
_FULL_EVERYWHERE = (
    "reached only when the agreed mode is FULL and this rank has no FULL key "
    "at the padded count: every rank voted FULL at its own count, and FULL "
    "keys are captured for every size x LoRA case (uniform-decode keys for "
    "every size whole decodes fill), so the padded count, another rank's FULL "
    "size, has one for this rank too"
)
_NO_SP = (
    "dpsim models one tensor-parallel rank and no sequence parallelism "
    "(pass_config.enable_sp off): SP only rounds a rank's count up to a "
    "multiple of the TP size before it is dispatched"
)
_NO_METRICS = (
    "dpsim's modelled V1 config has cudagraph_metrics off "
    "(targets/v1/caller.py): the stats only describe the padding already "
    "chosen and decide nothing"
)


def _v1_lines(
    releases: str, function: str, lines: tuple[str, ...], reason: str
) -> tuple[Unreachable, ...]:
    return tuple(
        Unreachable(releases, _V1, function, line, None, reason) for line in lines
    )


UNREACHABLE: tuple[Unreachable, ...] = (
    Unreachable(
        releases=">=0.20",
        file=_V2,
        function="dispatch_cg_and_sync_dp",
        source="if dp_size == 1:",
        to="return batch_desc, None",
        reason=_ONE_RANK,
    ),
    Unreachable(
        releases=">=0.20",
        file=_V2,
        function="dispatch_cg_and_sync_dp",
        source="return batch_desc, None",
        to=None,
        reason=_ONE_RANK,
    ),
    Unreachable(
        releases=">=0.18",
        file=_V2,
        function="sync_cudagraph_and_dp_padding",
        source="if torch.all(num_tokens_across_dp == 0).item():",
        to="synced_desc = BatchExecutionDescriptor(",
        reason=_EVERY_RANK_HAS_WORK,
        profiles=("caller",),
    ),
    *(
        Unreachable(
            ">=0.18",
            _V2,
            "sync_cudagraph_and_dp_padding",
            line,
            None,
            _EVERY_RANK_HAS_WORK,
            profiles=("caller",),
        )
        for line in (
            "synced_desc = BatchExecutionDescriptor(",
            "return synced_desc, None",
        )
    ),
    *(
        Unreachable(
            ">=0.18,<0.20", _V2, "make_num_tokens_across_dp", line, None, _RUNNER_HELPER
        )
        for line in (
            "if dp_size == 1:",
            "return None",
            'return torch.full((dp_size,), num_tokens, dtype=torch.int32, device="cpu")',
        )
    ),
    # -- V1: coordinate_batch_across_dp and its helpers ----------------------
    *_v1_lines(
        ">=0.30",
        "skip_dp_coordination",
        (
            "token = _skip_dp_coordination.set(True)",
            "try:",
            "yield",
            "_skip_dp_coordination.reset(token)",
        ),
        _STOOD_IN_SWITCH,
    ),
    *_v1_lines(
        ">=0.30",
        "should_skip_dp_coordination",
        ("return _skip_dp_coordination.get()",),
        _STOOD_IN_SWITCH,
    ),
    *_v1_lines(
        ">=0.11",
        "_get_device_and_group",
        ("logger.info_once(", 'device = "cpu"', "group = get_dp_group().cpu_group"),
        _DEVICE_GROUP,
    ),
    Unreachable(
        ">=0.11",
        _V1,
        "_get_device_and_group",
        "if parallel_config.disable_nccl_for_dp_synchronization:",
        "logger.info_once(",
        _DEVICE_GROUP,
    ),
    *(
        mark
        for releases, early_exit in (
            (">=0.12,<0.13", "return None, None"),
            (">=0.13", "return False, None, cudagraph_mode"),
        )
        for mark in (
            Unreachable(
                releases,
                _V1,
                "coordinate_batch_across_dp",
                "if parallel_config.data_parallel_size == 1:",
                early_exit,
                _CALLER_GUARDS_DP,
            ),
            *_v1_lines(
                releases, "coordinate_batch_across_dp", (early_exit,), _CALLER_GUARDS_DP
            ),
        )
    ),
    Unreachable(
        ">=0.11",
        _V1,
        "coordinate_batch_across_dp",
        "if num_tokens_padded is None:",
        "num_tokens_padded = num_tokens_unpadded",
        _CALLER_PADS,
    ),
    *_v1_lines(
        ">=0.11",
        "coordinate_batch_across_dp",
        ("num_tokens_padded = num_tokens_unpadded",),
        _CALLER_PADS,
    ),
    # -- V1: the caller method --------------------------------------------------
    # Before 0.13 the method returns right after the DP block (no stats).
    *(
        Unreachable(releases, _V1_CALLER, _V1_METHOD, source, after_dp, reason)
        for releases, after_dp in (
            (
                ">=0.12,<0.13",
                "return cudagraph_mode, batch_descriptor, ubatch_slices, "
                "num_tokens_across_dp",
            ),
            (">=0.13", "cudagraph_stats = None"),
        )
        for source, reason in (
            ("if self.vllm_config.parallel_config.data_parallel_size > 1:", _ONE_RANK),
            ("if num_tokens_across_dp is not None:", _ALWAYS_COUNTS),
        )
    ),
    Unreachable(
        ">=0.13",
        _V1_CALLER,
        _V1_METHOD,
        "if self.vllm_config.observability_config.cudagraph_metrics:",
        "cudagraph_stats = CUDAGraphStat(",
        _NO_METRICS,
    ),
    Unreachable(
        ">=0.13",
        _V1_CALLER,
        _V1_METHOD,
        "cudagraph_stats = CUDAGraphStat(",
        None,
        _NO_METRICS,
    ),
    # -- V1: the dispatcher ------------------------------------------------------
    *(
        Unreachable(
            releases,
            _V1_DISPATCHER,
            "CudagraphDispatcher.dispatch",
            "if idx < len(self.captured_lora_counts):",
            after_lora,
            _LORA_SLOTS,
        )
        for releases, after_lora in (
            (">=0.16,<0.18", "batch_desc = self._create_padded_batch_descriptor("),
            (
                ">=0.18",
                "normalized_uniform = uniform_decode and "
                "self.cudagraph_mode.separate_routine()",
            ),
        )
    ),
    Unreachable(
        ">=0.18",
        _V1_DISPATCHER,
        "CudagraphDispatcher.dispatch",
        "if CUDAGraphMode.PIECEWISE in allowed_modes:",
        "assert CUDAGraphMode.NONE in allowed_modes, (",
        _FULL_EVERYWHERE,
    ),
    # -- V1: sequence parallelism (the caller's padding, 0.12-0.32) -------------
    Unreachable(
        ">=0.12,<0.33",
        _V1_CALLER,
        "GPUModelRunner._pad_for_sequence_parallelism",
        "if self.compilation_config.pass_config.enable_sp and tp_size > 1:",
        "return round_up(num_scheduled_tokens, tp_size)",
        _NO_SP,
    ),
    Unreachable(
        ">=0.12,<0.33",
        _V1_CALLER,
        "GPUModelRunner._pad_for_sequence_parallelism",
        "return round_up(num_scheduled_tokens, tp_size)",
        None,
        _NO_SP,
    ),
    Unreachable(
        ">=0.14,<0.33",
        _V1_CALLER,
        _V1_METHOD,
        "if self.compilation_config.pass_config.enable_sp:",
        "assert (",
        _NO_SP,
    ),
    Unreachable(">=0.14,<0.33", _V1_CALLER, _V1_METHOD, "assert (", None, _NO_SP),
)
