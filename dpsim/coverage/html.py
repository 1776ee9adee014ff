"""Target coverage as HTML: an index and one page per file, self-contained.

Each file page shows the source of the scoped functions with every statement
marked run, never run or unreachable (with the reason), and every branch line
whose ways out were not all taken annotated with the ones missing. No
scripts, no external styles or fonts: the pages open from a CI artifact.
"""

from __future__ import annotations

import html
from pathlib import Path

from dpsim.errors import UsageError

from .render import HEADING, arc_text
from .result import CoverageResult, FileCoverage

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
td, th { padding: 0.15em 0.6em; text-align: left; }
pre { margin: 0; }
.src td { font-family: monospace; white-space: pre; padding: 0 0.6em; }
.num { color: #888; text-align: right; }
.run { background: #ddffdd; }
.miss { background: #ffdddd; }
.part { background: #ffffcc; }
.unreach { background: #e4e4ff; }
.note { color: #a00; font-family: sans-serif; }
"""


def page_name(file: FileCoverage) -> str:
    return file.display.replace("/", "_") + ".html"


def write_html(result: CoverageResult, directory: Path, title: str) -> Path:
    """Write ``index.html`` and one page per file into ``directory``; the index."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for file in result.files:
            (directory / page_name(file)).write_text(
                _file_page(file, title), encoding="utf-8"
            )
        index = directory / "index.html"
        index.write_text(_index(result, title), encoding="utf-8")
    except OSError as error:
        raise UsageError(
            f"cannot write the coverage pages in {directory}: {error.strerror}"
        ) from error
    return index


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _row(file: FileCoverage, link: bool) -> str:
    name = html.escape(file.display)
    if link:
        name = f"<a href='{html.escape(page_name(file))}'>{name}</a>"
    return (
        f"<tr><td>{name}</td><td>{len(file.executed_lines)}/{len(file.executable_lines)}</td>"
        f"<td>{len(file.executed_branches)}/{len(file.branches)}</td>"
        f"<td>{len(file.missing_lines)}</td><td>{len(file.missing_branches)}</td>"
        f"<td>{len(file.unreachable_lines) + len(file.unreachable_branches)}</td></tr>"
    )


_HEAD = (
    "<tr><th>file</th><th>lines run</th><th>branches taken</th>"
    "<th>lines never run</th><th>branches never taken</th><th>marked unreachable</th></tr>"
)


def _index(result: CoverageResult, title: str) -> str:
    parts = [
        f"<h1>{html.escape(title)}</h1><p>{html.escape(HEADING)}.</p>",
        f"<table>{_HEAD}{''.join(_row(file, True) for file in result.files)}</table>",
    ]
    if len(result.profiles) > 1:
        # A mark may hold for one profile only: each profile's own totals.
        for profile in result.profiles:
            rows = "".join(_row(file, False) for file in result.profile(profile))
            parts.append(f"<h2>profile {html.escape(profile)}</h2>")
            parts.append(f"<table>{_HEAD}{rows}</table>")
    for scenario, profile in result.context_keys:
        parts.append(
            f"<h2>scenario {html.escape(scenario)}, profile {html.escape(profile)}</h2>"
        )
        rows = "".join(_row(file, False) for file in result.context(scenario, profile))
        parts.append(f"<table>{_HEAD}{rows}</table>")
    return _page(title, "".join(parts))


def _file_page(file: FileCoverage, title: str) -> str:
    analysis = file.analysis
    missing_from: dict[int, list[str]] = {}
    for arc in sorted(file.missing_branches):
        missing_from.setdefault(arc[0], []).append(arc_text(arc))
    rows = []
    for function in analysis.functions:
        rows.append(
            f"<tr><td class='num'></td><td><b>{html.escape(function.name)}</b></td><td></td></tr>"
        )
        for line in range(function.def_line, function.last + 1):
            css, note = _mark(file, line, missing_from)
            rows.append(
                f"<tr class='{css}'><td class='num'>{line}</td>"
                f"<td>{html.escape(analysis.source[line - 1])}</td>"
                f"<td class='note'>{html.escape(note)}</td></tr>"
            )
    body = (
        f"<h1>{html.escape(file.display)}</h1><p>{html.escape(title)} · "
        f"<a href='index.html'>index</a></p>"
        f"<table>{_HEAD}{_row(file, False)}</table><br>"
        f"<table class='src'>{''.join(rows)}</table>"
    )
    return _page(f"{file.display} · {title}", body)


def _mark(
    file: FileCoverage, line: int, missing_from: dict[int, list[str]]
) -> tuple[str, str]:
    if line in file.unreachable_lines:
        return "unreach", f"unreachable: {file.unreachable_lines[line]}"
    if line not in file.executable_lines:
        return "", ""
    if line not in file.executed_lines:
        return "miss", "never run"
    reasons = [
        f"{arc_text(arc)} unreachable: {reason}"
        for arc, reason in sorted(file.unreachable_branches.items())
        if arc[0] == line
    ]
    if line in missing_from:
        return "part", "; ".join(
            ["never taken: " + ", ".join(missing_from[line]), *reasons]
        )
    if reasons:
        return "run", "; ".join(reasons)
    return "run", ""
