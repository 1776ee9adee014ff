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
simulator's hot path: no per-call allocation beyond the record itself, and
per collective one ``torch.stack`` of the inputs, one reduction, and one
``tolist()`` that yields every member's contribution at once (a contribution of
a (5, N) tensor is O(N) Python objects, so N separate conversions per
collective dominated the cost of a 256-rank run).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed

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
_OP_NAMES = {op: name for op, (name, _) in _REDUCTIONS.items()}


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
        return state.position[state.scheduler.current]

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

    def __init__(
        self, name: str, members: Sequence[int], world_size: int, scheduler: Scheduler
    ) -> None:
        self.name = name
        self.members: tuple[int, ...] = tuple(members)
        self.size = len(self.members)
        self.scheduler = scheduler
        #: global rank -> position in the group, -1 for non-members (indexed on
        #: every collective: a sequence index beats a dict lookup)
        self.position = _positions(self.members, world_size)
        #: per member position: the seq its next collective will get
        self.next_seq = [0] * self.size
        #: collectives some member entered that have not completed, by seq
        self.pending: dict[int, Pending] = {}
        self.handle = SimProcessGroup(self)


class Pending:
    """Collective #seq of a group, from the first member's entry to completion."""

    __slots__ = (
        "contributions",
        "done",
        "entered",
        "group",
        "inputs",
        "mismatched",
        "outputs",
        "result",
        "seq",
        "signature",
        "signatures",
        "waiters",
    )

    def __init__(self, group: GroupState, seq: int, signature: SignatureTuple) -> None:
        size = group.size
        self.group = group
        self.seq = seq
        #: the first member's signature; the others must match it
        self.signature = signature
        self.signatures: list[SignatureTuple | None] = [None] * size
        self.inputs: list[Any] = [None] * size
        self.outputs: list[Any] = [None] * size
        #: per member, its input as nested lists; filled in one go at completion
        self.contributions: list[Any] = [None] * size
        self.entered = 0
        self.mismatched = False
        self.done = False
        self.result: Any = None
        #: ranks blocked until this completes (in the call, or in wait())
        self.waiters: list[int] = []

    def contribution(self, position: int) -> Any:
        """A member's input as nested lists (converted late if this never completed)."""
        contribution = self.contributions[position]
        if contribution is None and not self.done:
            tensor = self.inputs[position]
            if tensor is not None:
                contribution = self.contributions[position] = tensor.tolist()
        return contribution


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


class _GroupNamespace:
    """``torch.distributed.group``: only ``WORLD`` is meaningful."""

    def __init__(self, world: SimProcessGroup) -> None:
        self.WORLD = world


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
        self.scheduler = scheduler
        self.world_size = world_size
        self.groups: dict[str, GroupState] = {
            name: GroupState(name, members, world_size, scheduler)
            for name, members in groups
        }
        self._default = self.groups[world_group]
        self.group = _GroupNamespace(self._default.handle)
        #: per rank, every collective it entered, in order
        self.logs: list[list[LogEntry]] = [[] for _ in range(world_size)]
        #: per rank, (collective, blocked in wait() rather than the call) while blocked
        self.waiting_on: list[tuple[Pending, bool] | None] = [None] * world_size

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
        op_name = _OP_NAMES.get(op)
        if op_name is None:
            raise ValueError(f"dpsim does not simulate reduce op {op!r}")
        if op_name == "AVG" and not tensor.is_floating_point():
            raise ValueError("ReduceOp.AVG needs a floating-point tensor")
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
            raise ValueError(
                f"all_gather needs {state.size} output tensors for group "
                f"{state.name!r}, got {len(tensor_list)}"
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
            raise ValueError(
                f"all_gather_into_tensor output has {output_tensor.numel()} elements, "
                f"needs {state.size} x {input_tensor.numel()}"
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
            raise ValueError(
                f"broadcast source {src} is not a member of group {state.name!r}"
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

    def __getattr__(self, name: str) -> Any:
        # Never fall back to the real torch.distributed: a target reaching for
        # something unsimulated must say so, not touch a real process group.
        raise AttributeError(
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
        state = self._default if group is None else self._state_of(group)
        position = state.position[rank]
        if position < 0:
            raise ValueError(
                f"rank {rank} called {signature[0]} on group {state.name!r}, "
                f"which it is not a member of (members {list(state.members)})"
            )
        scheduler.charge()
        seq = state.next_seq[position]
        state.next_seq[position] = seq + 1
        pending = state.pending.get(seq)
        if pending is None:
            pending = state.pending[seq] = Pending(state, seq, signature)
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
        # Block until it completes (perhaps never): inlined wait_for().
        pending.waiters.append(rank)
        waiting_on = self.waiting_on
        waiting_on[rank] = (pending, False)
        scheduler.block()
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
        inputs = pending.inputs
        outputs = pending.outputs
        if kind == "barrier":
            pending.contributions = [None] * len(inputs)
        else:
            # Same shape and dtype everywhere, or it would be mismatched.
            stacked = torch.stack(inputs)
            pending.contributions = contributions = stacked.tolist()
            if kind == "all_reduce":
                assert op_name is not None
                reduced = _REDUCTION_BY_NAME[op_name](stacked)
                for output in outputs:
                    output.copy_(reduced)
                pending.result = reduced.tolist()
            elif kind == "all_gather":
                for output_list in outputs:
                    for target, source in zip(output_list, inputs, strict=True):
                        target.copy_(source)
                pending.result = contributions
            elif kind == "all_gather_into_tensor":
                gathered = stacked.reshape(outputs[0].shape)
                for output in outputs:
                    output.copy_(gathered)
                pending.result = gathered.tolist()
            else:  # broadcast
                assert src is not None
                source_position = pending.group.position[src]
                for output in outputs:
                    output.copy_(stacked[source_position])
                pending.result = contributions[source_position]
        pending.done = True
        del pending.group.pending[pending.seq]
        # Drop tensor references: the ranks own them, the trace has the lists.
        pending.inputs = pending.outputs = []
        if pending.waiters:
            self.scheduler.wake(pending.waiters)
            pending.waiters = []
