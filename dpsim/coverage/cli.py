"""``--coverage`` on the commands that run cases: the flag and what it prints and writes.

Light to import (the CLI registers the flag on every start); coverage.py is
imported only when the flag is given.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .measuring import Measurement
    from .result import CoverageResult

#: The figure ``--help`` quotes; :mod:`dpsim.coverage.measuring` says how it was measured.
COST = (
    "about 1.4x a check's CPU time on a V2 target and 2x on V1 "
    "(+3.5 and +11 ms per case on 0.33.0)"
)

HELP = (
    "target coverage: which lines and branches of the target's own code "
    "(dp_utils.py, the manager's or dispatcher's dispatch, the V1 caller "
    "method) the cases ran, per scenario and profile, with those never run "
    "listed as file:line and line->line, in the report, in --json under "
    '"coverage", and as HTML in OUT/coverage/; line and branch coverage, '
    f"not the `coverage` property; costs {COST}"
)


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coverage", action="store_true", help=HELP)


def sync_measurement(arguments: argparse.Namespace, target: Any) -> Measurement | None:
    """The measurement of a sync-lane check's target; None without ``--coverage``."""
    if not getattr(arguments, "coverage", False):
        return None
    from .measuring import measure
    from .targets import scopes_for

    return measure(scopes_for(target))


def html_directory(out: Path) -> Path:
    return out / "coverage"


def finish(result: CoverageResult, out: Path, title: str) -> tuple[str, dict[str, Any]]:
    """Write the HTML view under ``out``; the report's text section and the
    ``--json`` object."""
    from .html import write_html
    from .render import render_text

    index = write_html(result, html_directory(out), f"target coverage · {title}")
    data = result.to_json()
    data["html"] = str(index)
    return render_text(result, str(index)), data
