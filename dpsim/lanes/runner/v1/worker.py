"""The real ``Worker`` of a release over its real V1 ``GPUModelRunner``, per rank.

:func:`build_v1_worker` gives the engine the worker protocol the V2 lane's
:func:`~dpsim.lanes.runner.worker.build_worker` gives (``execute_model``,
``sample_tokens``, ``execute_dummy_batch``, ``take_draft_token_ids``: the
release's real ``Worker`` methods, :func:`~dpsim.lanes.runner.worker.worker_over`),
over the rank's real V1 runner (:mod:`.model_runner`) and, when the options
name a speculator, the drafter a ``proposer_factory`` builds
(:func:`~.proposer.build_v1_proposer`) from the rank's :class:`~.model_runner.V1RankKit`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from dpsim.errors import TargetError
from dpsim.lanes.runner.sources import RunnerSources
from dpsim.lanes.runner.stream import EngineOptions
from dpsim.lanes.runner.syncs import Phases
from dpsim.lanes.runner.v1.model_runner import (
    V1RankKit,
    build_v1_model_runner,
    v1_rank_kit,
)
from dpsim.lanes.runner.worker import worker_over
from dpsim.records.policy import CapturePolicy

#: ``proposer_factory(rank_kit)``: the rank's drafter, or None for none (the
#: run binds :func:`~.proposer.build_v1_proposer` to the rank's sources, options,
#: policy, rank and size).
ProposerFactory = Callable[[V1RankKit], Any]


def build_v1_worker(
    sources: RunnerSources,
    options: EngineOptions,
    policy: CapturePolicy,
    rank: int,
    dp_size: int,
    proposer_factory: ProposerFactory | None = None,
    *,
    phases: Phases | None = None,
) -> Any:
    """Rank ``rank``'s real ``Worker`` over its real V1 ``GPUModelRunner``.

    Its syncs (the runner's and the drafter's) are recorded in the running
    rank's trace as the sync lane's V1 syncs are, their phases numbered by
    ``phases`` (a fresh counter when None). A speculator in ``options`` with
    no ``proposer_factory`` is refused in one line.
    """
    rank_kit = v1_rank_kit(sources, rank, dp_size, phases)
    drafter = None if proposer_factory is None else proposer_factory(rank_kit)
    if options.speculator is not None and drafter is None:
        raise TargetError(
            f"runner lane: the V1 runner's {options.speculator} drafter is not "
            "built (no proposer given)"
        )
    runner = build_v1_model_runner(sources, options, policy, rank_kit, drafter)
    return worker_over(sources, runner)


def real_classes(sources: RunnerSources, target: Any = None) -> tuple[type, ...]:
    """The release's classes the V1 lane rebuilds (their real methods:
    ``cls.DPSIM_ORIGIN.codes()``), for line coverage and mutation: the
    worker, the V1 runner, and the drafter's where the release has them."""
    from dpsim.lanes.runner.v1.model_runner import v1_runner_kit
    from dpsim.lanes.runner.v1.proposer import real_classes as drafter_classes
    from dpsim.lanes.runner.worker import _worker_class

    classes: list[type] = [_worker_class(sources), v1_runner_kit(sources).runner_class]
    with contextlib.suppress(TargetError):  # a release without them: its cases say so
        classes.extend(drafter_classes(sources, target or sources.target))
    return tuple(classes)
