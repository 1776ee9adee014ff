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

from collections import deque
from collections.abc import Callable
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
    :class:`~dpsim.sim.mailbox.Mailbox` (``get``, ``get_nowait``, ``empty``);
    a blocking ``get`` on an empty mailbox tells the parent the rank is parked.
    """

    def __init__(self, connection: Connection, name: str) -> None:
        self.name = name
        self._connection = connection
        self._messages: deque[Any] = deque()
        self._received = 0
        #: Set by :class:`RelayCoordinator`: the requests the parent refers to
        #: by number, and how to request the engine's shutdown.
        self.requests: dict[int, Any] = {}
        self.on_shutdown: Callable[[], None] | None = None

    def get(self) -> Any:
        self._drain()
        while not self._messages:
            self._connection.send((PARKED, self._received))
            self._take(self._connection.recv())
        return self._messages.popleft()

    def get_nowait(self) -> Any:
        """The oldest message; ``IndexError`` when there is none (as a Mailbox)."""
        self._drain()
        return self._messages.popleft()

    def empty(self) -> bool:
        self._drain()
        return not self._messages

    def call(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the parent and take what it sends until its ack."""
        self._connection.send(message)
        while not self._take(self._connection.recv()):
            pass

    def _drain(self) -> None:
        while self._connection.poll(0):
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
            self._messages.append(self._decode(message[1], message[2]))
        else:
            raise RuntimeError(f"the runner lane's parent sent {message!r}")
        return False

    def _decode(self, kind: str, payload: Any) -> Any:
        if kind == REQUEST_TYPES.ADD:
            number, wave = payload
            return (kind, (self.requests.pop(number), wave))
        return (kind, payload)


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
        client_index, outputs = item
        if client_index != -1 or not isinstance(outputs, EngineCoreOutputs):
            return  # per-request outputs: the coordinator model drops them too
        self._mailbox.call((OUTPUT, outputs.wave_complete, outputs.start_wave))


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
    what = message[0]
    if what == PARKED:
        link.parked_at = message[1]
        return
    link.parked_at = None
    if what == REQUEST:
        coordinator.send_request(link.rank, RequestNumber(message[1]))
    elif what == OUTPUT:
        outputs = EngineCoreOutputs(wave_complete=message[1], start_wave=message[2])
        coordinator.output(link.rank, (-1, outputs))
    else:
        raise RuntimeError(f"rank {link.rank} sent {message!r}")
    link.connection.send((ACK,))
