"""The invariants (names are part of dpsim's interface), and judging a run.

Each property is defined, with what it asserts, why it matters and which
upstream bug class it guards, in its own module. ``judge(case, result)``
returns the verdicts of the properties asked for, in the order listed here:
the ones that explain a failure best come first. A property that does not
apply to the runner whose trace is judged (``Property.not_for_v1``) is not
run on it; :func:`not_run` says which were left out and why, for reports.
"""

from __future__ import annotations

from collections.abc import Iterable

from dpsim.errors import UsageError
from dpsim.records.trace import SimResult

from . import (
    agreed_values,
    agreement,
    coverage,
    drafter_forwards,
    dummy_shape,
    eager_contagion,
    graph_choice,
    idle,
    no_error,
    no_hang,
    padded_counts,
    reuse,
    solo,
    ubatch_decision,
    ubatch_split,
)
from .base import Evidence, JudgedCase, Phase, Property, Verdict

PROPERTIES: dict[str, Property] = {
    module.PROPERTY.name: module.PROPERTY
    for module in (
        no_error,
        no_hang,
        agreement,
        agreed_values,
        reuse,
        solo,
        eager_contagion,
        idle,
        padded_counts,
        coverage,
        ubatch_split,
        ubatch_decision,
        graph_choice,
    )
}
PROPERTY_NAMES = tuple(PROPERTIES)

#: Properties only the runner lane's traces can show (they read what the real
#: engine loop, model runner and speculators leave: drafter forwards, dummy
#: batches run for real). Kept apart from :data:`PROPERTIES`, the sync lane's
#: suite, so its reports and files stay as they are.
RUNNER_PROPERTIES: dict[str, Property] = {
    module.PROPERTY.name: module.PROPERTY for module in (drafter_forwards, dummy_shape)
}
#: Every property name a file may list, whichever lane wrote it.
ALL_PROPERTY_NAMES = PROPERTY_NAMES + tuple(RUNNER_PROPERTIES)
#: The sync lane's properties the runner lane does not run, and why: they
#: judge a sync against the oracle's ExpectRecords, which the sync lane's
#: modelled callers record and the real callers do not.
NOT_FOR_RUNNER_LANE = {
    "graph-choice": "needs the sync lane's oracle (expect records); the runner "
    "lane's syncs are made by vLLM's own callers, with no oracle beside them",
    "ubatch-decision": "needs the sync lane's oracle (expect records); the "
    "runner lane's syncs are made by vLLM's own callers, with no oracle beside them",
}
#: The runner lane's suite, in the order its verdicts explain a failure best:
#: a raise, then a drafter running a different number of forwards (the cause
#: of the hang it leaves), the hang itself, then the per-sync properties.
RUNNER_LANE_PROPERTIES: dict[str, Property] = {
    name: prop
    for name, prop in (
        ("no-error", PROPERTIES["no-error"]),
        ("drafter-forwards", RUNNER_PROPERTIES["drafter-forwards"]),
        *(
            (name, prop)
            for name, prop in PROPERTIES.items()
            if name not in NOT_FOR_RUNNER_LANE and name != "no-error"
        ),
        ("dummy-shape", RUNNER_PROPERTIES["dummy-shape"]),
    )
}


def select(
    names: Iterable[str] | None, runner: str | None = None
) -> tuple[Property, ...]:
    """The properties named (all when None), refusing unknown names clearly;
    with ``runner``, refusing one named that is not run on it (a check of it
    would pass without judging anything)."""
    if not names:
        return tuple(PROPERTIES.values())
    chosen = []
    for name in names:
        if name not in PROPERTIES:
            raise UsageError(
                f"unknown property {name!r}; known: {', '.join(PROPERTY_NAMES)}"
            )
        prop = PROPERTIES[name]
        if runner is not None and not prop.applies_to(runner):
            raise UsageError(
                f"property {name!r} is not run on the {runner.upper()} runner: "
                f"{prop.not_for_v1}"
            )
        chosen.append(prop)
    return tuple(chosen)


def select_for_runner_lane(names: Iterable[str] | None) -> tuple[Property, ...]:
    """The runner lane's properties named (its whole suite when None),
    refusing unknown ones and those it does not run, in one line each."""
    if not names:
        return tuple(RUNNER_LANE_PROPERTIES.values())
    chosen = []
    for name in names:
        if name in NOT_FOR_RUNNER_LANE:
            raise UsageError(
                f"property {name!r} is not run on the runner lane: "
                f"{NOT_FOR_RUNNER_LANE[name]}"
            )
        if name not in RUNNER_LANE_PROPERTIES:
            raise UsageError(
                f"unknown property {name!r}; the runner lane's: "
                f"{', '.join(RUNNER_LANE_PROPERTIES)}"
            )
        chosen.append(RUNNER_LANE_PROPERTIES[name])
    return tuple(chosen)


def judge(
    case: JudgedCase, result: SimResult, properties: Iterable[Property] | None = None
) -> list[Verdict]:
    evidence = Evidence(case, result)
    runner = evidence.runner
    verdicts = []
    for prop in properties if properties is not None else PROPERTIES.values():
        # Asked only of a property that names a runner it is not for (three
        # do): a call per property per run cost more than some judge.
        if prop.not_for_v1 is not None and not prop.applies_to(runner):
            continue
        verdict = prop.judge(evidence)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def not_run(
    runner: str, properties: Iterable[Property] | None = None
) -> dict[str, str]:
    """The properties (all when None) that are not run on ``runner``'s traces,
    each with the reason its module gives."""
    chosen = properties if properties is not None else PROPERTIES.values()
    return {
        prop.name: prop.not_for_v1
        for prop in chosen
        if not prop.applies_to(runner) and prop.not_for_v1 is not None
    }


__all__ = [
    "ALL_PROPERTY_NAMES",
    "NOT_FOR_RUNNER_LANE",
    "PROPERTIES",
    "PROPERTY_NAMES",
    "RUNNER_LANE_PROPERTIES",
    "RUNNER_PROPERTIES",
    "Evidence",
    "JudgedCase",
    "Phase",
    "Property",
    "Verdict",
    "judge",
    "not_run",
    "select",
    "select_for_runner_lane",
]
