"""Fake ``torch.distributed`` collectives between virtual ranks.

Each process group numbers its collectives per member, from 0. Collective #k
of a group completes when every member has entered its own #k with the same
signature (kind, reduce op, shape, dtype, broadcast source); the last member
to enter computes the result once and writes it into every member's tensor,
in place, as torch does. A member entering with a different signature marks
the collective mismatched on the spot: it can never complete, and everyone in
it stays stuck, which is what a real backend does at best.

This module is also the ``dist`` object loaded targets see (through
``runtime.DIST_PROXY``), so its methods keep torch's signatures and are the
simulator's hot path: no per-call allocation beyond the log entry, and per
collective one ``torch.stack`` of the inputs, one reduction and one torch call
that copies the result into every member's tensor. Nothing becomes
Python lists while ranks run: a completed collective keeps the stacked inputs
and the result as tensors, and the trace converts a member's row only when a
reader asks for it (a contribution of a (4, N) tensor is O(N) Python objects,
so converting every member's at every collective made a run quadratic in N).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed

from dpsim.boundary import modelled
from dpsim.records.dist import GroupNamespace
from dpsim.sim.scheduler import Scheduler

ReduceOp = torch.distributed.ReduceOp

#: Signature as kept on the hot path: (kind, op, shape, dtype, src), with the
#: tensor's own ``torch.Size`` and ``torch.dtype``; made into a ``Signature``
#: (plain tuple, dtype name) only when the result is built.
SignatureTuple = tuple[str, str | None, tuple[int, ...], torch.dtype | None, int | None]


def _bitwise(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable:
    return lambda stacked: functools.reduce(fn, stacked.unbind(0))


#: op token -> (name recorded in traces, reduction over a stacked [members, ...] tensor)
_REDUCTIONS: dict[Any, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    ReduceOp.SUM: ("SUM", lambda s: s.sum(0, dtype=s.dtype)),
    ReduceOp.PRODUCT: ("PRODUCT", lambda s: s.prod(0, dtype=s.dtype)),
    ReduceOp.MIN: ("MIN", lambda s: s.amin(0)),
    ReduceOp.MAX: ("MAX", lambda s: s.amax(0)),
    ReduceOp.AVG: ("AVG", lambda s: s.mean(0)),
    ReduceOp.BAND: ("BAND", _bitwise(torch.bitwise_and)),
    ReduceOp.BOR: ("BOR", _bitwise(torch.bitwise_or)),
    ReduceOp.BXOR: ("BXOR", _bitwise(torch.bitwise_xor)),
}
_REDUCTION_BY_NAME = dict(_REDUCTIONS.values())
#: op token -> the name traces record it by, for both lanes
OP_NAMES = {op: name for op, (name, _) in _REDUCTIONS.items()}
#: The same, by identity: hashing a ``ReduceOp`` goes through pybind11 and
#: costs more than the rest of the lookup; torch's ``ReduceOp.SUM`` and friends
#: are singletons (kept alive by ``_REDUCTIONS``, so their ids stay theirs).
_OP_NAMES_BY_ID = {id(op): name for op, name in OP_NAMES.items()}

#: torch splits an op over its intra-op threads from this many elements on
#: (``at::internal::GRAIN_SIZE``).
_GRAIN = 32768
#: Reductions that combine partial results of row blocks exactly as they
#: combine rows. AVG is a SUM divided; the bitwise ones go row by row already.
_BLOCKWISE = frozenset({"SUM", "PRODUCT", "MIN", "MAX"})


def _reduce(stacked: torch.Tensor, op_name: str) -> torch.Tensor:
    """The reduction of ``stacked`` over members, in blocks that stay on this thread.

    A 256-rank DP sync reduces 256 x (4 x 256) values. In one op torch hands
    that to its thread pool, and on a busy machine waiting for a worker thread
    to be scheduled costs milliseconds, far more than the work (tens of
    microseconds on one thread). Reducing blocks of rows below the grain
    size, then the blocks' results the same way, never leaves this thread and
    does not depend on the thread count.
    """
    members = stacked.shape[0]
    width = stacked[0].numel()
    # A single member's tensor near the grain size is big enough to be worth threads.
    if members * width < _GRAIN or 2 * width >= _GRAIN:
        return _REDUCTION_BY_NAME[op_name](stacked)
    if op_name == "AVG":
        return _reduce(stacked, "SUM").div_(members)
    if op_name not in _BLOCKWISE:
        return _REDUCTION_BY_NAME[op_name](stacked)
    reduction = _REDUCTION_BY_NAME[op_name]
    rows = (_GRAIN - 1) // width
    partials = torch.stack(
        [reduction(stacked[start : start + rows]) for start in range(0, members, rows)]
    )
    return _reduce(partials, op_name)


def _copy_into(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target.copy_(source)`` for each pair, in order, in one torch call (on
    CPU, torch's own loop of ``copy_``).

    Completing a collective writes every member's tensor, and one ``copy_``
    per member costs a dispatch each (about 2 us), as much as the rest of a
    member's share of the collective; ``_foreach_copy_`` makes the same copies
    behind one. Where it refuses (a leaf that requires grad, a shape that
    does not broadcast), the copies are made one by one, which raise what
    ``copy_`` raises, where it raises it, and redo the ones already made with
    the same values.
    """
    try:
        torch._foreach_copy_(targets, sources)
    except Exception:  # the loop below raises what copy_ raises
        for target, source in zip(targets, sources, strict=True):
            try:
                target.copy_(source)
            except Exception as error:
                modelled(error)  # torch's own error, for the tensors vLLM gave
                raise


class SimProcessGroup:
    """A process group handle, what targets pass as ``group=``.

    Like torch's ``ProcessGroup``, ``rank()`` answers for the calling rank.
    """

    def __init__(self, state: GroupState) -> None:
        self._state = state
        self.name = state.name
        self.ranks = state.members

    def size(self) -> int:
        return self._state.size

    def rank(self) -> int:
        state = self._state
        return state.position[state.dist.scheduler.current]

    def __repr__(self) -> str:
        return f"<dpsim group {self.name!r} ranks={list(self.ranks)}>"


@functools.lru_cache(maxsize=1024)
def _positions(members: tuple[int, ...], world_size: int) -> tuple[int, ...]:
    # The same layouts recur run after run; building one is O(world size).
    position = [-1] * world_size
    for index, rank in enumerate(members):
        position[rank] = index
    return tuple(position)


class GroupState:
    """One group's members and its collectives in flight."""

    # Made once per world; read on every collective.
    __slots__ = (
        "dist",
        "handle",
        "members",
        "name",
        "next_seq",
        "pending",
        "position",
        "size",
    )

    def __init__(
        self, name: str, members: Sequence[int], world_size: int, dist: SimCollectives
    ) -> None:
        self.name = name
        self.members: tuple[int, ...] = tuple(members)
        self.size = len(self.members)
        #: The collectives this group belongs to, whose ``scheduler`` is the
        #: running one's: a run then resets only the groups it used.
        self.dist = dist
        #: global rank -> position in the group, -1 for non-members (indexed on
        #: every collective: a sequence index beats a dict lookup)
        self.position = _positions(self.members, world_size)
        self.handle = SimProcessGroup(self)
        self.reset()

    def reset(self) -> None:
        """Forget every collective: ready for the next run."""
        #: per member position: the seq its next collective will get
        self.next_seq = [0] * self.size
        #: collectives some member entered that have not completed, by seq
        self.pending: dict[int, Pending] = {}


class Pending:
    """Collective #seq of a group, from the first member's entry to completion.

    Once the run is over it is also what the trace reads a record's
    ``contribution`` and ``result`` from, on demand (see
    ``CollectiveRecord``): by then it holds tensors no rank can reach and no
    reference back into the run.
    """

    __slots__ = (
        "done",
        "entered",
        "frozen",
        "group",
        "inputs",
        "mismatched",
        "name",
        "outputs",
        "result_list",
        "result_tensor",
        "seq",
        "signature",
        "signatures",
        "stacked",
        "waiters",
    )

    def __init__(self, group: GroupState, seq: int, signature: SignatureTuple) -> None:
        size = group.size
        #: None once completed or frozen: a finished trace must not keep the run alive
        self.group: GroupState | None = group
        self.name = group.name
        self.seq = seq
        #: the first member's signature; the others must match it
        self.signature = signature
        self.signatures: list[SignatureTuple | None] = [None] * size
        self.inputs: list[Any] = [None] * size
        self.outputs: list[Any] = [None] * size
        self.entered = 0
        self.mismatched = False
        self.done = False
        #: once completed: every member's input, stacked (None for a barrier); a
        #: private copy, so no rank can change it afterwards
        self.stacked: torch.Tensor | None = None
        #: once completed: the tensor every member received (None for a barrier)
        self.result_tensor: torch.Tensor | None = None
        #: ``result_tensor.tolist()``, made on first request and shared by members
        self.result_list: Any = _UNCONVERTED
        #: for a collective that never completed: per member, its input as nested
        #: lists, taken when the run ended (see ``freeze``)
        self.frozen: list[Any] | None = None
        #: ranks blocked until this completes (in the call, or in wait())
        self.waiters: list[int] = []

    def contribution(self, position: int) -> Any:
        """A member's input as nested lists (None for a barrier or a member not entered)."""
        stacked = self.stacked
        if stacked is not None:
            return stacked[position].tolist()
        frozen = self.frozen
        return None if frozen is None else frozen[position]

    def result_value(self) -> Any:
        """What the collective wrote into each member's tensor, as nested lists."""
        converted = self.result_list
        if converted is _UNCONVERTED:
            tensor = self.result_tensor
            converted = self.result_list = None if tensor is None else tensor.tolist()
        return converted

    def freeze(self) -> None:
        """Take the inputs of a collective that never completed, and let go of the run.

        Called when the run has ended, before hung ranks are ended: their
        ``finally`` blocks may still change the tensors they passed in.
        """
        self.frozen = [
            None if tensor is None else tensor.tolist() for tensor in self.inputs
        ]
        self.inputs = self.outputs = []
        self.waiters = []
        self.group = None


#: ``Pending.result_list`` before its first conversion (None is a valid result)
_UNCONVERTED: Any = object()


class SimWork:
    """What an ``async_op=True`` collective returns.

    The contribution was taken at call time; the result lands in the tensor
    only when the collective completes, and ``wait()`` blocks the rank until it
    has.
    """

    __slots__ = ("_collectives", "_pending")

    def __init__(self, collectives: SimCollectives, pending: Pending) -> None:
        self._collectives = collectives
        self._pending = pending

    def wait(self, timeout: Any = None) -> bool:
        if not self._pending.done:
            self._collectives.wait_for(self._pending, is_async=True)
        return True

    def is_completed(self) -> bool:
        # Polling is where interleaving shows: let another rank run first.
        self._collectives.scheduler.charge()
        self._collectives.scheduler.preempt()
        return self._pending.done

    def is_success(self) -> bool:
        return self._pending.done


#: One entry of a rank's collective log:
#: (collective, this rank's position in its group, signature as entered, is_async)
LogEntry = tuple[Pending, int, SignatureTuple, bool]


class SimCollectives:
    """The ``torch.distributed`` of the virtual ranks (``world.dist``)."""

    ReduceOp = ReduceOp

    def __init__(
        self,
        scheduler: Scheduler,
        world_size: int,
        groups: Sequence[tuple[str, Sequence[int]]],
        world_group: str,
    ) -> None:
        self.world_size = world_size
        self.groups: dict[str, GroupState] = {
            name: GroupState(name, members, world_size, self)
            for name, members in groups
        }
        self._default = self.groups[world_group]
        self.group = GroupNamespace(self._default.handle)
        #: Groups a collective was entered in since the last reset: most runs
        #: use one of the four or five groups, and only those need resetting.
        self.used: list[GroupState] = []
        self._reset_own(scheduler)

    def reset(self, scheduler: Scheduler) -> None:
        """Forget every collective of the last run: ready for one under ``scheduler``.

        The groups, their handles and whatever holds them stay; the logs are
        new lists, since the last run's trace may still read the old ones.
        """
        for state in self.used:
            state.reset()
        self.used = []
        self._reset_own(scheduler)

    def _reset_own(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        world_size = self.world_size
        #: per rank, every collective it entered, in order
        self.logs: list[list[LogEntry]] = [[] for _ in range(world_size)]
        #: per rank, (collective, blocked in wait() rather than the call) while blocked
        self.waiting_on: list[tuple[Pending, bool] | None] = [None] * world_size

    def release(self) -> None:
        """Let go of the last run's logs while idle (its trace holds what it reads)."""
        self.logs = []
        self.waiting_on = []

    def handle(self, name: str) -> SimProcessGroup:
        return self.groups[name].handle

    # -- torch.distributed's surface ----------------------------------------

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def get_backend(self, group: SimProcessGroup | None = None) -> str:
        return "dpsim"

    def get_rank(self, group: SimProcessGroup | None = None) -> int:
        state = self._state_of(group)
        return state.position[self.scheduler.current]

    def get_world_size(self, group: SimProcessGroup | None = None) -> int:
        return self._state_of(group).size

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        group: SimProcessGroup | None = None,
        async_op: bool = False,
    ) -> SimWork | None:
        op_name = _OP_NAMES_BY_ID.get(id(op)) or OP_NAMES.get(op)
        if op_name is None:
            raise ValueError(f"dpsim does not simulate reduce op {op!r}")
        if op_name == "AVG" and not tensor.is_floating_point():
            raise modelled(ValueError("ReduceOp.AVG needs a floating-point tensor"))
        signature = ("all_reduce", op_name, tensor.shape, tensor.dtype, None)
        return self._enter(group, signature, tensor, tensor, async_op)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: SimProcessGroup | None = None,
        async_op: bool = False,
    ) -> SimWork | None:
        state = self._state_of(group)
        if len(tensor_list) != state.size:
            raise modelled(
                ValueError(
                    f"all_gather needs {state.size} output tensors for group "
                    f"{state.name!r}, got {len(tensor_list)}"
                )
            )
        signature = (
            "all_gather",
            None,
            tensor.shape,
            tensor.dtype,
            None,
        )
        return self._enter(group, signature, tensor, tensor_list, async_op)

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: SimProcessGroup | None = None,
        async_op: bool = False,
    ) -> SimWork | None:
        state = self._state_of(group)
        if output_tensor.numel() != state.size * input_tensor.numel():
            raise modelled(
                ValueError(
                    f"all_gather_into_tensor output has {output_tensor.numel()} "
                    f"elements, needs {state.size} x {input_tensor.numel()}"
                )
            )
        signature = (
            "all_gather_into_tensor",
            None,
            input_tensor.shape,
            input_tensor.dtype,
            None,
        )
        return self._enter(group, signature, input_tensor, output_tensor, async_op)

    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int,
        group: SimProcessGroup | None = None,
        async_op: bool = False,
    ) -> SimWork | None:
        state = self._state_of(group)
        if not 0 <= src < len(state.position) or state.position[src] < 0:
            raise modelled(
                ValueError(
                    f"broadcast source {src} is not a member of group {state.name!r}"
                )
            )
        signature = (
            "broadcast",
            None,
            tensor.shape,
            tensor.dtype,
            src,
        )
        return self._enter(group, signature, tensor, tensor, async_op)

    def barrier(
        self,
        group: SimProcessGroup | None = None,
        async_op: bool = False,
        device_ids: Any = None,
    ) -> SimWork | None:
        return self._enter(
            group, ("barrier", None, (), None, None), None, None, async_op
        )

    @staticmethod
    def unsimulated(name: str) -> AttributeError:
        """The error a target reaching for ``name``, which is not simulated, gets.

        Raised by ``runtime.DIST_PROXY``, through which targets see this
        object, rather than by a ``__getattr__`` here: a class with one has
        every attribute lookup on it go the slow way, and the simulator's own
        code looks up attributes of this one on every collective. Either way
        nothing falls back to the real torch.distributed.
        """
        return AttributeError(
            f"dpsim's simulated torch.distributed has no {name!r}; "
            "add it to dpsim.sim.collectives if a target needs it"
        )

    # -- matching and completion ----------------------------------------------

    def _state_of(self, group: SimProcessGroup | None) -> GroupState:
        if group is None:
            return self._default
        try:
            return group._state
        except AttributeError:
            raise TypeError(
                f"group={group!r} is not a dpsim process group; use the groups "
                "from world.dist.group.WORLD, world.group(name) or dp_group()"
            ) from None

    def _enter(
        self,
        group: SimProcessGroup | None,
        signature: SignatureTuple,
        tensor_in: Any,
        tensor_out: Any,
        async_op: bool,
    ) -> SimWork | None:
        scheduler = self.scheduler
        rank = scheduler.current
        if group is None:
            state = self._default
        else:
            try:
                state = group._state
            except AttributeError:
                state = self._state_of(group)  # raises the explanation
        position = state.position[rank]
        if position < 0:
            raise modelled(
                ValueError(
                    f"rank {rank} called {signature[0]} on group {state.name!r}, "
                    f"which it is not a member of (members {list(state.members)})"
                )
            )
        scheduler.charge()
        seq = state.next_seq[position]
        state.next_seq[position] = seq + 1
        pending = state.pending.get(seq)
        if pending is None:
            pending = state.pending[seq] = Pending(state, seq, signature)
            if seq == 0:
                # The group's first collective this run (seq 0 is made once).
                self.used.append(state)
        elif signature != pending.signature:
            pending.mismatched = True

        self.logs[rank].append((pending, position, signature, async_op))
        pending.signatures[position] = signature
        # An async caller may reuse its tensor before completion; freeze its input.
        pending.inputs[position] = (
            tensor_in.clone() if async_op and tensor_in is not None else tensor_in
        )
        pending.outputs[position] = tensor_out
        entered = pending.entered = pending.entered + 1
        if entered == state.size and not pending.mismatched:
            self._complete(pending)

        if async_op:
            scheduler.preempt()
            return SimWork(self, pending)
        if pending.done:
            scheduler.preempt()  # completing it woke the others: who goes next?
            return None
        # Block until it completes (perhaps never): inlined wait_for(), and
        # scheduler.block() without its closing check, which charge() above
        # made already (a closing scheduler's charge always raises).
        pending.waiters.append(rank)
        waiting_on = self.waiting_on
        waiting_on[rank] = (pending, False)
        scheduler.next_greenlet().switch()
        waiting_on[rank] = None
        return None

    def wait_for(self, pending: Pending, is_async: bool) -> None:
        """Block the current rank until ``pending`` completes (perhaps never)."""
        rank = self.scheduler.current
        pending.waiters.append(rank)
        self.waiting_on[rank] = (pending, is_async)
        self.scheduler.block()
        self.waiting_on[rank] = None

    def _complete(self, pending: Pending) -> None:
        kind, op_name, _, _, src = pending.signature
        group = pending.group
        assert group is not None
        inputs = pending.inputs
        outputs = pending.outputs
        if kind != "barrier":
            # Same shape and dtype everywhere, or it would be mismatched.
            stacked = pending.stacked = torch.stack(inputs)
            if kind == "all_reduce":
                assert op_name is not None
                result = _reduce(stacked, op_name)
                _copy_into(outputs, [result] * len(outputs))
            elif kind == "all_gather":
                for output_list in outputs:
                    for target, source in zip(output_list, inputs, strict=True):
                        target.copy_(source)
                result = stacked
            elif kind == "all_gather_into_tensor":
                result = stacked.reshape(outputs[0].shape)
                _copy_into(outputs, [result] * len(outputs))
            else:  # broadcast
                assert src is not None
                result = stacked[group.position[src]]
                _copy_into(outputs, [result] * len(outputs))
            pending.result_tensor = result
        pending.done = True
        del group.pending[pending.seq]
        # Drop references into the run: the ranks own their tensors, and the
        # trace needs only the stacked copy and the result.
        pending.inputs = pending.outputs = []
        pending.group = None
        if pending.waiters:
            self.scheduler.wake(pending.waiters)
            pending.waiters = []
