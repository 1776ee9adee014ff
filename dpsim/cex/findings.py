"""A check's failures written as counterexample files, one per scenario.

Below the commands, so ``dpsim check`` and ``dpsim policy validate`` write
the same files by the same code.
"""

from __future__ import annotations

from pathlib import Path

from dpsim.cex.files import save
from dpsim.cex.regression import write_regression_test
from dpsim.check import CheckReport
from dpsim.properties import PROPERTY_NAMES


def write_counterexamples(report: CheckReport, out: Path) -> dict[str, Path]:
    """Each failing scenario's counterexample under ``out``: scenario -> file.

    Beside each, a pytest file that fails while the bug is there
    (:mod:`dpsim.cex.regression`).
    """
    written = {}
    for failed in report.failures:
        finding = failed.finding
        assert finding is not None
        path = save(
            report.target,
            finding.case,
            finding.result,
            finding.verdicts,
            report.options.properties or PROPERTY_NAMES,
            out,
        )
        write_regression_test(path)
        written[failed.scenario] = path
    return written
