"""A mutation run for people (the score, then every survivor as a diff to
review) and for machines (one JSON object)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dpsim.mutate.files import diff_name
from dpsim.mutate.session import MutationReport, Result
from dpsim.report import table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def summary(report: MutationReport) -> dict[str, Any]:
    """The run as one JSON-able object; survivors carry their diffs."""
    budget = report.plan.budget
    return {
        "target": report.target,
        "file": report.file,
        "sha256": report.sha256,
        "runner": report.plan.runner,
        "lane": report.plan.lane,
        # What was mutated: the runner's sync or (V1) the caller method.
        "slot": report.plan.slot,
        "operators": list(report.operators),
        "options": {
            "examples": budget.examples,
            "seed": budget.seed,
            "ranks": list(budget.ranks),
            "profiles": list(budget.profiles),
            "seconds": budget.seconds,
            "workers": report.workers,
        },
        "legs": [
            {
                "scenario": leg.scenario,
                "profile": leg.profile,
                "relative": leg.relative,
            }
            for leg in report.plan.legs
        ],
        "inherited": [
            {
                "scenario": item.scenario,
                "profile": item.profile,
                "property": item.property,
                "message": item.message,
            }
            for item in report.plan.inherited
        ],
        "baseline_seconds": round(report.plan.baseline_seconds, 3),
        "generated": report.generated,
        "mutants": len(report.results),
        "equivalent": len(report.equivalent),
        "killed": len(report.killed),
        "survived": len(report.survived),
        "timeouts": len(report.timeouts),
        "refused": len(report.refused),
        "score": None if report.score is None else round(report.score, 4),
        "kill_seconds": {
            key: None if value is None else round(value, 3)
            for key, value in report.kill_seconds().items()
        },
        "killed_by": report.killed_by(),
        "seconds": round(report.seconds, 3),
        "results": [_result(report, result) for result in report.results],
    }


def _result(report: MutationReport, result: Result) -> dict[str, Any]:
    mutant, outcome = result.mutant, result.outcome
    entry: dict[str, Any] = {
        "id": mutant.id,
        "operator": mutant.operator,
        "function": mutant.function,
        "line": mutant.line,
        "description": mutant.description,
        "status": "equivalent" if result.equivalent is not None else outcome.status,
        "killer": outcome.killer,
        "scenario": outcome.scenario,
        "profile": outcome.profile,
        "message": outcome.message,
        "seconds": None if outcome.seconds is None else round(outcome.seconds, 3),
        "elapsed": round(outcome.elapsed, 3),
    }
    if result.equivalent is not None:
        entry["reason"] = result.equivalent
        entry["checked"] = outcome.status
    if result.equivalent is not None or not outcome.killed:
        entry["diff"] = mutant.diff(report.original, diff_name(report.plan.slot))
    return entry


def render(report: MutationReport) -> str:
    budget = report.plan.budget
    low, high = budget.ranks
    lines = [
        f"dpsim mutate: {report.target} ({Path(report.file).name}, "
        f"sha256 {report.sha256[:12]}), {len(report.results)} mutants"
        + (f" of {report.generated}" if report.generated != len(report.results) else "")
        + f", {budget.examples} examples per leg, ranks {low}..{high}, "
        f"seed {budget.seed}, {report.workers} worker(s)",
        "legs: "
        + ", ".join(f"{leg.scenario}/{leg.profile}" for leg in report.plan.legs)
        + f" (the original ran them in {report.plan.baseline_seconds:.1f}s)",
    ]
    for item in report.plan.inherited:
        if report.plan.lane == "runner":
            lines.append(
                f"not judged on mutants: the original already breaks "
                f"{item.property} ({item.message})"
            )
            continue
        lines.append(
            f"judged against the original in {item.scenario}/{item.profile}: "
            f"it already breaks {item.property} ({item.message})"
        )
    lines.append("")
    rows = []
    for operator in report.operators:
        mine = [r for r in report.scored if r.mutant.operator == operator]
        if not mine and not any(
            r.mutant.operator == operator for r in report.equivalent
        ):
            continue
        killed = sum(r.outcome.killed for r in mine)
        equivalent = sum(r.mutant.operator == operator for r in report.equivalent)
        rows.append(
            (
                operator,
                str(len(mine) + equivalent),
                str(killed),
                str(len(mine) - killed),
                str(equivalent),
            )
        )
    lines.append(
        table(("operator", "mutants", "killed", "survived", "equivalent"), rows)
    )
    lines.append("")
    if report.survived:
        lines.append(
            "survivors, to review (each is a missing property or case, "
            "or an equivalent mutant to list with a reason):"
        )
        for result in report.survived:
            note = f"  [{result.outcome.message}]" if result.outcome.message else ""
            lines.append(f"\n{result.mutant.id}  {result.mutant.description}{note}")
            lines.append(
                result.mutant.diff(
                    report.original, diff_name(report.plan.slot)
                ).rstrip()
            )
        lines.append("")
    for result in report.timeouts:
        lines.append(f"timeout: {result.mutant.id}  {result.outcome.message}")
    if report.refused:
        lines.append(
            "refused by the runner lane (no verdict, not scored: a stand-in was "
            "asked what it does not know, or a class could not be rebuilt):"
        )
        for result in report.refused:
            lines.append(f"  {result.mutant.id}  {result.outcome.message}")
        lines.append("")
    if report.equivalent:
        lines.append("equivalent (reviewed, not scored):")
        for result in report.equivalent:
            lines.append(f"  {result.mutant.id}  {result.equivalent}")
        lines.append("")
    for result in report.wrongly_equivalent:
        lines.append(
            f"warning: {result.mutant.id} is listed as equivalent but "
            f"{result.outcome.killer} killed it: {result.outcome.message}"
        )
    times = report.kill_seconds()
    killers = ", ".join(f"{name} {count}" for name, count in report.killed_by().items())
    lines += [
        f"killed by: {killers or '-'}",
        f"time to kill: median {_seconds(times['median'])}, "
        f"p90 {_seconds(times['p90'])}, max {_seconds(times['max'])}",
        f"score: {_percent(report.score)} ({len(report.killed)} of "
        f"{len(report.scored)} non-equivalent mutants killed; "
        f"{len(report.survived)} survived, {len(report.timeouts)} timed out, "
        f"{len(report.equivalent)} equivalent"
        + (f", {len(report.refused)} refused" if report.refused else "")
        + f") in {report.seconds:.1f}s",
    ]
    return "\n".join(lines)


def write(report: MutationReport, out: Path) -> Path:
    """``mutate.json`` and one ``.diff`` per survivor under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = out / "mutate.json"
    written.write_text(json.dumps(summary(report), indent=2, sort_keys=True) + "\n")
    survivors = out / "survivors"
    survivors.mkdir(exist_ok=True)
    for stale in survivors.glob("*.diff"):
        stale.unlink()
    for result in report.survived:
        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", result.mutant.id)
        (survivors / f"{name}.diff").write_text(
            result.mutant.diff(report.original, diff_name(report.plan.slot))
        )
    return written
