"""Counterexample files: everything needed to rerun a case exactly, as JSON.

See :mod:`dpsim.cex.files` for the format, :mod:`dpsim.cex.validate` for how a
file from a stranger is checked before anything is built from it, and
:mod:`dpsim.cex.regression` for the pytest file written beside each one.
"""

from dpsim.cex import files
from dpsim.cex.files import SCHEMA_VERSION, Counterexample, read, save, write
from dpsim.cex.regression import write_regression_test

__all__ = [
    "SCHEMA_VERSION",
    "Counterexample",
    "files",
    "read",
    "save",
    "write",
    "write_regression_test",
]
