"""A diff's report: the text, the ``--json`` object and a case file per kind.

Nothing here runs a case. No timings are shown (progress goes to stderr), so
the same sides, options and seed print the same report byte for byte.

A case file is a counterexample file (:mod:`dpsim.cex.files`) of the shrunk
case as the BASE side ran it, so ``dpsim replay FILE`` reruns the base side
and ``dpsim replay FILE --vllm ... --runner ...`` (the command printed beside
it) the new one. Both sides' specs and the kinds the case shows are kept
under ``target.diff``, which the counterexample reader accepts and ignores.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from dpsim.cex import files as cex_files
from dpsim.properties import PROPERTY_NAMES
from dpsim.records.sync import SyncRecord
from dpsim.report import (
    _agreement_cell,
    _descriptor_cell,
    _inputs_cell,
    describe_policy,
    table,
)
from dpsim.targets.load import Target
from dpsim.targets.spec import TargetSpec, TreeSpec
from dpsim.terminal import printable

from .outcome import CollectiveShape, RankObserved
from .search import DiffReport, Group, SideRun

#: Collectives shown per rank and side when a rank's collectives differ.
_SHOWN_COLLECTIVES = 6


def verdict(report: DiffReport) -> str:
    """``different`` when an undeclared kind showed, ``expected`` when only
    declared ones did, else ``same``."""
    if report.unexpected:
        return "different"
    return "expected" if report.groups else "same"


def exit_status(report: DiffReport) -> int:
    return 1 if report.unexpected else 0


def _side_record(target: Target) -> dict[str, Any]:
    return {
        "label": target.label,
        "spec": target.spec.to_dict(),
        "version": target.version,
        "files": {loaded.module: loaded.sha256 for loaded in target.files},
    }


def write_case_files(report: DiffReport, out: Path) -> dict[str, Path]:
    """Each shrunk kind's case under ``out``: kind -> file."""
    written = {}
    for group in report.unexpected:
        assert group.case is not None and group.base is not None
        built = cex_files.build(
            report.base,
            group.case,
            group.base.result,
            group.base.verdicts,
            PROPERTY_NAMES,
        )
        diff = {
            "kind": group.kind,
            "kinds": list(group.kinds),
            "base": _side_record(report.base),
            "new": _side_record(report.new),
        }
        built = dataclasses.replace(built, target={**built.target, "diff": diff})
        written[group.kind] = cex_files.write(built, out, f"diff-{group.kind}")
    return written


def replay_options(spec: TargetSpec) -> str:
    """The ``dpsim replay`` options that name ``spec``."""
    words = ["--vllm", str(spec.base)]
    if spec.dp_utils_file is not None:
        words += ["--target", str(spec.dp_utils_file)]
    if spec.caller_file is not None:
        words += ["--caller-file", str(spec.caller_file)]
    words += ["--runner", spec.runner]
    return " ".join(shlex.quote(word) for word in words)


def render(report: DiffReport, written: dict[str, Path]) -> str:
    options = report.options
    low, high = options.ranks
    lines = [
        f"dpsim diff: base {_named(report.base)}",
        f"       vs  new  {_named(report.new)}",
        f"  profile {options.profile}, ranks {low}..{high}, {options.examples} "
        f"examples per scenario, seed {options.seed}; cases drawn from the "
        f"{options.cases_from} side's generators",
        f"  verdicts compared: {', '.join(report.compared)}",
        "",
    ]
    for tally in report.tallies:
        apart = [f"{tally.expected_only} expected only"] if tally.expected_only else []
        apart.extend(f"{count}: {reason}" for reason, count in tally.apart)
        lines.append(
            f"  {tally.scenario:<8} {tally.ran:>6} cases  {tally.differed:>5} differed"
            + (f"; apart: {'; '.join(apart)}" if apart else "")
        )
    if report.groups:
        lines.append("")
        lines.append("kinds of difference (cases showing each):")
        width = max(len(group.kind) for group in report.groups)
        for group in report.groups:
            where = ", ".join(f"{name} {count}" for name, count in group.counts)
            tag = "  (expected)" if group.expected else ""
            lines.append(f"  {group.kind:<{width}} {group.count:>6}  ({where}){tag}")
    for group in report.unexpected:
        lines.append("")
        lines.extend(_group_lines(report, group, written.get(group.kind)))
    lines.append("")
    kinds = len(report.unexpected)
    status = verdict(report).upper()
    expected = len(report.groups) - kinds
    lines.append(
        f"result: {status}: {report.differed} of {report.ran} cases differed in "
        f"{kinds} kind(s)"
        + (f"; {expected} expected kind(s) counted apart" if expected else "")
    )
    return "\n".join(lines)


def _named(target: Target) -> str:
    """The target's label, and where it came from when the label does not say
    (two trees of one version read alike)."""
    spec = target.spec
    paths = [spec.dp_utils_file, spec.caller_file]
    if isinstance(spec.base, TreeSpec):
        paths.append(spec.base.package_dir)
    unsaid = [str(path) for path in paths if path and str(path) not in target.label]
    return printable(" ".join([target.label, *(f"[{path}]" for path in unsaid)]))


def _group_lines(report: DiffReport, group: Group, path: Path | None) -> list[str]:
    case, base, new = group.case, group.base, group.new
    assert case is not None and base is not None and new is not None
    also = [kind for kind in group.kinds if kind != group.kind]
    lines = [
        f"== {group.kind}: {group.count} case(s); smallest (shrunk)"
        + (f", which also shows: {', '.join(also)}" if also else ""),
        f"  scenario {case.scenario}, profile {case.profile}, {case.dp_size} ranks, "
        f"{len(case.steps)} step(s)",
        f"  policy: {describe_policy(case.policy)}",
        "",
    ]
    for phase in _phases(base, new):
        lines.append(f"  {printable(phase)}:")
        rows = []
        made = [
            any(rank.sync(phase) is not None for rank in side.observed.ranks)
            for side in (base, new)
        ]
        for rank in range(case.dp_size):
            left = base.observed.ranks[rank].sync(phase)
            right = new.observed.ranks[rank].sync(phase)
            shown = left or right
            rows.append(
                (
                    str(rank),
                    _inputs_cell(shown.inputs) if shown else "",
                    *_compared(_chose(left, made[0]), _chose(right, made[1])),
                    *_compared(_agreed(left), _agreed(right)),
                )
            )
        header = (
            "rank",
            "passed in",
            "base chose",
            "new chose",
            "base agreed",
            "new agreed",
        )
        lines.extend("    " + line for line in table(header, rows).splitlines())
        lines.append("")
    lines.extend(_collective_lines(base.observed.ranks, new.observed.ranks))
    for name, side in (("base", base), ("new", new)):
        broken = "; ".join(str(verdict) for verdict in side.verdicts) or "none"
        lines.append(
            f"  {name}: outcome {side.observed.outcome}; breaks: {printable(broken)}"
        )
    if path is not None:
        lines.append(f"  written: {path}")
        lines.append(f"  replay base: dpsim replay {path}")
        lines.append(
            f"  replay new:  dpsim replay {path} {replay_options(report.new.spec)}"
        )
    return lines


def _phases(base: SideRun, new: SideRun) -> list[str]:
    names: dict[str, None] = {}
    for side in (base, new):
        for rank in side.observed.ranks:
            names.update(dict.fromkeys(record.phase for record in rank.syncs))
    return list(names)


def _chose(record: SyncRecord | None, side_made_it: bool) -> str:
    """What one rank chose; a sync the whole side never makes (a solo sync
    where callers cannot skip coordination) is not one a rank missed."""
    if record is None:
        return "(never got here)" if side_made_it else "(no such sync)"
    if record.descriptor is None:
        return f"raised {record.error}"
    loras = record.descriptor.num_active_loras
    # check's table leaves LoRA out; here it is one of the kinds compared.
    return _descriptor_cell(record.descriptor) + (f" lora={loras}" if loras else "")


def _agreed(record: SyncRecord | None) -> str:
    if record is None or record.descriptor is None:
        return ""
    text = _agreement_cell(record.agreement)
    agreement = record.agreement
    if agreement is not None and agreement.cg_mode is not None:
        text += f" cg_mode={agreement.cg_mode}"
    if agreement is not None and agreement.ubatch is not None:
        text += f" ubatch={agreement.ubatch}"
    return text


def _compared(left: str, right: str) -> tuple[str, str]:
    """Both cells, the new one starred where it differs."""
    return left, right if left == right else f"*{right}"


def _collective_lines(
    base: tuple[RankObserved, ...], new: tuple[RankObserved, ...]
) -> list[str]:
    lines: list[str] = []
    for rank, (left, right) in enumerate(zip(base, new, strict=True)):
        if left.collectives == right.collectives:
            continue
        if not lines:
            lines.append(
                "  collectives (group kind op shape dtype), where they differ:"
            )
        lines.append(f"    rank {rank} base: {_collectives(left.collectives)}")
        lines.append(f"    rank {rank} new:  {_collectives(right.collectives)}")
    if lines:
        lines.append("")
    return lines


def _collectives(shapes: tuple[CollectiveShape, ...]) -> str:
    shown = [
        f"{group}:{kind}{f'({op})' if op else ''}{list(shape)}"
        f"{'' if dtype is None else ' ' + dtype.removeprefix('torch.')}"
        for group, kind, op, shape, dtype in shapes[:_SHOWN_COLLECTIVES]
    ]
    more = len(shapes) - _SHOWN_COLLECTIVES
    return ", ".join(shown) + (f", ... {more} more" if more > 0 else "") or "none"


def summary(report: DiffReport, written: dict[str, Path]) -> dict[str, Any]:
    """The ``--json`` object."""
    options = report.options
    return {
        "verdict": verdict(report),
        "base": {"label": report.base.label, "spec": report.base.spec.to_dict()},
        "new": {"label": report.new.label, "spec": report.new.spec.to_dict()},
        "profile": options.profile,
        "ranks": list(options.ranks),
        "examples": options.examples,
        "seed": options.seed,
        "cases_from": options.cases_from,
        "compared": list(report.compared),
        "expected": sorted(options.expected),
        "cases": report.ran,
        "differed": report.differed,
        "scenarios": {
            tally.scenario: {
                "cases": tally.ran,
                "differed": tally.differed,
                "expected_only": tally.expected_only,
                "apart": dict(tally.apart),
            }
            for tally in report.tallies
        },
        "kinds": {
            group.kind: _group_summary(group, written.get(group.kind))
            for group in report.groups
        },
    }


def _group_summary(group: Group, path: Path | None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "count": group.count,
        "expected": group.expected,
        "scenarios": dict(group.counts),
    }
    if group.case is None or group.base is None or group.new is None:
        return data
    data["case"] = group.case.to_dict()
    data["also"] = [kind for kind in group.kinds if kind != group.kind]
    for name, side in (("base", group.base), ("new", group.new)):
        data[name] = {
            "outcome": side.observed.outcome,
            "verdicts": [verdict.to_dict() for verdict in side.verdicts],
            "syncs": [
                [record.to_json() for record in rank.syncs]
                for rank in side.observed.ranks
            ],
        }
    data["file"] = None if path is None else str(path)
    return data
