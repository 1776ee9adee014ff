"""The cross-version report: one check per (release, runner), one row per scenario.

Answers "which vLLM releases have this DP-sync bug?" in a table that can be
pasted into an upstream issue: each row is a version (or a file on a version),
the model runner whose sync ran and a scenario, with ``pass`` or the property
that failed and a link to its counterexample file. Targets are checked in parallel child processes
(:mod:`dpsim.processes`), one per target, each loading its own; the rows come
back in the order asked for, and a child that dies gives its target an
``error`` row instead of sinking the report.
"""

from __future__ import annotations

import html
import os
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from dpsim import cex, processes
from dpsim.check import CheckOptions, run_check
from dpsim.errors import UsageError, debugging
from dpsim.options import RUNNERS
from dpsim.properties import PROPERTY_NAMES
from dpsim.report import table
from dpsim.targets import load_target, parse_target
from dpsim.targets.spec import OLDEST_SUPPORTED

#: Every release whose V2 API dpsim adapts: the first of each minor, 0.18 to 0.34.
SUPPORTED_RELEASES = tuple(f"0.{minor}.0" for minor in range(OLDEST_SUPPORTED[1], 35))
#: Every release of the V1 runner's ``coordinate_batch_across_dp``, patch
#: releases included: the API drifted within minors' lifetimes (0.11.1 is the
#: first with it; 0.11.x run it with a modelled caller). 0.33.0 is the last:
#: 0.34.0 removed the V1 model runner (``V1_REMOVED``), so from it on a
#: release's row is V2's only.
V1_RELEASES = (
    "0.11.1",
    "0.11.2",
    "0.12.0",
    "0.13.0",
    "0.14.0",
    "0.14.1",
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
)
#: What each runner's report covers when no release is named.
RELEASES_OF = {"v1": V1_RELEASES, "v2": SUPPORTED_RELEASES}


@dataclass(frozen=True)
class TargetRequest:
    vllm: str
    target_file: str | None = None
    #: None: the target's default runner (see ``parse_target``).
    runner: str | None = None


def default_requests(runner: str | None = None) -> list[TargetRequest]:
    """One request per (release, runner) the report covers by default, in
    release order, V1 before V2: only ``runner``'s when one is named."""
    runners = RUNNERS if runner is None else (runner,)
    pairs = {(release, name) for name in runners for release in RELEASES_OF[name]}
    return [
        TargetRequest(release, None, name)
        for release, name in sorted(pairs, key=lambda pair: (_key(pair[0]), pair[1]))
    ]


def requests_for(spec: str, runner: str | None = None) -> list[TargetRequest]:
    """A named release or tree: one request per runner it has (only
    ``runner`` when one is named; a one-line error when it lacks that one).
    Decided from version numbers and file texts, before anything is fetched."""
    if runner is not None:
        parse_target(spec, runner=runner)
        return [TargetRequest(spec, None, runner)]
    found = []
    for name in RUNNERS:
        try:
            parse_target(spec, runner=name)
        except UsageError:
            continue
        found.append(TargetRequest(spec, None, name))
    if not found:
        parse_target(spec)  # neither runner fits: its own refusal says why
    return found


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class VersionRow:
    target: str
    runner: str
    scenario: str
    verdict: str  # "pass", "fail" or "error"
    property: str | None
    message: str | None
    counterexample: str | None


def check_target(
    request: TargetRequest, options: CheckOptions, out: Path
) -> list[VersionRow]:
    """Check every scenario of one target; write each failure's counterexample."""
    try:
        target = load_target(request.vllm, request.target_file, request.runner)
    except Exception as error:  # one bad target must not sink the whole report
        return [_error_row(request, _error_text(error))]
    try:
        report = run_check(target, options)
    except Exception as error:
        # dpsim failing on one target (it cannot drive it, or a bug) is that
        # target's error row, with the reason in one line, never a verdict.
        return [_error_row(request, _error_text(error), target.label)]
    rows = []
    for run in report.runs:
        finding = run.finding
        if finding is None:
            rows.append(
                VersionRow(
                    target.label, target.runner, run.scenario, "pass", None, None, None
                )
            )
            continue
        written = cex.save(
            target,
            finding.case,
            finding.result,
            finding.verdicts,
            options.properties or PROPERTY_NAMES,
            out / _slug(target.label),
        )
        rows.append(
            VersionRow(
                target.label,
                target.runner,
                run.scenario,
                "fail",
                finding.primary.property,
                str(finding.primary),
                str(written),
            )
        )
    return rows


def cross_version(
    requests: Sequence[TargetRequest],
    options: CheckOptions,
    out: Path,
    workers: int | None = None,
) -> list[VersionRow]:
    workers = max(1, min(workers or os.cpu_count() or 1, len(requests)))
    if workers == 1:
        batches = [check_target(request, options, out) for request in requests]
    else:
        batches = _check_in_children(requests, options, out, workers)
    return [row for batch in batches for row in batch]


def _check_in_children(
    requests: Sequence[TargetRequest], options: CheckOptions, out: Path, workers: int
) -> list[list[VersionRow]]:
    """:func:`check_target` of each request in a child, ``workers`` at a time."""
    pending = deque(enumerate(requests))
    running: dict[Connection, tuple[int, BaseProcess]] = {}
    batches: dict[int, list[VersionRow]] = {}
    children: list[BaseProcess] = []
    try:
        while pending or running:
            while pending and len(running) < workers:
                index, request = pending.popleft()
                receiver, sender = processes.SPAWN.Pipe(duplex=False)
                child = processes.start(_send_rows, sender, request, options, out)
                sender.close()
                children.append(child)
                running[receiver] = (index, child)
            ready = wait(list(running))
            for receiver in [receiver for receiver in running if receiver in ready]:
                index, child = running.pop(receiver)
                try:
                    batches[index] = receiver.recv()
                except EOFError:
                    child.join()
                    batches[index] = [
                        _error_row(
                            requests[index],
                            f"its check ended with exit status {child.exitcode}",
                        )
                    ]
                receiver.close()
    finally:
        processes.reap(children, patience=0.0 if running else 5.0)
    return [batches[index] for index in range(len(requests))]


def _send_rows(
    sender: Connection, request: TargetRequest, options: CheckOptions, out: Path
) -> None:
    sender.send(check_target(request, options, out))


def _error_text(error: Exception) -> str:
    """An error row's reason in one line: a refusal's own message (one that
    dpsim cannot drive the target, too), else the exception's type and first
    line; the traceback goes to stderr under --debug."""
    if debugging():
        traceback.print_exception(error)
    if isinstance(error, UsageError):
        return " ".join(str(error).split())
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"


def exit_status(rows: Sequence[VersionRow]) -> int:
    """1 when a property failed on some target, else 2 when some target had no
    verdict (an error row), else 0."""
    verdicts = {row.verdict for row in rows}
    if "fail" in verdicts:
        return 1
    return 2 if verdicts - {"pass"} else 0


def _error_row(
    request: TargetRequest, message: str, label: str | None = None
) -> VersionRow:
    if label is None:
        label = (
            request.vllm
            if request.target_file is None
            else f"{request.target_file} on {request.vllm}"
        )
    return VersionRow(label, request.runner or "-", "-", "error", None, message, None)


def render_markdown(
    rows: Sequence[VersionRow], options: CheckOptions, out: Path
) -> str:
    lines = [
        "# dpsim cross-version report",
        "",
        f"Profile `{options.profile}`, ranks {options.ranks[0]}..{options.ranks[1]}, "
        f"{options.examples} cases per scenario, seed {options.seed}.",
        "",
        "| target | runner | scenario | result | counterexample |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        result = (
            "pass" if row.verdict == "pass" else f"**{row.property or row.verdict}**"
        )
        link = ""
        if row.counterexample:
            relative = os.path.relpath(row.counterexample, out)
            link = f"[{Path(row.counterexample).name}]({relative})"
        elif row.verdict == "error":
            link = (row.message or "").replace("|", "\\|")
        lines.append(
            f"| {row.target} | {row.runner} | {row.scenario} | {result} | {link} |"
        )
    failing = [row for row in rows if row.verdict == "fail"]
    if failing:
        lines += ["", "## Failures", ""]
        lines += [
            f"- {row.target} ({row.runner}), {row.scenario}: {row.message}"
            for row in failing
        ]
    return "\n".join(lines) + "\n"


def render_html(rows: Sequence[VersionRow], out: Path) -> str:
    body = []
    for row in rows:
        cell = (
            "pass"
            if row.verdict == "pass"
            else html.escape(row.property or row.verdict)
        )
        link = ""
        if row.counterexample:
            relative = html.escape(os.path.relpath(row.counterexample, out))
            link = (
                f'<a href="{relative}">{html.escape(Path(row.counterexample).name)}</a>'
            )
        css = "pass" if row.verdict == "pass" else "fail"
        title = html.escape(row.message or "")
        body.append(
            f"<tr><td>{html.escape(row.target)}</td><td>{html.escape(row.runner)}</td>"
            f"<td>{html.escape(row.scenario)}</td>"
            f'<td class="{css}" title="{title}">{cell}</td><td>{link}</td></tr>'
        )
    return (
        "<!doctype html><meta charset=utf-8><title>dpsim cross-version report</title>"
        "<style>body{font:14px sans-serif}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
        ".pass{color:#060}.fail{color:#a00;font-weight:bold}</style>"
        "<h1>dpsim cross-version report</h1><table><tr><th>target</th><th>runner</th>"
        "<th>scenario</th>"
        "<th>result</th><th>counterexample</th></tr>" + "".join(body) + "</table>\n"
    )


def render_terminal(rows: Sequence[VersionRow]) -> str:
    return table(
        ("target", "runner", "scenario", "result"),
        [
            (
                row.target,
                row.runner,
                row.scenario,
                {"fail": f"FAIL {row.message}", "error": f"error: {row.message}"}.get(
                    row.verdict, row.verdict
                ),
            )
            for row in rows
        ],
    )


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in label)
