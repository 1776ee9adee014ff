"""Target coverage as the text a report prints."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

from .result import CoverageResult, FileCoverage
from .scope import EXIT, Arc

HEADING = (
    "target coverage (lines and branches of the target's own code this run "
    "executed; not the `coverage` property)"
)
#: Functions named in a file's heading; more are counted (the HTML names all).
_NAMED = 3


def arc_text(arc: Arc) -> str:
    start, end = arc
    return f"{start}->{'exit' if end == EXIT else end}"


def short_names(files: Iterable[FileCoverage]) -> dict[str, str]:
    """Each file's name in listings: the file name, or its path below
    ``vllm/`` where two measured files share a name (the runner lane's
    speculators)."""
    displays = [file.display for file in files]
    names = [PurePosixPath(display).name for display in displays]
    return {
        display: display if names.count(name) > 1 else name
        for display, name in zip(displays, names, strict=True)
    }


def _functions(file: FileCoverage) -> str:
    names = file.scope.functions
    if names is None:
        return ""
    if len(names) > _NAMED:
        return f" [{', '.join(names[:_NAMED])} and {len(names) - _NAMED} more]"
    return f" [{', '.join(names)}]"


def _counts(file: FileCoverage) -> str:
    lines_out = len(file.unreachable_lines)
    branches_out = len(file.unreachable_branches)
    lines = f"lines {len(file.executed_lines)}/{len(file.executable_lines) - lines_out}"
    branches = (
        f"branches {len(file.executed_branches)}/{len(file.branches) - branches_out}"
    )
    marked = lines_out + branches_out
    return f"{lines}, {branches}" + (
        f" ({marked} marked unreachable)" if marked else ""
    )


def render_text(result: CoverageResult, html_index: str | None = None) -> str:
    """The report's section: each file's totals and what never ran (each
    profile's apart where several ran, since a mark may hold for one profile
    only), then each (scenario, profile)'s totals."""
    short = short_names(result.files)
    profiles = result.profiles
    if len(profiles) > 1:
        lines = [HEADING + ":", "  all profiles together:"]
        lines += _file_lines(result.files, short, "    ")
        for profile in profiles:
            lines.append(f"  profile {profile}:")
            lines += _file_lines(result.profile(profile), short, "    ")
    else:
        named = f", profile {profiles[0]}" if profiles else ""
        lines = [HEADING + named + ":"]
        lines += _file_lines(result.files, short, "  ")
    if result.context_keys:
        lines.append("  per scenario and profile:")
        width = max(len(scenario) for scenario, _ in result.context_keys)
        for scenario, profile in result.context_keys:
            parts = [
                f"{short[file.display]} {_counts(file)}"
                for file in result.context(scenario, profile)
            ]
            lines.append(f"    {scenario:<{width}} {profile}: " + "; ".join(parts))
    if html_index is not None:
        lines.append(f"  html: {html_index}")
    return "\n".join(lines)


def _file_lines(
    files: Iterable[FileCoverage], short: dict[str, str], indent: str
) -> list[str]:
    """Each file's totals, what never ran, what marks explain (with their
    reasons) and marks found reached or matching nothing."""
    lines = []
    for file in files:
        name = short[file.display]

        def listed(items: Iterable[str], name: str = name) -> str:
            return ", ".join(f"{name}:{item}" for item in items)

        lines.append(f"{indent}{file.display}{_functions(file)}: {_counts(file)}")
        inner = indent + "  "
        if file.missing_lines:
            lines.append(
                f"{inner}lines never run: {listed(map(str, sorted(file.missing_lines)))}"
            )
        if file.missing_branches:
            lines.append(
                f"{inner}branches never taken: "
                + listed(map(arc_text, sorted(file.missing_branches)))
            )
        for line, reason in sorted(file.unreachable_lines.items()):
            lines.append(f"{inner}unreachable {name}:{line}: {reason}")
        for arc, reason in sorted(file.unreachable_branches.items()):
            lines.append(f"{inner}unreachable {name}:{arc_text(arc)}: {reason}")
        for mark in file.marked.reached:
            lines.append(f"{inner}marked unreachable but reached: {mark.shown}")
        for mark in file.marked.stale:
            lines.append(f"{inner}unreachable mark matches nothing here: {mark.shown}")
    return lines
