"""The runner lane's coordinator across real processes: what travels on the pipes.

In the simulator every rank's engine shares one
:class:`~dpsim.lanes.runner.coordinator.Coordinator` and its input mailboxes
live in one process. On real processes (:mod:`dpsim.lanes.runner.processes`)
the parent runs that same coordinator model, and each child (one rank's real
engine, :mod:`dpsim.lanes.runner.rank_process`) talks to it over a pair of
pipes, plain tuples only:

child -> parent
    ``("request", n)``: the rank's front-end sends its ``n``-th request (the
    request object itself stays in the child; the coordinator stamps it with
    its wave and may broadcast ``START_DP_WAVE``);
    ``("output", wave_complete, start_wave)``: the engine put a wave output
    (``client_index == -1``) on its output queue;
    ``("parked", received)``: the engine blocks on an empty input queue,
    having taken ``received`` messages so far.
parent -> child
    ``("put", kind, payload)``: a message into the rank's input queue
    (``ADD`` carries the request's number, not the request);
    ``("shutdown",)``: the engine's shutdown is requested (as vLLM's signal
    handler sets ``shutdown_state``); a ``WAKEUP`` put follows;
    ``("ack",)``: the parent handled the child's last request or output,
    every put that caused already sent before it;
    ``("stop",)``: the run ends with the rank parked where it is.

Requests and outputs are calls: the child waits for the ack, so what the
coordinator puts into the rank's own queue is there when the engine looks
next, as in the simulator, where a put is instant. Puts into other ranks'
queues reach them when the pipes deliver them, as on real hardware.

A child is *parked* when its last word was ``("parked", k)`` and the parent
has sent it exactly ``k`` puts and shutdowns: then no message is in flight to
it, and only the parent can wake it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from dpsim.lanes.runner.coordinator import REQUEST_TYPES, EngineCoreOutputs

REQUEST, OUTPUT, PARKED = "request", "output", "parked"
PUT, SHUTDOWN, ACK, STOP = "put", "shutdown", "ack", "stop"


class Stopped(BaseException):
    """The parent ended the run while this rank was parked in its input queue.

    A ``BaseException``: vLLM's ``except Exception`` must not take it for an
    error of its own."""


class RequestNumber:
    """A request as the parent's coordinator model handles it: its number in
    the child that made it (the coordinator only passes it on)."""

    def __init__(self, number: int) -> None:
        self.number = number


# -- the child's side ---------------------------------------------------------------


class RelayMailbox:
    """The rank's input mailbox in a child process, fed by the parent.

    Answers what the engine's input queue stand-in asks of a simulator
    :class:`~dpsim.sim.mailbox.Mailbox` (``get``, ``get_nowait``, ``empty``).
    ``looks`` is what the simulated rank saw: at its ``i``-th look (any of the
    three), how many messages had reached its mailbox in all. The child's
    ``i``-th look waits until as many have arrived and sees no more, so the
    engine takes the path it took in the simulator, whenever the pipes
    deliver (see :mod:`dpsim.lanes.runner.schedule`). Past the simulator's
    looks (or without any), a look sees what has arrived. Waiting for a
    message, the child tells the parent it is parked.
    """

    def __init__(
        self, connection: Connection, name: str, looks: Sequence[int] = ()
    ) -> None:
        self.name = name
        self._connection = connection
        #: Every message put so far (decoded), and how many the engine took.
        self._arrived: list[Any] = []
        self._taken = 0
        #: Puts and shutdowns read from the pipe (what ``parked`` reports).
        self._received = 0
        self._looks = tuple(looks)
        self._look = 0
        #: Set by :class:`RelayCoordinator`: the requests the parent refers to
        #: by number, and how to request the engine's shutdown.
        self.requests: dict[int, Any] = {}
        self.on_shutdown: Callable[[], None] | None = None

    def get(self) -> Any:
        limit = self._visible(block=True)
        if limit <= self._taken:
            raise RuntimeError(
                f"the real rank left the simulator's schedule: its look "
                f"{self._look} took a message the simulated rank did not have"
            )
        return self._pop()

    def get_nowait(self) -> Any:
        """The oldest message; ``IndexError`` when there is none (as a Mailbox)."""
        if self._visible(block=False) <= self._taken:
            raise IndexError("get_nowait from an empty mailbox")
        return self._pop()

    def empty(self) -> bool:
        return self._visible(block=False) <= self._taken

    def call(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the parent and take what it sends until its ack."""
        self._connection.send(message)
        while not self._take(self._connection.recv()):
            pass

    def _visible(self, *, block: bool) -> int:
        """How many of the messages put so far this look may see."""
        if self._look < len(self._looks):
            need = self._looks[self._look]
            self._look += 1
            while len(self._arrived) < need:
                self._wait()
            return need
        self._look += 1
        while self._connection.poll(0):
            self._take(self._connection.recv())
        while block and len(self._arrived) <= self._taken:
            self._wait()
        return len(self._arrived)

    def _pop(self) -> Any:
        message = self._arrived[self._taken]
        self._taken += 1
        return message

    def _wait(self) -> None:
        self._connection.send((PARKED, self._received))
        self._take(self._connection.recv())

    def _take(self, message: tuple[Any, ...]) -> bool:
        """Handle one message from the parent; True for an ack."""
        what = message[0]
        if what == ACK:
            return True
        if what == STOP:
            raise Stopped
        self._received += 1
        if what == SHUTDOWN:
            if self.on_shutdown is None:
                raise RuntimeError("a shutdown reached an engine not attached yet")
            self.on_shutdown()
        elif what == PUT:
            self._arrived.append(self._decode(message[1], message[2]))
        else:
            raise RuntimeError(f"the runner lane's parent sent {message!r}")
        return False

    def _decode(self, kind: str, payload: Any) -> Any:
        if kind == REQUEST_TYPES.ADD:
            number, wave = payload
            return (kind, (self.requests.pop(number), wave))
        return (kind, payload)


def relayed_output(item: Any) -> tuple[Any, ...] | None:
    """The ``output`` call an engine's output-queue item makes on the
    parent, or None for an item the coordinator model drops anyway
    (per-request outputs: another client, another type)."""
    client_index, outputs = item
    if client_index != -1 or not isinstance(outputs, EngineCoreOutputs):
        return None
    return (OUTPUT, outputs.wave_complete, outputs.start_wave)


class RelayCoordinator:
    """The coordinator as one child's engine sees it: the calls the engine
    and its request stream make on :class:`~dpsim.lanes.runner.coordinator.Coordinator`,
    relayed to the parent's."""

    def __init__(self, mailbox: RelayMailbox, *, front_end_wakes: bool) -> None:
        self.front_end_wakes = front_end_wakes
        self._mailbox = mailbox
        self._sent = 0

    def attach(self, rank: int, shutdown: Callable[[], None]) -> None:
        self._mailbox.on_shutdown = shutdown

    def send_request(self, rank: int, request: Any) -> None:
        number = self._sent
        self._sent += 1
        self._mailbox.requests[number] = request
        self._mailbox.call((REQUEST, number))

    def output(self, rank: int, item: Any) -> None:
        message = relayed_output(item)
        if message is not None:
            self._mailbox.call(message)


# -- the parent's side ----------------------------------------------------------------


class RankLink:
    """The parent's end of one child's pipes, and whether the child is parked."""

    def __init__(self, rank: int, connection: Connection) -> None:
        self.rank = rank
        self.connection = connection
        self.sent = 0
        #: The count the child's last ``parked`` named; None once it spoke since.
        self.parked_at: int | None = None
        self.stopped = False

    @property
    def parked(self) -> bool:
        return self.parked_at == self.sent and not self.stopped

    def put(self, message: tuple[Any, Any]) -> None:
        """The coordinator model's ``mailbox.put``: into the child's input queue."""
        kind, payload = message
        if kind == REQUEST_TYPES.ADD:
            request, wave = payload
            payload = (request.number, wave)
        self.sent += 1
        self.connection.send((PUT, kind, payload))

    def shutdown(self) -> None:
        self.sent += 1
        self.connection.send((SHUTDOWN,))

    def stop(self) -> None:
        self.stopped = True
        self.connection.send((STOP,))


def handle(link: RankLink, message: tuple[Any, ...], coordinator: Any) -> None:
    """The parent's coordinator model takes one message from ``link``'s child."""
    if message[0] == PARKED:
        link.parked_at = message[1]
        return
    link.parked_at = None
    serve(link, message, coordinator)


def serve(link: RankLink, message: tuple[Any, ...], coordinator: Any) -> None:
    """Make a child's call (a request or an output) on the coordinator model,
    then ack it: every put the call caused is sent before the ack."""
    what = message[0]
    if what == REQUEST:
        coordinator.send_request(link.rank, RequestNumber(message[1]))
    elif what == OUTPUT:
        outputs = EngineCoreOutputs(wave_complete=message[1], start_wave=message[2])
        coordinator.output(link.rank, (-1, outputs))
    else:
        raise RuntimeError(f"rank {link.rank} sent {message!r}")
    link.connection.send((ACK,))
