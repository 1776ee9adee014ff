"""One call interface over every version's DP-sync API, found by introspection.

vLLM's sync function changed name, parameters and return type release by
release (see DESIGN.md). Rather than a table keyed by version strings, the
adapter reads the loaded module: which entry point exists, which parameters it
takes, what its agreement object holds, and which collective its source
issues. Callers then pass :class:`SyncInputs` and get back the version's own
descriptor and agreement, which :func:`describe` and :func:`agreement_of`
turn into the plain, comparable values of :mod:`dpsim.records.sync`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dpsim.errors import TargetError
from dpsim.records.case import SyncInputs
from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import Agreement, Descriptor
from dpsim.targets.shim import function
from dpsim.targets.spec import OLDEST_RELEASE

DISPATCH_AND_SYNC = "dispatch_cg_and_sync_dp"
SYNC_ONLY = "sync_cudagraph_and_dp_padding"
LEGACY = "get_cudagraph_and_dp_padding"
REUSE_PARAMETERS = ("dp_sync_state", "dp_sync")

#: SyncInputs field -> the feature a version must have to accept a non-default.
_OPTIONAL_INPUTS = {
    "max_query_len": "max_query_len",
    "need_eager": "need_eager",
    "num_active_loras": "num_active_loras",
    "allow_ubatching": "allow_ubatching",
    "uniform_decode": "uniform_decode",
    "allow_skip_drafts": "allow_skip_drafts",
    # The V1 caller's; no V2 sync has the parameter, so a case carrying
    # encoder requests is refused on V2 rather than run without them.
    "num_encoder_reqs": "num_encoder_reqs",
    # The V1 caller's too (use_cascade_attn): refused on V2 likewise.
    "cascade_attn": "cascade_attn",
}


@dataclass(frozen=True)
class SyncAPI:
    """How to call one loaded version, and what it offers."""

    entry: str
    parameters: tuple[str, ...]
    #: The parameter that takes a prior agreement for reuse, if any.
    reuse_parameter: str | None
    #: Fields of the version's ``DPSyncState``; empty when it returns a tensor.
    agreement_fields: tuple[str, ...]
    #: Fields of the version's ``BatchExecutionDescriptor``.
    descriptor_fields: tuple[str, ...]
    #: How the sync reaches the other ranks, read off its source.
    collective: str
    #: Rows of the all-reduced tensor, read off its source (None if not found).
    tensor_rows: int | None
    _sync: Callable[..., Any] = dataclasses.field(repr=False, compare=False)
    _descriptor_class: type = dataclasses.field(repr=False, compare=False)
    _none_mode: Any = dataclasses.field(repr=False, compare=False)

    def has(self, feature: str) -> bool:
        """Whether the sync takes the parameter ``feature`` (or can reuse, for "reuse")."""
        if feature == "reuse":
            return self.reuse_parameter is not None
        return feature in self.parameters

    @property
    def features(self) -> tuple[str, ...]:
        named = [name for name in _OPTIONAL_INPUTS.values() if name in self.parameters]
        if self.reuse_parameter is not None:
            named.append("reuse")
        if "skip_drafts" in self.agreement_fields:
            named.append("skip_drafts")
        return tuple(named)

    def call(
        self,
        manager: Any,
        inputs: SyncInputs,
        dp_size: int,
        dp_rank: int,
        *,
        parallel_config: Any = None,
        reuse: Any = None,
    ) -> tuple[Any, Any]:
        """Run the version's sync for one rank; return its own (descriptor, agreement)."""
        self._refuse_unsupported(inputs, reuse)
        if self.entry == SYNC_ONLY:
            return self._call_sync_only(manager, inputs, dp_size, dp_rank)
        # A reuse this sync cannot take was refused above.
        caller = self._fresh_call if reuse is None else self._reusing_call
        return caller(manager, inputs, dp_size, dp_rank, parallel_config, reuse)

    def _call_sync_only(
        self, manager: Any, inputs: SyncInputs, dp_size: int, dp_rank: int
    ) -> tuple[Any, Any]:
        # 0.18-0.19 have no dispatch-and-sync entry: their model runner
        # dispatched locally, then synced only when dp_size > 1. Do the same.
        if inputs.need_eager or manager is None:
            desired = self._descriptor_class(
                cg_mode=self._none_mode,
                num_tokens=inputs.num_tokens,
                num_reqs=inputs.num_reqs,
            )
        else:
            desired = manager.dispatch(
                inputs.num_reqs, inputs.num_tokens, inputs.uniform_token_count
            )
        if dp_size == 1:
            return desired, None
        return self._sync(
            manager,
            desired,
            inputs.num_tokens,
            inputs.num_reqs,
            inputs.uniform_token_count,
            dp_size,
            dp_rank,
        )

    def describe(self, native: Any) -> Descriptor:
        """This version's descriptor as plain values (:func:`describe`)."""
        return describe(native)

    def agreement(self, native: Any) -> Agreement | None:
        """This version's agreement as plain values (:func:`agreement_of`)."""
        return agreement_of(native)

    def unsupported_input(self, inputs: SyncInputs) -> str | None:
        """The first input set away from its default that this sync cannot take."""
        read, defaults = self._refused_reading
        if read(inputs) == defaults:
            return None  # every sync of every rank: one C call, not a loop
        for name, default in self._optional_refused:
            if getattr(inputs, name) != default:
                return name
        return None

    # Both read on every call: worked out once per loaded version.
    @functools.cached_property
    def _optional_taken(self) -> tuple[str, ...]:
        """The optional inputs this sync takes, passed by name."""
        return tuple(name for name in _OPTIONAL_INPUTS if name in self.parameters)

    @functools.cached_property
    def _fresh_call(self) -> _Caller:
        """The call of a sync that reuses no agreement (:func:`_caller`)."""
        return _caller(self._sync, self._passed_by_name(reuse=False))

    @functools.cached_property
    def _reusing_call(self) -> _Caller:
        """The call of a sync handed an agreement to reuse (:func:`_caller`)."""
        return _caller(self._sync, self._passed_by_name(reuse=True))

    def _passed_by_name(self, *, reuse: bool) -> tuple[tuple[str, str], ...]:
        """(parameter, the caller's expression for it) for each argument passed
        by name: the optional inputs this sync takes, then its
        ``parallel_config``, then the agreement to reuse."""
        passed = [(name, f"inputs.{name}") for name in self._optional_taken]
        if "parallel_config" in self.parameters:
            passed.append(("parallel_config", "parallel_config"))
        if reuse and self.reuse_parameter is not None:
            passed.append((self.reuse_parameter, "reuse"))
        return tuple(passed)

    @functools.cached_property
    def _optional_refused(self) -> tuple[tuple[str, Any], ...]:
        """The optional inputs this sync cannot take, with the default it
        assumes, in :data:`_OPTIONAL_INPUTS` order."""
        return tuple(
            (name, SyncInputs.__dataclass_fields__[name].default)
            for name, feature in _OPTIONAL_INPUTS.items()
            if feature not in self.parameters
            # emulated, as the 0.18-0.19 model runner did
            and not (name == "need_eager" and self.entry == SYNC_ONLY)
        )

    @functools.cached_property
    def _refused_reading(self) -> tuple[Callable[[SyncInputs], Any], Any]:
        """What reads the refused inputs' values at once, and their defaults
        as it gives them (a tuple for several, one value for one)."""
        names = tuple(name for name, _ in self._optional_refused)
        defaults = tuple(default for _, default in self._optional_refused)
        if not names:
            return (lambda inputs: None), None
        if len(names) == 1:
            return operator.attrgetter(names[0]), defaults[0]
        return operator.attrgetter(*names), defaults

    def _refuse_unsupported(self, inputs: SyncInputs, reuse: Any) -> None:
        name = self.unsupported_input(inputs)
        if name is not None:
            raise ValueError(f"this version's sync takes no {name}")
        if reuse is not None and self.reuse_parameter is None:
            raise ValueError("this version's sync cannot reuse an agreement")


#: ``(manager, inputs, dp_size, dp_rank, parallel_config, reuse)`` -> what
#: the version's sync returned.
_Caller = Callable[[Any, SyncInputs, int, int, Any, Any], tuple[Any, Any]]


def _caller(sync: Callable[..., Any], by_name: tuple[tuple[str, str], ...]) -> _Caller:
    """A function that calls ``sync`` with the dispatch-and-sync entry's four
    leading arguments and ``dp_size, dp_rank`` by position, then ``by_name``'s
    arguments by name, written out as source once per version and call form.

    The same call as ``sync(*positional, **kwargs)`` with a dict built per
    call, but one CPython 3.11 runs in the caller's own C eval loop: a call
    through ``**`` goes through ``CALL_FUNCTION_EX`` and starts a second C eval
    frame, which sits in every rank's C stack slice (464 of its 1,944 bytes)
    that greenlet copies out and back at each switch made inside the sync.
    The parameter names are the sync's own (read off its signature, so
    identifiers) and the expressions this module's.
    """
    keywords = "".join(f", {name}={expression}" for name, expression in by_name)
    source = (
        "def call(manager, inputs, dp_size, dp_rank, parallel_config, reuse):\n"
        "    return sync(manager, inputs.num_reqs, inputs.num_tokens,"
        f" inputs.uniform_token_count, dp_size, dp_rank{keywords})\n"
    )
    namespace: dict[str, Any] = {"sync": sync}
    exec(compile(source, f"<dpsim's call of {sync.__qualname__}>", "exec"), namespace)
    call: _Caller = namespace["call"]
    return call


def adapt(dp_utils: ModuleType, cudagraph_utils: ModuleType, mode_enum: Any) -> SyncAPI:
    """Introspect a loaded ``dp_utils`` module; refuse what no adapter supports."""
    entry_function = function(dp_utils, DISPATCH_AND_SYNC)
    entry = DISPATCH_AND_SYNC
    if entry_function is None:
        entry_function = function(dp_utils, SYNC_ONLY)
        entry = SYNC_ONLY
    if entry_function is None:
        if function(dp_utils, LEGACY) is not None:
            raise TargetError(
                f"{dp_utils.__file__} exposes {LEGACY} (the vLLM 0.15-0.17 API, "
                "with no capture manager), which dpsim does not adapt; "
                f"use vLLM {OLDEST_RELEASE} or later"
            )
        raise TargetError(
            f"{dp_utils.__file__} defines neither {DISPATCH_AND_SYNC} nor "
            f"{SYNC_ONLY}: not a vLLM dp_utils module"
        )
    descriptor_class: Any = cudagraph_utils.__dict__.get("BatchExecutionDescriptor")
    if not isinstance(descriptor_class, type) or not dataclasses.is_dataclass(
        descriptor_class
    ):
        raise TargetError(
            f"{cudagraph_utils.__file__} defines no BatchExecutionDescriptor dataclass"
        )
    parameters = tuple(inspect.signature(entry_function).parameters)
    expected = (
        ("cudagraph_manager", "num_reqs", "num_tokens", "uniform_token_count")
        if entry == DISPATCH_AND_SYNC
        else ("cudagraph_manager", "desired_batch_desc", "num_tokens", "num_reqs")
    )
    if parameters[: len(expected)] != expected or "dp_rank" not in parameters:
        raise TargetError(
            f"{dp_utils.__file__}: {entry}{inspect.signature(entry_function)} "
            "has a signature no dpsim adapter supports"
        )
    state_class = dp_utils.__dict__.get("DPSyncState")
    agreement_fields = (
        tuple(field.name for field in dataclasses.fields(state_class))
        if state_class is not None and dataclasses.is_dataclass(state_class)
        else ()
    )
    collective, rows = _read_collective(Path(dp_utils.__file__ or ""))
    return SyncAPI(
        entry=entry,
        parameters=parameters,
        reuse_parameter=next(
            (name for name in REUSE_PARAMETERS if name in parameters), None
        ),
        agreement_fields=agreement_fields,
        descriptor_fields=tuple(
            field.name for field in dataclasses.fields(descriptor_class)
        ),
        collective=collective,
        tensor_rows=rows,
        _sync=entry_function,
        _descriptor_class=descriptor_class,
        _none_mode=mode_enum.NONE,
    )


def _read_collective(path: Path) -> tuple[str, int | None]:
    """Name the collective the source issues, and the rows of its tensor."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return "unknown", None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names: list[str] = []
    rows: int | None = None
    skippable = False
    for call in calls:
        callee = call.func
        if isinstance(callee, ast.Attribute):
            if callee.attr == "all_reduce" and _is_name(callee.value, "dist"):
                names.append("torch.distributed.all_reduce")
            elif callee.attr == "cpu_all_reduce_":
                names.append("get_dp_group().cpu_all_reduce_")
            elif (
                callee.attr == "zeros"
                and _is_name(callee.value, "torch")
                and rows is None
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[0].value, int)
                and len(call.args) > 1
            ):
                rows = call.args[0].value
        elif (
            isinstance(callee, ast.Name) and callee.id == "should_skip_dp_coordination"
        ):
            skippable = True
    unique = list(dict.fromkeys(names))
    described = " or ".join(unique) if unique else "none found"
    if skippable:
        described += ", skipped under skip_dp_coordination()"
    return described, rows


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def dispatch(
    manager: Any,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None = None,
    **optional: Any,
) -> Any:
    """Call any version's ``manager.dispatch``, passing only what it accepts.

    ``num_active_loras`` became a required parameter in 0.24; a version that
    takes it gets 0 unless told otherwise.
    """
    ask = dispatcher(manager, *optional)
    return ask(manager, num_reqs, num_tokens, uniform_token_count, *optional.values())


def dispatcher(manager: Any, *names: str) -> Callable[..., Any]:
    """:func:`dispatch` for ``manager``'s release as a function of
    ``(manager, num_reqs, num_tokens, uniform_token_count, *values)``, the
    values given in ``names`` order: for callers that ask one table many
    times, with the same names each time (the oracle, per rank per step)."""
    method = manager.dispatch
    return _dispatcher(getattr(method, "__func__", method), names)


@functools.lru_cache(maxsize=256)
def _dispatcher(
    unbound: Callable[..., Any], names: tuple[str, ...]
) -> Callable[..., Any]:
    # Written out once per release's dispatch and names: dispatch() worked
    # out the names it passes on every call, and called through **kwargs,
    # about 11 k instructions a call beside the release's own 8 k.
    accepted = _parameters(unbound)
    passed = [name for name in names if name in accepted]
    if "num_active_loras" in accepted and "num_active_loras" not in names:
        passed.append("num_active_loras")
    given = {name: f"value_{index}" for index, name in enumerate(names)}
    keywords = "".join(f", {name}={given.get(name, '0')}" for name in passed)
    source = (
        f"def ask(manager, num_reqs, num_tokens, uniform_token_count"
        f"{''.join(', ' + value for value in given.values())}):\n"
        "    return manager.dispatch(num_reqs, num_tokens, uniform_token_count"
        f"{keywords})\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "<dpsim's call of dispatch>", "exec"), namespace)
    ask: Callable[..., Any] = namespace["ask"]
    return ask


def parameters_of(method: Callable[..., Any]) -> frozenset[str]:
    """The parameter names a release's method takes (a bound method's own
    ``self`` included), read once per function."""
    unbound = getattr(method, "__func__", None)
    if unbound is None:
        return frozenset(inspect.signature(method).parameters)
    return _parameters(unbound)


@functools.lru_cache(maxsize=256)
def _parameters(unbound: Callable[..., Any]) -> frozenset[str]:
    # Read once per release's dispatch: inspect.signature cost about a sixth
    # of a simulated case, asked on every expected-choice dispatch.
    return frozenset(inspect.signature(unbound).parameters)


def describe(native: Any) -> Descriptor:
    """A version's ``BatchExecutionDescriptor`` as plain values."""
    # Made for every sync of every rank and every expected choice: the mode
    # by a lookup (the enum's own call for a name it may refuse), each count
    # through int() only when it is not one already (0.18-0.27 can hand back
    # a 0-d tensor; int() of an int costs as much as the rest of a field),
    # and the record without its per-field frozen sets.
    mode = plain_mode(native.cg_mode)
    num_tokens = native.num_tokens
    num_reqs = native.num_reqs
    uniform = getattr(native, "uniform_token_count", None)
    bound = getattr(native, "max_query_len", None)
    loras = getattr(native, "num_active_loras", 0)
    parts = getattr(native, "num_ubatches", 1)
    return Descriptor.unchecked(
        mode,
        num_tokens if type(num_tokens) is int else int(num_tokens),
        num_reqs if num_reqs is None or type(num_reqs) is int else int(num_reqs),
        uniform if uniform is None or type(uniform) is int else int(uniform),
        bound if bound is None or type(bound) is int else int(bound),
        loras if type(loras) is int else int(loras),
        parts if type(parts) is int else int(parts),
    )


def plain_mode(native: Any) -> CudagraphMode:
    """A release's own ``CUDAGraphMode`` member as dpsim's, by name (the
    enum's own call, which refuses an unknown name, only on a miss)."""
    # _name_, the member's own attribute (the enum docs' sunder names):
    # ``name`` reaches it through two Python calls.
    name = native._name_
    return _MODE_NAMED.get(name) or CudagraphMode(name)


_MODE_NAMED = {mode.value: mode for mode in CudagraphMode}


def agreement_of(native: Any) -> Agreement | None:
    """A version's agreement (``DPSyncState``, tensor or None) as plain values."""
    if native is None:
        return None
    # dataclasses.is_dataclass for an instance, without its call.
    if not hasattr(type(native), "__dataclass_fields__"):
        return Agreement(num_tokens_across_dp=_counts(native))
    return _state_agreement(native)


def _state_agreement(state: Any) -> Agreement:
    skip_drafts = getattr(state, "skip_drafts", _ABSENT)
    max_query_len = getattr(state, "max_query_len", _ABSENT)
    eager = state.eager
    return Agreement.unchecked(
        _counts(state.num_tokens_across_dp),
        _optional_int(state.uniform_token_count),
        eager if type(eager) is bool else bool(eager),
        _optional_int(getattr(state, "num_reqs", None)),
        None if skip_drafts is _ABSENT else bool(skip_drafts),
        None if max_query_len is _ABSENT else _optional_int(max_query_len),
        max_query_len is not _ABSENT,
    )


def _counts(tensor: Any) -> tuple[int, ...]:
    """A release's per-rank counts tensor as a tuple of ints; anything but
    one row of counts (a 0-d tensor, a table) is refused by name."""
    values = tensor.tolist()
    # One type throughout: a 1-d integer tensor's are ints already, and
    # int() of each cost twice the tolist(). Anything else (bools, floats)
    # goes through map(int).
    if type(values) is list and values and type(values[0]) is int:
        return tuple(values)
    if type(values) is not list or any(type(value) is list for value in values):
        shape = tuple(getattr(tensor, "shape", ()))
        raise TypeError(
            f"the agreed counts are not one row of per-rank counts: shape {shape}"
        )
    return tuple(map(int, values))


_ABSENT = object()


def _optional_int(value: Any) -> int | None:
    # 0.18-0.27 can hand back a 0-d tensor where an int is meant.
    return value if value is None or type(value) is int else int(value)
