"""0.34's split capture tables, resolved by the release's own config code.

From vLLM 0.34 the V2 runner's ``CudaGraphManager`` no longer builds its
table from one list of token counts. It reads two lists that
``VllmConfig`` resolves at start-up: the token counts of the prefill
(token-keyed) graphs, ``prefill_cudagraph_capture_token_sizes``, and the
request counts of the uniform decode graphs,
``decode_cudagraph_capture_request_sizes``, one family of decode graphs per
uniform query length (``decode_query_lens``, from
``VllmConfig.get_decode_cudagraph_query_lens``). A policy states sizes the
way every release before 0.34 took them (``cudagraph_capture_sizes`` and
``max_cudagraph_capture_size``), which 0.34 still accepts as its deprecated
shared sizes.

How 0.34 turns shared sizes into the two lists is not dpsim's to
re-derive: :class:`SplitSizes` runs the release's own
``VllmConfig._split_cudagraph_capture_sizes`` (the step of
``_set_cudagraph_sizes`` that does it) and ``get_decode_cudagraph_query_lens``,
cut out of its ``config/vllm.py``, on the config view dpsim hands the
manager. What the view does not model is a gap, never a made-up value, with
three modelled facts said here once:

* the platform is not SM100 (``is_device_capability_family(100)`` is False),
  the default off Blackwell, so no wider default grids apply;
* ``max_num_batched_tokens`` is at least the policy's largest size and its
  widest decode batch, so the scheduler's budget drops nothing the policy
  lists (as it drops nothing a deployment could run);
* no dynamic speculative decoding schedule, so each table has one uniform
  query length, the policy's ``decode_query_len``;
* with speculative decoding (``decode_query_len`` above 1) the drafter is
  an EAGLE-style autoregressive one, the kind whose one-token draft decodes
  take their own request-count table
  (``VllmConfig.get_draft_decode_cudagraph_request_sizes``), and adaptive
  verification is on exactly when the policy asks for varlen decode graphs.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MethodType, ModuleType, SimpleNamespace
from typing import Any, ClassVar

from dpsim.errors import TargetError

CONFIG_FILE = "config/vllm.py"
#: The ``VllmConfig`` members the resolution runs, all defined in its body.
METHODS = (
    "uniform_decode_query_len",
    "get_decode_cudagraph_query_lens",
    "get_draft_decode_cudagraph_request_sizes",
    "get_varlen_decode_cudagraph_token_sizes",
    "_split_cudagraph_capture_sizes",
)
#: The ``CompilationConfig`` fields 0.34 resolves, unset (None) before it does.
SPLIT_FIELDS = (
    "prefill_cudagraph_capture_token_sizes",
    "max_prefill_cudagraph_capture_tokens",
    "decode_cudagraph_capture_request_sizes",
    "max_decode_cudagraph_capture_requests",
    "max_decode_cudagraph_capture_tokens",
)


def takes_split_sizes(manager_parameters: tuple[str, ...]) -> bool:
    """Whether a release's manager takes 0.34's decode query lengths (and so
    reads the split tables) rather than one ``decode_query_len``."""
    return "decode_query_lens" in manager_parameters


class _Answering:
    """A stand-in the resolution asks: anything it was not written to answer
    is refused, naming the question, never answered as off."""

    OWNER: ClassVar[str]

    def __getattr__(self, name: str) -> Any:
        raise TargetError(
            f"vLLM's capture-size resolution asked {self.OWNER}.{name}, "
            "which dpsim does not model"
        )


class _NotBlackwell(_Answering):
    """``vllm.platforms.current_platform`` as the resolution asks it: the one
    question it asks, answered for the platform dpsim models."""

    OWNER = "current_platform"

    @staticmethod
    def is_device_capability_family(family: int) -> bool:
        return False


class SpeculativeConfigStandIn(_Answering):
    """``speculative_config`` of a deployment with an EAGLE-style drafter:
    what the resolution asks of it, and nothing else."""

    OWNER = "speculative_config"
    method = "eagle"

    def __init__(self, num_speculative_tokens: int, adaptive: bool) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.enable_adaptive_verification = adaptive

    @staticmethod
    def uses_dynamic_speculative_decoding() -> bool:
        return False

    @staticmethod
    def use_multi_module_mtp() -> bool:
        return False

    @staticmethod
    def use_gemma4_mtp() -> bool:
        return False


class _Logger:
    """vLLM's logger, silent: the resolution warns about deprecated sizes."""

    def _quiet(self, *args: Any, **kwargs: Any) -> None:
        return None

    warning = warning_once = info = info_once = debug = _quiet


@dataclass(frozen=True)
class SplitSizes:
    """A release's resolution of split capture tables, ready to run on a view."""

    #: ``VllmConfig``'s own functions, by name (properties as their getter).
    functions: Mapping[str, Callable[..., Any]]

    def bind(self, view: Any) -> None:
        """Give ``view`` (a ``ConfigView`` of a ``VllmConfig``) the members
        the manager and the resolution call, as the release defines them."""
        getter = self.functions["uniform_decode_query_len"]
        for name, function in self.functions.items():
            if function is not getter:
                view.__dict__[name] = MethodType(function, view)
        view.__dict__["uniform_decode_query_len"] = getter(view)

    def resolve(self, view: Any) -> None:
        """Resolve ``view``'s compilation config into the split tables, in
        place, for the target's decode query lengths, as
        ``VllmConfig._set_cudagraph_sizes`` does once per deployment."""
        query_lens = view.get_decode_cudagraph_query_lens(view.uniform_decode_query_len)
        view._split_cudagraph_capture_sizes(True, query_lens)


def load_split_sizes(
    package_dir: Path,
    version: str | None,
    compilation: ModuleType,
    math_utils: ModuleType,
) -> SplitSizes:
    """The release's resolution, cut from ``package_dir``'s ``config/vllm.py``
    with the names it uses taken from its own ``config/compilation.py`` and
    ``utils/math_utils.py``;
    a one-line :class:`TargetError` when the file or a member is missing."""
    # Imported here: the cut-out machinery lives with the runner lane, which
    # imports this layer.
    from dpsim.lanes.runner.extract import real_class

    path = package_dir / CONFIG_FILE
    if not path.is_file():
        raise TargetError(
            f"vllm {version or '(this tree)'}: its CudaGraphManager takes "
            f"decode_query_lens (vLLM 0.34+), whose tables vllm/{CONFIG_FILE} "
            "resolves, and that file is not there"
        )
    stand_in_modules = {
        "vllm.platforms": SimpleNamespace(current_platform=_NotBlackwell())
    }

    def import_(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in stand_in_modules:
            return stand_in_modules[name]
        raise TargetError(
            f"vLLM's capture-size resolution imports {name}, which dpsim does not model"
        )

    own_builtins = dict(builtins.__dict__, __import__=import_)
    names: dict[str, Any] = {
        name: compilation.__dict__[name]
        for name in (
            "CUDAGraphMode",
            "prefill_cudagraph_capture_grid",
            "decode_cudagraph_capture_grid",
            "decode_cudagraph_capture_shapes",
            "varlen_decode_cudagraph_capture_grid",
        )
        if name in compilation.__dict__
    }
    names["cdiv"] = math_utils.cdiv
    rebuilt = real_class(
        path,
        "VllmConfig",
        METHODS,
        version=version,
        globals_={"__builtins__": own_builtins, "logger": _Logger(), **names},
        bases=(object,),
    )
    functions: dict[str, Callable[..., Any]] = {}
    for name in METHODS:
        member = rebuilt.__dict__[name]
        function = member.fget if isinstance(member, property) else member
        assert callable(function)
        functions[name] = function
    return SplitSizes(functions)
