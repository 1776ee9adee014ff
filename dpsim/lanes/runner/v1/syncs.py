"""Each V1 sync the real code makes, recorded as the sync lane records a V1 sync.

In the V1 runner the sync (``coordinate_batch_across_dp``) sits inside its
caller, ``GPUModelRunner._determine_batch_execution_and_padding``, which
dispatches on the rank's own batch, syncs, and dispatches again at the
agreed count; the sync lane's V1 target records one sync per CALLER call
(:class:`~dpsim.targets.v1.api.V1API`: inputs mapped from the caller's
arguments, the descriptor from what the caller returned, the agreement from
what the sync inside it returned). :class:`V1SyncRecorder` does the same for
the real calls the runner lane's ranks make, so the sync lane's properties
judge them alike: :meth:`V1SyncRecorder.caller` runs one caller call and
records it; :meth:`V1SyncRecorder.coordinate` is the rank's
``coordinate_batch_across_dp`` (the release's function, telling the caller
call in progress what it returned).

Phase names and the dummy/drafter distinction are the V2 lane's
(:mod:`dpsim.lanes.runner.syncs`): the innermost vLLM frame under
``spec_decode`` makes a drafter sync, ``_dummy_run`` on the stack a dummy one.

The module global ``coordinate_batch_across_dp`` of every rebuilt class is
:func:`route`, which finds the calling rank's recorder by the
``parallel_config`` the real code passes (each rank's own object).
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from dpsim.lanes.runner.strict import gap
from dpsim.lanes.runner.syncs import (
    DRAFTER,
    MODEL,
    PhaseOf,
    _arguments,
    _is_speculator,
    _record,
    _solo,
    _under_dummy_run,
)
from dpsim.records.case import RankBatch
from dpsim.records.sync import SyncRecord
from dpsim.targets.spec import V1_ENTRY
from dpsim.targets.v1.api import V1API, V1Result


class V1SyncRecorder:
    """One rank's recorder of V1 syncs (its runner's and its drafter's).

    ``real_sync`` is the release's ``coordinate_batch_across_dp`` as the sync
    lane's V1 target loaded it; ``api`` that target's :class:`V1API` (which
    reads descriptors and agreements); ``phase_of`` the rank's phase counter,
    shared with the rank's drafter.
    """

    def __init__(
        self, api: V1API, real_sync: Callable[..., Any], phase_of: PhaseOf
    ) -> None:
        self._api = api
        self._real_sync = real_sync
        self._phase_of = phase_of
        #: What the sync returned, per caller call in progress (innermost last).
        self._pending: list[list[Any]] = []

    @property
    def phase_of(self) -> PhaseOf:
        """The rank's phase counter (a drafter recording its own syncs
        numbers them with it, after the runner's sync of the same step)."""
        return self._phase_of

    def coordinate(self, *args: Any, **kwargs: Any) -> Any:
        """The release's ``coordinate_batch_across_dp`` for this rank."""
        returned = self._real_sync(*args, **kwargs)
        if self._pending:
            self._pending[-1].append(returned)
        return returned

    def caller(
        self,
        method: Callable[..., Any],
        arguments: Mapping[str, Any],
        *,
        decode_query_len: int,
        num_ubatches: int,
        caller_frame: FrameType,
    ) -> Any:
        """Run ``method`` (a bound caller method: the runner's
        ``_determine_batch_execution_and_padding``) with ``arguments`` (every
        parameter by name) and record the call.
        ``num_ubatches`` is the rank's microbatch count when it microbatches."""
        inputs = _inputs(
            arguments, decode_query_len, dummy=_under_dummy_run(caller_frame)
        )

        def result_of(returned: Any) -> V1Result:
            should_ubatch = returned[2]
            ubatch = (
                bool(should_ubatch)
                if isinstance(should_ubatch, bool)
                else should_ubatch is not None
            )
            return V1Result(
                returned=tuple(returned),
                num_ubatches=num_ubatches if ubatch else 1,
                decode_query_len=decode_query_len,
            )

        return self.record(
            lambda: method(**arguments),
            inputs,
            caller_frame=caller_frame,
            result_of=result_of,
        )

    def record(
        self,
        call: Callable[[], Any],
        inputs: RankBatch,
        *,
        caller_frame: FrameType,
        result_of: Callable[[Any], V1Result],
    ) -> Any:
        """Run ``call`` (one call of a caller of the sync: the runner's, or
        the drafter's own ``_determine_batch_execution_and_padding``, whose
        inputs and result its caller maps: ``inputs``, ``result_of``) and
        record it: a sync inside it goes through :meth:`coordinate`."""
        phase = self._phase_of(DRAFTER if _is_speculator(caller_frame) else MODEL)
        solo = _solo()
        self._pending.append([])
        try:
            returned = call()
        except Exception as error:
            _record(
                SyncRecord(
                    phase,
                    inputs,
                    reused=False,
                    solo=solo,
                    error=f"{type(error).__name__}: {error}",
                )
            )
            raise
        finally:
            synced = self._pending.pop()
        _record(
            SyncRecord(
                phase,
                inputs,
                reused=False,
                solo=solo,
                descriptor=self._api.describe(result_of(returned)),
                agreement=self._api.agreement(synced[-1] if synced else None),
            )
        )
        return returned


def _inputs(
    arguments: Mapping[str, Any], decode_query_len: int, *, dummy: bool
) -> RankBatch:
    """A caller call's arguments as the sync lane's V1 inputs, as its
    generator writes them (``generate_v1``): the per-request count when every
    request has the same, the largest request's, the forced uniform flag."""
    counts = [int(n) for n in arguments["num_scheduled_tokens_np"]]
    num_reqs = int(arguments["num_reqs"])
    equal = len(set(counts)) == 1
    loras = arguments.get("force_num_active_loras")
    decode = equal and counts[0] == decode_query_len
    return RankBatch(
        num_reqs=num_reqs,
        num_tokens=int(arguments["num_tokens"]),
        uniform_token_count=counts[0] if equal else None,
        max_query_len=int(arguments["max_num_scheduled_tokens"]),
        need_eager=bool(arguments.get("force_eager", False)),
        num_active_loras=int(loras or 0),
        allow_ubatching=bool(arguments.get("allow_microbatching", True)),
        uniform_decode=bool(arguments.get("force_uniform_decode")),
        num_encoder_reqs=int(arguments.get("num_encoder_reqs", 0)),
        cascade_attn=bool(arguments.get("use_cascade_attn", False)),
        kind="dummy" if dummy else "decode" if decode else "batch",
    )


# -- routing the module global to the calling rank --------------------------------

#: Each rank's recorder, by its parallel config (one object per rank).
_RECORDERS: weakref.WeakKeyDictionary[Any, V1SyncRecorder] = weakref.WeakKeyDictionary()


def bind(parallel_config: Any, recorder: V1SyncRecorder) -> None:
    """Route the syncs made with ``parallel_config`` to ``recorder``."""
    _RECORDERS[parallel_config] = recorder


@functools.lru_cache(maxsize=16)
def _signature(real_sync: Callable[..., Any]) -> tuple[tuple[str, ...], Any]:
    parameters = inspect.signature(real_sync).parameters
    defaults = {
        name: p.default for name, p in parameters.items() if p.default is not p.empty
    }
    return tuple(parameters), defaults


def router(real_sync: Callable[..., Any]) -> Callable[..., Any]:
    """The module global ``coordinate_batch_across_dp`` of the rebuilt
    classes: the calling rank's recorder's :meth:`~V1SyncRecorder.coordinate`,
    found by the ``parallel_config`` argument; the real function's signature."""
    names, defaults = _signature(real_sync)

    @functools.wraps(real_sync)
    def coordinate_batch_across_dp(*args: Any, **kwargs: Any) -> Any:
        config = _arguments(names, defaults, args, kwargs).get("parallel_config")
        recorder = _RECORDERS.get(config) if config is not None else None
        if recorder is None:
            raise gap(
                f"{V1_ENTRY} called with a parallel_config no rank of the lane "
                f"owns at {sys._getframe(1).f_code.co_filename}"
            )
        return recorder.coordinate(*args, **kwargs)

    return coordinate_batch_across_dp
