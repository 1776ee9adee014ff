"""A model of vLLM's DP coordinator and front-end, as far as the engine loop sees them.

Written from scratch, not vLLM's code: vLLM's ``DPCoordinatorProc`` is a
process moving ZMQ messages, and the engines see it only through their input
queues (``START_DP_WAVE``, the requests a front-end sends) and their output
queues (``start_wave`` / ``wave_complete`` outputs). What this model does,
and the vLLM lines it follows (``vllm/v1/engine/coordinator.py``,
``DPCoordinatorProc.process_input_socket``, 0.12.0 to 0.34.0):

* An engine's output ``start_wave=w`` (engine ``e``): when ``w`` is newer than
  the coordinator's wave, or equal while the engines are not running, the
  coordinator takes wave ``w``, marks the engines running, and broadcasts
  ``START_DP_WAVE (w, e)`` to every engine (``_send_start_wave``; an engine
  ignores the one that names it, ``DPEngineCoreProc._handle_client_request``).
* An output ``wave_complete=w`` (from DP rank 0): when the coordinator's
  wave is not past ``w``, it moves to ``w + 1`` and marks the engines paused.
* Requests: a front-end stamps each request with the wave it last heard of
  (``request.current_wave``; here the coordinator's, i.e. publications reach
  it at once) and sends it to its engine. In releases whose coordinator also
  wakes engines on a front-end's message (0.12-0.32: ``FIRST_REQ``, sent by
  ``DPAsyncMPClient.add_request_async`` while it believes the engines
  paused), the front-end then tells the coordinator, which broadcasts
  ``START_DP_WAVE (wave, engine)`` (``None`` for a stale wave) when its
  engines are not running (0.12-0.28: and marks them running, so an
  engine's ``start_wave`` of the same wave is then not broadcast again;
  0.29 dropped that mark). From 0.33 on, engines alone start waves
  (``DPEngineCoreProc.add_request`` emits ``start_wave``).
* End of input: when no rank can run and every blocked rank is parked in its
  input mailbox (idle engines, no arrivals left), the front-end shuts the
  engines down as vLLM's signal handler does (``run_engine_core``, 0.18+:
  ``shutdown_state = REQUESTED``, then a ``WAKEUP`` into the input queue),
  once per engine (the shutdown callback the engine registered does the
  rest: through 0.17 the handler raises ``SystemExit`` in the waiting
  engine instead); their real ``_handle_shutdown`` ends their loops. When some
  rank waits in a collective instead, nothing is delivered: the run ends
  where every rank stood, for the diagnosis.

Messages travel instantly and in program order: the sim has no network, and
delays between processes are what the scheduler's interleavings (and the
streams' arrival times) already vary.

Stats publication (``publish_dp_lb_stats``, load balancing) is off: the
engines' request counts decide nothing the lane judges.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dpsim.errors import TargetError
from dpsim.lanes.runner import where
from dpsim.lanes.runner.strict import StrictObject, asked_at, gap, standin
from dpsim.sim.mailbox import Mailbox, Quiescence
from dpsim.targets.shim import parse_source

#: vLLM's ``EngineCoreRequestType`` as the lane's engines see it: the members
#: the real engine loop compares against (their byte values do not matter in
#: one process; distinct tokens do). Any other member is a gap.
REQUEST_TYPES = standin(
    "EngineCoreRequestType",
    ADD="ADD",
    ABORT="ABORT",
    START_DP_WAVE="START_DP_WAVE",
    UTILITY="UTILITY",
    EXECUTOR_FAILED="EXECUTOR_FAILED",
    WAKEUP="WAKEUP",
)


class EngineCoreOutputs(StrictObject):
    """vLLM's ``EngineCoreOutputs`` (a msgspec struct), for the fields the lane's
    real engine code sets and this model reads; every field defaults as in
    vLLM. Constructing one with any other field is a gap."""

    OWNER = "EngineCoreOutputs"
    FIELDS: ClassVar[dict[str, Any]] = {
        "engine_index": 0,
        "scheduler_stats": None,
        "utility_output": None,
        "wave_complete": None,
        "start_wave": None,
        "weight_version": None,
    }

    def __init__(self, **fields: Any) -> None:
        unknown = sorted(set(fields) - set(self.FIELDS))
        if unknown:
            raise gap(
                f"EngineCoreOutputs({', '.join(unknown)}=...) made at {asked_at()}"
            )
        for name, default in self.FIELDS.items():
            setattr(self, name, fields.get(name, default))


def front_end_wakes_engines(coordinator_py: Path, version: str | None) -> bool:
    """Whether this release's coordinator starts a wave on a front-end's
    message as well as on an engine's (0.12-0.32: yes; 0.33: engines alone).

    Read from the release's ``coordinator.py``: its ``DPCoordinatorProc``
    calls ``_send_start_wave`` from the front-end branch and the engine
    branch (two call sites), or from the engine branch alone (one). Any other
    shape is a coordinator this model was not written for: refused.
    """
    _, tree = parse_source(coordinator_py)
    calls = sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "_send_start_wave"
    )
    if calls not in (1, 2):
        raise TargetError(
            f"runner lane: vLLM {version or '(this tree)'}'s "
            f"{where.register_file(coordinator_py)} sends START_DP_WAVE from "
            f"{calls} places; the lane's coordinator model knows 1 (engines start "
            "waves) or 2 (front-ends too)"
        )
    return calls == 2


def front_end_wake_marks_running(coordinator_py: Path, version: str | None) -> bool:
    """Whether this release's coordinator, waking the engines on a
    front-end's message, also marks them running (0.12-0.28: yes; 0.29
    stopped, since a paused engine discards the START_DP_WAVE it sends).

    Read from the release's ``coordinator.py``: ``engines_running = True`` is
    assigned in the engine branch alone (once) or in the front-end branch
    too (twice). Any other shape is refused, as in
    :func:`front_end_wakes_engines`.
    """
    _, tree = parse_source(coordinator_py)
    marks = sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(
            isinstance(target, ast.Name) and target.id == "engines_running"
            for target in node.targets
        )
        and isinstance(node.value, ast.Constant)
        and node.value.value is True
    )
    if marks not in (1, 2):
        raise TargetError(
            f"runner lane: vLLM {version or '(this tree)'}'s "
            f"{where.register_file(coordinator_py)} marks the engines running in "
            f"{marks} places; the lane's coordinator model knows 1 (on an "
            "engine's start_wave) or 2 (on a front-end's wake too)"
        )
    return marks == 2


class Coordinator:
    """The DP coordinator and the front-end, over every engine's input mailbox.

    ``shutdown`` is called per engine at end of input (it sets the engine's
    shutdown state, as vLLM's signal handler does); the lane passes it when
    it registers the engine (see :meth:`attach`).
    """

    def __init__(
        self,
        mailboxes: Sequence[Mailbox],
        *,
        front_end_wakes: bool,
        wake_marks_running: bool = False,
    ) -> None:
        self.mailboxes = tuple(mailboxes)
        self.front_end_wakes = front_end_wakes
        #: 0.12-0.28: a front-end's wake marks the engines running
        #: (:func:`front_end_wake_marks_running`).
        self.wake_marks_running = wake_marks_running
        #: The coordinator's wave and running state (``current_wave``,
        #: ``engines_running`` in ``process_input_socket``).
        self.current_wave = 0
        self.engines_running = False
        #: What the front-end believes (0.29-0.32's ``DPAsyncMPClient.engines_running``).
        self.front_end_running = False
        self._shutdowns: dict[int, Callable[[], None]] = {}
        self._shut_down: set[int] = set()
        #: Every wave-state change, in order: (what, wave, engine), for tests
        #: and diagnoses (e.g. ("start", 1, 0), ("complete", 0, 0)).
        self.log: list[tuple[str, int, int | None]] = []

    def attach(self, rank: int, shutdown: Callable[[], None]) -> None:
        """Register how to shut engine ``rank`` down at end of input."""
        self._shutdowns[rank] = shutdown

    # -- the front-end ---------------------------------------------------------

    def send_request(self, rank: int, request: Any) -> None:
        """A front-end sends ``request`` to engine ``rank``."""
        self.mailboxes[rank].put((REQUEST_TYPES.ADD, (request, self.current_wave)))
        if self.front_end_wakes and not self.front_end_running:
            # FIRST_REQ: the engines may be paused; the coordinator wakes the others.
            self.front_end_running = True
            if not self.engines_running:
                if self.wake_marks_running:
                    self.engines_running = True
                self._broadcast_start_wave(self.current_wave, rank)

    # -- the engines' outputs --------------------------------------------------

    def output(self, rank: int, item: Any) -> None:
        """An engine's ``output_queue.put_nowait(item)``: ``(client_index, outputs)``."""
        client_index, outputs = item
        if client_index != -1 or not isinstance(outputs, EngineCoreOutputs):
            # Per-request outputs go to a front-end the lane does not model.
            return
        if outputs.wave_complete is not None:
            wave = outputs.wave_complete
            if self.current_wave <= wave:
                self.current_wave = wave + 1
                self.engines_running = False
                self.front_end_running = False  # published to the front-ends
                self.log.append(("complete", wave, rank))
        elif outputs.start_wave is not None:
            wave = outputs.start_wave
            if wave > self.current_wave or (
                wave == self.current_wave and not self.engines_running
            ):
                self.current_wave = wave
                self.engines_running = True
                self.front_end_running = True
                self._broadcast_start_wave(wave, rank)

    def _broadcast_start_wave(self, wave: int, exclude: int | None) -> None:
        self.log.append(("start", wave, exclude))
        for mailbox in self.mailboxes:
            mailbox.put((REQUEST_TYPES.START_DP_WAVE, (wave, exclude)))

    # -- end of input ----------------------------------------------------------

    def on_quiescent(self, now: Quiescence) -> bool:
        """``simulate``'s callback: shut down idle engines once input has ended."""
        parked = now.parked
        if not parked or set(parked) != set(now.blocked):
            return False  # some rank waits in a collective: leave all as they stand
        fresh = [rank for rank in parked if rank not in self._shut_down]
        if not fresh:
            return False  # shut down already, and parked again: the run ends here
        for rank in fresh:
            self._shut_down.add(rank)
            self._shutdowns[rank]()
            self.mailboxes[rank].put((REQUEST_TYPES.WAKEUP, None))
        return True
