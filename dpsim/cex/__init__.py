"""Counterexample files: everything needed to rerun a case exactly, as JSON.

See :mod:`dpsim.cex.files` for the format.
"""

from dpsim.cex.files import SCHEMA_VERSION, Counterexample, read, write

__all__ = ["SCHEMA_VERSION", "Counterexample", "read", "write"]
