"""The world a loaded target sees when it reaches outside its own code.

A loaded target's ``torch.distributed``, ``get_dp_group()``, ``get_pp_group()``
and ``should_skip_dp_coordination()`` resolve here *at call time* to whichever
world is installed: the simulator's virtual ranks and fake collectives, the
real process groups of a replay lane, or, when nothing is installed, real
``torch.distributed`` and a DP group that refuses to be used. Nothing in torch
is ever patched; only code loaded through :mod:`dpsim.targets.shim` looks here,
so the rest of the process keeps the real thing.

Loops in loaded code tick once per iteration (the shim inserts
``TICKS.tick()``), which is how a simulator turns a rank that spins forever
into a verdict instead of a hung harness, without any wall-clock timeout.

While a world is installed, torch runs in inference mode
(``torch.inference_mode()``), as it does where vLLM makes these calls: its
model runners' ``execute_model`` and ``_dummy_run``, which reach the DP sync,
are decorated with it. It is entered once per installation rather than per
rank because the flag is thread-local and the virtual ranks share a thread,
and it makes torch's small operations, most of a sync's cost, skip autograd's
dispatch: about 14 % fewer instructions per simulated 8-rank round, on every
side alike (the simulator, the bench's bare calls, a replay's processes).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.distributed

from dpsim.records.dist import DistLike


class GroupCoordinatorLike(Protocol):
    """What vLLM code reads off ``get_dp_group()`` and friends.

    Mirrors the parts of vLLM's ``GroupCoordinator`` that DP-sync code touches;
    a world supplies one per group.
    """

    cpu_group: Any
    device_group: Any
    world_size: int
    rank_in_group: int
    ranks: list[int]
    device: Any
    is_first_rank: bool
    is_last_rank: bool

    def cpu_all_reduce_(self, tensor: Any) -> Any: ...
    def all_reduce(self, tensor: Any) -> Any: ...
    def all_gather(self, tensor: Any, dim: int = 0) -> Any: ...
    def broadcast(self, tensor: Any, src: int = 0) -> Any: ...
    def barrier(self) -> None: ...


class World(Protocol):
    """Everything a target may reach for outside its own module."""

    @property
    def dist(self) -> DistLike:
        """Stands in for ``torch.distributed`` inside loaded targets."""

    def dp_group(self) -> GroupCoordinatorLike: ...
    def pp_group(self) -> GroupCoordinatorLike: ...
    def skip_dp_coordination(self) -> bool: ...
    def tick(self) -> None: ...


class NoDPGroupError(RuntimeError):
    """Raised when a target asks for its DP group outside any simulated or real run."""


class _SinglePipelineStage:
    """The pipeline group of a deployment without pipeline parallelism."""

    cpu_group = None
    device_group = None
    world_size = 1
    rank_in_group = 0
    ranks = [0]  # noqa: RUF012 - mirrors vLLM's attribute, never mutated
    device = None
    is_first_rank = True
    is_last_rank = True

    def cpu_all_reduce_(self, tensor: Any) -> Any:
        return tensor

    def all_reduce(self, tensor: Any) -> Any:
        return tensor

    def all_gather(self, tensor: Any, dim: int = 0) -> Any:
        return tensor

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        return tensor

    def barrier(self) -> None:
        return None


SINGLE_PIPELINE_STAGE = _SinglePipelineStage()


class NoWorld:
    """What a target sees when it is called outside a simulator or replay lane.

    Building managers and introspecting a target need no world; running the
    sync does, and says so instead of touching a default process group.
    """

    dist: DistLike = torch.distributed

    def dp_group(self) -> GroupCoordinatorLike:
        raise NoDPGroupError(
            "the target asked for its DP group outside a run: call it through "
            "dpsim.sim (virtual ranks) or dpsim.replay (real process groups)"
        )

    def pp_group(self) -> GroupCoordinatorLike:
        return SINGLE_PIPELINE_STAGE

    def skip_dp_coordination(self) -> bool:
        return False

    def tick(self) -> None:
        return None


NO_WORLD = NoWorld()
_current: World = NO_WORLD

#: What loaded code's loops tick: ``TICKS.tick`` is the installed world's own
#: ``tick``, rebound by :func:`install`, so an iteration costs one call (the
#: world's) rather than two. A plain module: the interpreter specializes a
#: method lookup on one, and rebinding a name it has keeps that.
TICKS = types.ModuleType("dpsim.targets.runtime.TICKS")
TICKS.__dict__["tick"] = NO_WORLD.tick

#: What :func:`install` replaced: the world and the tick to put back, and
#: the inference mode it entered, to leave.
Installation = tuple[World, Any, torch.inference_mode]


def current() -> World:
    return _current


@contextmanager
def installed(world: World) -> Iterator[World]:
    """Make ``world`` the one loaded targets see, for the duration of the block."""
    previous = install(world)
    try:
        yield world
    finally:
        restore(previous)


def install(world: World) -> Installation:
    """Make ``world`` the one loaded targets see until :func:`restore` is
    given what this returns; :func:`installed` is the usual way, this one
    for a caller that installs a world for every short run (the simulator),
    where a generator-based context manager costs as much as a rank's step."""
    global _current
    ticks = TICKS.__dict__
    mode = torch.inference_mode()
    mode.__enter__()
    previous = (_current, ticks["tick"], mode)
    _current = world
    ticks["tick"] = world.tick
    return previous


def restore(previous: Installation) -> None:
    """Put back the world (and its tick) that :func:`install` replaced."""
    global _current
    _current, TICKS.__dict__["tick"], mode = previous
    mode.__exit__(None, None, None)


def tick() -> None:
    """One loop iteration, for code not loaded through the shim (which calls
    ``TICKS.tick()`` itself)."""
    _current.tick()


class DistProxy:
    """``torch.distributed`` as loaded targets see it: the installed world's.

    Attribute lookups are forwarded on every access, so a target module that
    did ``import torch.distributed as dist`` at load time still reaches the
    world installed when it runs.
    """

    def __getattr__(self, name: str) -> Any:
        dist = _current.dist
        try:
            return getattr(dist, name)
        except AttributeError:
            # A fake says what it does not simulate (SimCollectives.unsimulated).
            unsimulated = getattr(dist, "unsimulated", None)
            if unsimulated is None:
                raise
            raise unsimulated(name) from None

    def __repr__(self) -> str:
        return "<torch.distributed as seen by a dpsim target>"


DIST_PROXY = DistProxy()
