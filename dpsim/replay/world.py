"""The ``World`` a target sees in one real process of the replay lane.

``dist`` is real ``torch.distributed`` behind a thin recorder: before a
collective runs, the rank writes (and flushes) which one it enters, with the
same signature the simulator records; after it returns, the result. A rank
killed mid-collective, or aborted by gloo on a size mismatch, has thus already
said where it stood. ``dp_group()`` is the simulator's own
``GroupCoordinatorView`` over the real groups (gloo ``cpu_group`` for the sync,
as vLLM has it), so both lanes route the coordinator's methods identically.
Steps are counted as the simulator counts them (a tick per loop iteration,
one per collective), so a spinning rank stops with the same ``budget`` verdict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import torch
import torch.distributed as real_dist

from dpsim.boundary import modelled
from dpsim.records.dist import GroupNamespace
from dpsim.records.groups import DP_CPU_GROUP, DP_DEVICE_GROUP, WORLD_GROUP
from dpsim.records.trace import Payload, payload_json
from dpsim.sim.collectives import OP_NAMES
from dpsim.sim.coordinator import GroupCoordinatorView
from dpsim.sim.scheduler import StepBudgetExceeded
from dpsim.targets import runtime

ReduceOp = real_dist.ReduceOp


class RankLog:
    """One JSON object per line, flushed at once: what the parent reads back."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, **entry: Any) -> None:
        self._stream.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._stream.flush()


class RealWork:
    """An async collective's handle: the result is logged when it is waited for."""

    def __init__(self, dist: RecordingDist, work: Any, finish: Callable[[], Any]):
        self._dist = dist
        self._work = work
        self._finish = finish
        self._done = False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._dist._wait(self._work, self._finish)
            self._done = True
        return True

    def is_completed(self) -> bool:
        self._dist.world.tick()
        return bool(self._work.is_completed())

    def is_success(self) -> bool:
        return bool(self._work.is_success())


class RecordingDist:
    """Real ``torch.distributed``, recording each collective as the simulator does.

    Collectives on a group whose backend needs device tensors (NCCL) move the
    caller's CPU tensors there and back, so scenario programs stay
    device-agnostic. Anything else is real ``torch.distributed`` itself.
    """

    ReduceOp = ReduceOp

    def __init__(
        self,
        world: RealWorld,
        groups: dict[str, Any],
        devices: dict[str, torch.device],
    ) -> None:
        self.world = world
        self._names = {id(group): name for name, group in groups.items()}
        self._devices = {id(group): devices[name] for name, group in groups.items()}
        self._world_group = groups[WORLD_GROUP]
        self.group = GroupNamespace(self._world_group)
        #: per group name, the seq its next collective will get
        self._next_seq = dict.fromkeys(groups, 0)

    if not TYPE_CHECKING:
        # Hidden from mypy, which would otherwise take every name as present
        # and never hold this class to ``DistLike``.

        def __getattr__(self, name: str) -> Any:
            return getattr(real_dist, name)

    def is_initialized(self) -> bool:
        return real_dist.is_initialized()

    def get_rank(self, group: Any = None) -> int:
        return real_dist.get_rank(group)

    def get_world_size(self, group: Any = None) -> int:
        return real_dist.get_world_size(group)

    # -- collectives -----------------------------------------------------------

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        signature = ("all_reduce", OP_NAMES.get(op, str(op)), tensor, None)
        pg, device = self._resolve(group)
        moved = tensor.to(device)

        def start() -> Any:
            return real_dist.all_reduce(moved, op=op, group=pg, async_op=async_op)

        def finish() -> Any:
            tensor.copy_(moved)
            return tensor.tolist()

        return self._collective(group, signature, tensor, start, finish, async_op)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        pg, device = self._resolve(group)
        moved = tensor.to(device)
        outputs = [item.to(device) for item in tensor_list]

        def start() -> Any:
            return real_dist.all_gather(outputs, moved, group=pg, async_op=async_op)

        def finish() -> Any:
            for target, source in zip(tensor_list, outputs, strict=True):
                target.copy_(source)
            return [item.tolist() for item in tensor_list]

        signature = ("all_gather", None, tensor, None)
        return self._collective(group, signature, tensor, start, finish, async_op)

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        pg, device = self._resolve(group)
        moved_in = input_tensor.to(device)
        moved_out = output_tensor.to(device)

        def start() -> Any:
            return real_dist.all_gather_into_tensor(
                moved_out, moved_in, group=pg, async_op=async_op
            )

        def finish() -> Any:
            output_tensor.copy_(moved_out)
            return output_tensor.tolist()

        signature = ("all_gather_into_tensor", None, input_tensor, None)
        return self._collective(group, signature, input_tensor, start, finish, async_op)

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> Any:
        pg, device = self._resolve(group)
        moved = tensor.to(device)

        def start() -> Any:
            return real_dist.broadcast(moved, src=src, group=pg, async_op=async_op)

        def finish() -> Any:
            tensor.copy_(moved)
            return tensor.tolist()

        signature = ("broadcast", None, tensor, src)
        return self._collective(group, signature, tensor, start, finish, async_op)

    def barrier(self, group: Any = None, async_op: bool = False, **_: Any) -> Any:
        pg, _device = self._resolve(group)

        def start() -> Any:
            return real_dist.barrier(group=pg, async_op=async_op)

        return self._collective(
            group, ("barrier", None, None, None), None, start, lambda: None, async_op
        )

    # -- recording ----------------------------------------------------------------

    def _resolve(self, group: Any) -> tuple[Any, torch.device]:
        pg = self._world_group if group is None else group
        device = self._devices.get(id(pg))
        if device is None:
            raise TypeError(
                f"group={group!r} is not one of the replay lane's process groups"
            )
        return pg, device

    def _collective(
        self,
        group: Any,
        signature: tuple[str, str | None, torch.Tensor | None, int | None],
        contribution: torch.Tensor | None,
        start: Callable[[], Any],
        finish: Callable[[], Any],
        async_op: bool,
    ) -> Any:
        world = self.world
        world.tick()  # the simulator charges a step per collective entered
        name = self._names[id(self._world_group if group is None else group)]
        seq = self._next_seq[name]
        self._next_seq[name] = seq + 1
        kind, op, tensor, src = signature
        world.entered += 1
        world.log.write(
            enter=[
                name,
                seq,
                kind,
                op,
                None if tensor is None else list(tensor.shape),
                None if tensor is None else str(tensor.dtype),
                src,
            ],
            contribution=None if contribution is None else contribution.tolist(),
            is_async=async_op,
            steps=world.steps,
        )
        try:
            work = start()
        except Exception as error:
            world.log.write(collective_error=_one_line(error))
            # The real collective's own error (a timeout where peers never
            # enter): what vLLM meets in a deployment, judged as vLLM's.
            modelled(error)
            raise
        if async_op:
            return RealWork(self, work, finish)
        world.log.write(exit=finish())
        return None

    def _wait(self, work: Any, finish: Callable[[], Any]) -> None:
        try:
            work.wait()
        except Exception as error:
            self.world.log.write(collective_error=_one_line(error))
            modelled(error)  # the real collective's own, as above
            raise
        self.world.log.write(exit_async=finish())


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


class RealWorld:
    """``runtime.World`` and the scenario programs' world, for one real rank."""

    def __init__(
        self,
        rank: int,
        ranks: int,
        groups: dict[str, Any],
        devices: dict[str, torch.device],
        log: RankLog,
        step_budget: int,
    ) -> None:
        self.rank = rank
        self.log = log
        self.steps = 0
        self._skip = False
        self.entered = 0
        self._budget = step_budget
        self._groups = groups
        self.dist = RecordingDist(self, groups, devices)
        self._dp = GroupCoordinatorView(
            self.dist,
            "dp",
            rank,
            rank,
            list(range(ranks)),
            groups[DP_CPU_GROUP],
            groups[DP_DEVICE_GROUP],
        )

    # -- runtime.World ----------------------------------------------------------

    def dp_group(self) -> GroupCoordinatorView:
        return self._dp

    def pp_group(self) -> runtime.GroupCoordinatorLike:
        return runtime.SINGLE_PIPELINE_STAGE

    def skip_dp_coordination(self) -> bool:
        return self._skip

    def set_skip_dp_coordination(self, flag: bool) -> None:
        self._skip = flag

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self._budget:
            raise StepBudgetExceeded(
                f"rank {self.rank} exceeded its step budget of {self._budget}"
            )

    # -- scenario programs --------------------------------------------------------

    def group(self, name: str) -> Any:
        return self._groups[name]

    def record(self, kind: str, payload: Payload) -> None:
        self.log.write(event=[kind, self.entered, payload_json(payload)])
