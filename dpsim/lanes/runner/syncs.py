"""Each sync the real vLLM code makes, recorded as the sync lane records its own.

The runner lane runs vLLM's real callers of ``dispatch_cg_and_sync_dp`` (the
model runner's ``execute_model``, reached from a real step or from
``_dummy_run``, and the speculators' ``propose``). :func:`recording_sync`
wraps the release's real function: the callers get a callable with its
signature (it is what their module's global ``dispatch_cg_and_sync_dp``
resolves to), it calls the real function, and it leaves a ``sync`` event in
the running rank's trace: a :class:`~dpsim.records.sync.SyncRecord` whose
inputs are the real call's arguments mapped back to a
:class:`~dpsim.records.case.RankBatch` and whose outputs are read through the
target's adapter, exactly as :func:`dpsim.scenarios.ranks.sync` records a
sync of the sync lane. So the sync lane's per-sync properties judge the syncs
the real code made.

Phase names pair records across ranks the way the DP all-reduce pairs the
calls: ``iter K model`` is the rank's K-th model-runner sync (a real step's or
a dummy batch's: the ``kind`` of its inputs says which), and the drafter's
syncs after it are ``iter K drafter prefill``, ``iter K drafter decode``,
``iter K drafter decode 2``, ... in the order the speculator makes them.
``K`` counts forward steps, not the engine loop's iterations: an idle
engine's loop turns without a step (and without a sync), so two ranks' loop
counters differ while their forward steps still pair one to one.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from types import FrameType, MappingProxyType
from typing import Any, Protocol

from dpsim.lanes.runner.where import is_vllm_file
from dpsim.records.case import RankBatch
from dpsim.records.sync import REUSE_GIVEN_EVENT, SYNC_EVENT, Agreement, SyncRecord
from dpsim.scenarios.ranks import record
from dpsim.targets import runtime
from dpsim.targets.adapters import REUSE_PARAMETERS
from dpsim.targets.api import TargetAPI

#: The caller kinds a phase is named after.
MODEL = "model"
DRAFTER = "drafter"

#: The event a stood-in drafter forward leaves (``{"tokens": N}``), one per
#: forward; ``drafter-forwards`` counts them per forward step.
DRAFTER_FORWARD_EVENT = "drafter_forward"

#: Where the callers live, read off the code objects' real file names.
_SPECULATOR_DIR = "spec_decode"
_DUMMY_RUN = "_dummy_run"
_BATCH_FIELDS = (
    "num_reqs",
    "num_tokens",
    "uniform_token_count",
    "max_query_len",
    "need_eager",
    "num_active_loras",
    "allow_ubatching",
    "uniform_decode",
    "allow_skip_drafts",
)
_OPTIONAL_INTS = frozenset({"uniform_token_count", "max_query_len"})


class _HasAPI(Protocol):
    @property
    def api(self) -> TargetAPI: ...


PhaseOf = Callable[[str], str]


class Phases:
    """One rank's phase names: counts its model-runner syncs (forward steps)
    and the drafter syncs since the latest one. One per virtual rank."""

    def __init__(self) -> None:
        self.step = 0
        self._drafter_syncs = 0

    def __call__(self, caller: str) -> str:
        if caller == MODEL:
            self.step += 1
            self._drafter_syncs = 0
            return f"iter {self.step} {MODEL}"
        self._drafter_syncs += 1
        which = (
            "prefill"
            if self._drafter_syncs == 1
            else "decode"
            if self._drafter_syncs == 2
            else f"decode {self._drafter_syncs - 1}"
        )
        return f"iter {self.step} {DRAFTER} {which}"


def recording_sync(
    target: _HasAPI, real_function: Callable[..., Any], phase_of: PhaseOf
) -> Callable[..., Any]:
    """``real_function`` (the release's ``dispatch_cg_and_sync_dp``) recording
    each call as a ``sync`` event of the running rank, named by ``phase_of``.

    ``target`` is the sync lane's loaded target of the same release: its
    adapter turns the native descriptor and agreement into plain records.
    The returned callable has the real function's signature (``inspect``
    follows ``__wrapped__``), so callers bind their arguments as in vLLM.
    """
    names, defaults, reuse_parameter = _parameters(real_function)
    api = target.api
    #: The rank's latest agreement from a fresh (not reused, not solo) call.
    latest: list[Agreement | None] = [None]

    @functools.wraps(real_function)
    def sync(*args: Any, **kwargs: Any) -> Any:
        called = _arguments(names, defaults, args, kwargs)
        caller = sys._getframe(1)
        phase = phase_of(DRAFTER if _is_speculator(caller) else MODEL)
        inputs = _inputs(called, dummy=_under_dummy_run(caller))
        handed = called[reuse_parameter] if reuse_parameter is not None else None
        reused = handed is not None
        solo = _solo()
        if reused:
            given = api.agreement(handed)
            if given != latest[0]:
                # Not the rank's latest fresh agreement (0.32+'s drafter
                # decode derives one): say what was handed in, for `reuse`.
                record(REUSE_GIVEN_EVENT, {"agreement": _json(given)})
        try:
            descriptor, agreement = real_function(*args, **kwargs)
        except Exception as error:
            _record(
                SyncRecord(
                    phase,
                    inputs,
                    reused=reused,
                    solo=solo,
                    error=f"{type(error).__name__}: {error}",
                )
            )
            raise
        agreed = api.agreement(agreement)
        if not reused and not solo:
            latest[0] = agreed
        _record(
            SyncRecord(
                phase,
                inputs,
                reused=reused,
                solo=solo,
                descriptor=api.describe(descriptor),
                agreement=agreed,
            )
        )
        return descriptor, agreement

    return sync


@functools.lru_cache(maxsize=16)
def _parameters(
    real_function: Callable[..., Any],
) -> tuple[tuple[str, ...], Mapping[str, Any], str | None]:
    """The sync's parameter names, their defaults and its reuse parameter (if
    any): read once per function, not per rank of every case."""
    parameters = inspect.signature(real_function).parameters
    if any(p.kind not in _NAMED_KINDS for p in parameters.values()):
        raise TypeError(f"{real_function.__name__} takes *args or **kwargs")
    defaults = {
        name: p.default for name, p in parameters.items() if p.default is not p.empty
    }
    reuse_parameter = next((p for p in REUSE_PARAMETERS if p in parameters), None)
    return tuple(parameters), MappingProxyType(defaults), reuse_parameter


#: Parameter kinds the sync's signature may have (it takes no *args/**kwargs).
_NAMED_KINDS = frozenset(
    {
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    }
)


def _arguments(
    names: tuple[str, ...],
    defaults: Mapping[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in: what
    ``Signature.bind`` gives, without its cost on every sync (the real
    function itself refuses a call that does not fit)."""
    called = dict(defaults)
    called.update(zip(names, args, strict=False))
    called.update(kwargs)
    return called


def _inputs(called: dict[str, Any], *, dummy: bool) -> RankBatch:
    """The call's arguments as the sync lane's inputs; parameters a release
    lacks keep their default (the adapter refuses such inputs the other way)."""
    values: dict[str, Any] = {}
    for name in _BATCH_FIELDS:
        if name not in called:
            continue
        value = called[name]
        if name in _OPTIONAL_INTS:
            values[name] = None if value is None else int(value)
        elif isinstance(RankBatch.__dataclass_fields__[name].default, bool):
            values[name] = bool(value)
        else:
            values[name] = int(value)
    uniform = values.get("uniform_token_count") is not None
    kind = "dummy" if dummy else "decode" if uniform else "batch"
    return RankBatch(**values, kind=kind)


def _is_speculator(caller: FrameType) -> bool:
    """Whether the call site is a speculator's (by its real file's path): the
    innermost vLLM frame from the caller outward, so a dpsim frame in between
    (a part's per-rank router of the sync) does not hide whose call it is."""
    frame: FrameType | None = caller
    while frame is not None and not is_vllm_file(frame.f_code.co_filename):
        frame = frame.f_back
    site = frame or caller
    return _SPECULATOR_DIR in site.f_code.co_filename.replace("\\", "/").split("/")


def _under_dummy_run(caller: FrameType) -> bool:
    """Whether the model runner's ``_dummy_run`` is on the stack: the sync
    is an idle rank's dummy batch (its own or its drafter's)."""
    frame: FrameType | None = caller
    while frame is not None:
        code = frame.f_code
        if code.co_name == _DUMMY_RUN and code.co_filename.endswith("model_runner.py"):
            return True
        frame = frame.f_back
    return False


def _solo() -> bool:
    """Whether the running rank skips DP coordination right now."""
    world = runtime.current()
    return world is not runtime.NO_WORLD and bool(world.skip_dp_coordination())


def _json(agreement: Agreement | None) -> dict[str, Any] | None:
    return None if agreement is None else agreement.to_json()


def _record(sync: SyncRecord) -> None:
    record(SYNC_EVENT, sync.to_json())


def record_drafter_forward(num_tokens: int) -> None:
    """Leave a drafter-forward event in the running rank's trace (called by
    the stood-in drafter model once per forward it runs)."""
    record(DRAFTER_FORWARD_EVENT, {"tokens": int(num_tokens)})
