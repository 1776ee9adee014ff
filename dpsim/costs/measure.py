"""Run a workload through the real target and read off what every rank ran.

Costs come from vLLM's own code, not a model of it: each workload step
becomes one sync per rank in a ``step`` case, run on the simulator by
:func:`~dpsim.scenarios.run_case`, and the descriptors the real
``dispatch_cg_and_sync_dp`` returned are what the figures count. Request
lists become sync inputs the way vLLM's model runner builds them (the
``caller`` profile's model of the loaded version), and idle ranks pass
vLLM's dummy batch, so the padding an idle rank causes is counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpsim.capture.table import capture_table
from dpsim.properties.base import Evidence
from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.scenarios import run_case
from dpsim.scenarios.generate import CallerModel
from dpsim.scenarios.run import manager_for, tables_for
from dpsim.targets.load import Target

from .figures import StepCost
from .workload import Workload

__all__ = ["Measured", "graph_count", "measure", "rank_batch"]


def rank_batch(
    model: CallerModel, policy: CapturePolicy, lengths: Sequence[int]
) -> RankBatch:
    """What a rank with requests of ``lengths`` passes to the sync.

    A request longer than the decode query length is a prefill (chunk);
    an idle rank runs vLLM's dummy batch of one decode.
    """
    query_len = policy.decode_query_len
    has = model.features.__contains__
    prefills = sum(length > query_len for length in lengths)
    if not lengths:
        lengths, kind = [query_len], "dummy"
    elif prefills == 0:
        kind = "decode"
    else:
        kind = "prefill" if prefills == len(lengths) else "mixed"
    uniform = model.uniform(list(lengths), prefills > 0)
    bound: int | None = max(lengths)
    if not has("max_query_len") or (prefills and model.drops_query_bound_on_prefill):
        bound = None
    return RankBatch(
        num_reqs=len(lengths),
        num_tokens=sum(lengths),
        uniform_token_count=uniform,
        max_query_len=bound,
        allow_ubatching=has("allow_ubatching") and policy.microbatching is not None,
        uniform_decode=has("uniform_decode") and uniform == query_len,
        kind=kind,
    )


@dataclass(frozen=True)
class Measured:
    """Per-step observations of one run, and how many steps did not finish."""

    steps: tuple[StepCost, ...]
    unfinished: int
    #: The simulator's outcome ("ok" normally; "hang", "mismatch", ...).
    outcome: str


def measure(target: Target, policy: CapturePolicy, workload: Workload) -> Measured:
    """Run every working step of ``workload`` under ``policy``; raises PolicyRefused.

    Steps where every rank is idle are not run, as vLLM does not step then;
    the workload counts them (``Workload.idle_steps``).
    """
    model = CallerModel.of(target)
    working = workload.working_steps
    batches = tuple(
        tuple(rank_batch(model, policy, lengths) for lengths in step)
        for step in working
    )
    case = Case(scenario="step", profile="caller", policy=policy, steps=batches)
    result = run_case(target, case)
    finished = {phase.name: phase for phase in Evidence(case, result).complete_phases}
    observed = []
    for index, step in enumerate(working):
        phase = finished.get(f"step {index}")
        if phase is None:
            continue
        descriptors = [phase.descriptor(rank) for rank in range(len(step))]
        modes = {str(descriptor.cg_mode) for descriptor in descriptors}
        observed.append(
            StepCost(
                mode=modes.pop() if len(modes) == 1 else "mixed",
                real=tuple(sum(lengths) for lengths in step),
                passed=tuple(batch.num_tokens for batch in batches[index]),
                ran=tuple(int(descriptor.num_tokens) for descriptor in descriptors),
            )
        )
    return Measured(tuple(observed), len(working) - len(observed), str(result.outcome))


def graph_count(target: Target, policy: CapturePolicy, dp_size: int) -> int:
    """Graphs the real manager captures for the policy, drafter tables included."""
    count = capture_table(
        manager_for(target, policy.manager_config(dp_size))
    ).graph_count
    if policy.drafter is not None:
        tables = tables_for(target, policy, dp_size)
        for config in (tables.drafter_prefill, tables.drafter_decode):
            count += capture_table(manager_for(target, config)).graph_count
    return count
