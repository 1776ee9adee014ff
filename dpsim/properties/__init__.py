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
from dpsim.records.case import Case
from dpsim.records.trace import SimResult

from . import (
    agreed_values,
    agreement,
    coverage,
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
from .base import Evidence, Phase, Property, Verdict

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


def judge(
    case: Case, result: SimResult, properties: Iterable[Property] | None = None
) -> list[Verdict]:
    evidence = Evidence(case, result)
    verdicts = []
    for prop in properties if properties is not None else PROPERTIES.values():
        if not prop.applies_to(evidence.runner):
            continue
        verdict = prop.check(evidence)
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
    "PROPERTIES",
    "PROPERTY_NAMES",
    "Evidence",
    "Phase",
    "Property",
    "Verdict",
    "judge",
    "not_run",
    "select",
]
