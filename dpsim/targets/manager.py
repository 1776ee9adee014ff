"""Real ``CudaGraphManager`` instances, built without a GPU.

vLLM's manager reads a handful of config attributes in ``__init__``, builds its
capture table in ``_init_candidates`` and dispatches from it; none of that
touches a device. We hand it a plain config object carrying only what it
reads, mark its graphs captured, and from then on its ``dispatch`` is exactly
that version's dispatch. Constructor arguments are matched by introspection,
so a version that lacks (say) ``varlen_decode`` simply never receives it.
"""

from __future__ import annotations

import inspect
from types import MethodType, SimpleNamespace
from typing import TYPE_CHECKING, Any

from dpsim.records.policy import ManagerConfig, Microbatching

if TYPE_CHECKING:
    from dpsim.targets.split_sizes import SplitSizes


class ParallelConfigStandIn:
    """The slice of vLLM's ``ParallelConfig`` that DP-sync code reads.

    ``use_ubatching`` and ``num_ubatches`` follow vLLM's own definitions
    (``enable_dbo or ubatch_size > 1``; ``2 if enable_dbo else ubatch_size``).
    """

    def __init__(
        self,
        *,
        data_parallel_size: int = 1,
        data_parallel_rank: int = 0,
        tensor_parallel_size: int = 1,
        microbatching: Microbatching | None = None,
    ) -> None:
        self.data_parallel_size = data_parallel_size
        self.data_parallel_rank = data_parallel_rank
        self.tensor_parallel_size = tensor_parallel_size
        self.pipeline_parallel_size = 1
        self.disable_nccl_for_dp_synchronization = True
        # vLLM 0.34's DP fault tolerance, off: what a deployment runs unless
        # it opts in (``--enable-fault-tolerance``).
        self.enable_fault_tolerance = False
        if microbatching is None:
            self.enable_dbo = False
            self.ubatch_size = 1
            self.dbo_decode_token_threshold = 32
            self.dbo_prefill_token_threshold = 512
        else:
            self.enable_dbo = microbatching.num_ubatches == 2
            self.ubatch_size = microbatching.num_ubatches
            self.dbo_decode_token_threshold = microbatching.decode_token_threshold
            self.dbo_prefill_token_threshold = microbatching.prefill_token_threshold

    @property
    def use_ubatching(self) -> bool:
        return self.enable_dbo or self.ubatch_size > 1

    @property
    def num_ubatches(self) -> int:
        return 2 if self.enable_dbo else self.ubatch_size

    def __repr__(self) -> str:
        return (
            f"ParallelConfig(dp={self.data_parallel_size}, "
            f"ubatching={self.use_ubatching}, num_ubatches={self.num_ubatches})"
        )


class ConfigView(SimpleNamespace):
    """A vLLM config object holding only what dpsim sets.

    A method the manager calls on it is the version's own, taken from the
    real config class (``real_class``) and bound to this view. Any other
    attribute the manager reads is absent from the configuration being
    modelled, so it reads as off (an empty view, false), the default of
    every such feature switch. ``defaulted`` records those names, dotted
    from the outermost view (``cache_config.use_kda_recoverssm``), in one
    set that every view nested in it shares: what ``dpsim targets`` reports
    as read but not modelled.
    """

    def __init__(self, real_class: type | None = None, **values: Any) -> None:
        super().__init__(**values)
        self.__dict__["_real_class"] = real_class
        self.__dict__["defaulted"] = set()
        self.__dict__["_path"] = ""

    def nest(self, name: str, view: ConfigView) -> ConfigView:
        """Hold ``view`` as this view's ``name``, recording into this one's log."""
        view.__dict__["defaulted"] = self.__dict__["defaulted"]
        view.__dict__["_path"] = f"{self.__dict__['_path']}{name}."
        setattr(self, name, view)
        return view

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        real_class = self.__dict__["_real_class"]
        method = getattr(real_class, name, None) if real_class is not None else None
        if inspect.isfunction(method):
            return MethodType(method, self)
        path = f"{self.__dict__['_path']}{name}"
        self.__dict__["defaulted"].add(path)
        absent = ConfigView()
        absent.__dict__["defaulted"] = self.__dict__["defaulted"]
        absent.__dict__["_path"] = f"{path}."
        return absent

    def __bool__(self) -> bool:
        # An empty view stands for an absent sub-config (``if spec_config:``).
        return bool(
            {k: v for k, v in self.__dict__.items() if k not in _VIEW_INTERNALS}
        )


_VIEW_INTERNALS = frozenset({"_real_class", "defaulted", "_path"})


def _vllm_config(
    config: ManagerConfig,
    compilation_class: type | None,
    mode: Any,
    split: SplitSizes | None,
) -> ConfigView:
    parallel = ParallelConfigStandIn(
        data_parallel_size=config.data_parallel_size,
        tensor_parallel_size=config.tensor_parallel_size,
        microbatching=config.microbatching,
    )
    view = ConfigView(
        parallel_config=parallel,
        speculative_config=None,
        num_speculative_tokens=max(config.decode_query_len - 1, 0),
        lora_config=None,
    )
    compilation = view.nest(
        "compilation_config",
        ConfigView(
            compilation_class,
            cudagraph_capture_sizes=list(config.capture_sizes),
            max_cudagraph_capture_size=config.effective_max_capture_size,
        ),
    )
    scheduler = view.nest(
        "scheduler_config", ConfigView(max_num_seqs=config.max_num_seqs)
    )
    if split is not None:
        from dpsim.targets.split_sizes import SPLIT_FIELDS, SpeculativeConfigStandIn

        for name in SPLIT_FIELDS:
            setattr(compilation, name, None)
        compilation.cudagraph_mode = mode
        # One config per deployment: a draft decode table's is the target's.
        target_query_len = config.draft_decode_for or config.decode_query_len
        view.num_speculative_tokens = target_query_len - 1
        if target_query_len > 1:
            view.speculative_config = SpeculativeConfigStandIn(
                target_query_len - 1, config.varlen_decode
            )
        # The scheduler's budget drops nothing the policy lists
        # (dpsim.targets.split_sizes says why).
        scheduler.max_num_batched_tokens = max(
            config.effective_max_capture_size,
            config.max_num_seqs * target_query_len,
            1,
        )
        view.performance_mode = "balanced"
        split.bind(view)
        split.resolve(view)
    return view


#: Config attributes a release's manager reads that dpsim models, by name, as
#: off (the deployments it models do not use them): reading any other one is
#: news that ``dpsim targets`` reports (:mod:`dpsim.targets.compat`).
MODELLED_OFF = frozenset(
    {
        # recoverSSM (KDA) models' dummy-query cap (0.30+): no such model here.
        "cache_config.use_kda_recoverssm",
    }
)
#: Every constructor argument :func:`build_manager` can pass (each only to a
#: manager that takes it).
OFFERED_MANAGER_ARGUMENTS = (
    "vllm_config",
    "device",
    "cudagraph_mode",
    "decode_query_len",
    "decode_query_lens",
    "decode_request_sizes",
    "lora_capture_cases",
    "varlen_decode",
    "ubatch_runner",
)


class _MicrobatchRunnerPlaceholder:
    """Present so the manager plans microbatched graphs; never runs anything."""

    capture_stream = None


def build_manager(
    manager_class: type,
    mode_enum: Any,
    config: ManagerConfig,
    compilation_class: type | None = None,
    split: SplitSizes | None = None,
) -> Any:
    """Construct ``manager_class`` for ``config`` and mark its graphs captured.

    ``compilation_class`` is the version's own ``CompilationConfig``, whose
    methods the manager may call on its config (older versions round capture
    sizes for spec decode that way). ``split`` is the release's own
    resolution of 0.34's prefill and decode tables
    (:mod:`dpsim.targets.split_sizes`), for a manager that takes
    ``decode_query_lens``; it must be given for one.
    """
    mode = mode_enum[config.cudagraph_mode]
    parameters = inspect.signature(manager_class).parameters
    if split is None and "decode_query_lens" in parameters:
        raise ValueError("a manager taking decode_query_lens needs its SplitSizes")
    vllm_config = _vllm_config(config, compilation_class, mode, split)
    offered: dict[str, Any] = {
        "vllm_config": vllm_config,
        "device": "cpu",
        "cudagraph_mode": mode,
        "decode_query_len": config.decode_query_len,
        "lora_capture_cases": (
            list(config.lora_capture_cases)
            if config.lora_capture_cases is not None
            else None
        ),
        "varlen_decode": config.varlen_decode,
        "ubatch_runner": (
            _MicrobatchRunnerPlaceholder() if config.microbatching else None
        ),
    }
    if split is not None and config.draft_decode_for is not None:
        # What 0.34's autoregressive speculator passes its draft decode manager.
        offered["decode_query_lens"] = {1: config.max_num_seqs}
        offered["decode_request_sizes"] = (
            vllm_config.get_draft_decode_cudagraph_request_sizes()
        )
    elif split is not None:
        offered["decode_query_lens"] = vllm_config.get_decode_cudagraph_query_lens(
            config.decode_query_len
        )
    assert set(offered) <= set(OFFERED_MANAGER_ARGUMENTS)
    kwargs = {name: value for name, value in offered.items() if name in parameters}
    manager = manager_class(**kwargs)
    # Capture would run the model on a GPU; what dispatch needs is only the
    # flag that capture sets when it is done.
    manager._graphs_captured = True
    return manager


def manager_parameters(manager_class: type) -> tuple[str, ...]:
    """The constructor parameters this version's manager accepts."""
    return tuple(inspect.signature(manager_class).parameters)
