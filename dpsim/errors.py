"""Errors that reach a user as one line and exit status 2.

Anything a user can get wrong (a spec, a file, a flag) raises a subclass of
:class:`UsageError`; the CLI prints its message alone, with no traceback, and
leaves nothing half-written behind (``--debug`` prints the traceback too).
"""

from __future__ import annotations

import os


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class TargetError(UsageError):
    """A target could not be found, fetched, loaded or adapted."""


class BoundaryError(TargetError):
    """dpsim's own side of its boundary with the target did not fit: a call
    the release no longer takes, an attribute a stand-in lacks, a module that
    moved (:mod:`dpsim.boundary`). Never a verdict on the target."""


#: Set (to anything but "" or "0") by ``--debug``: an error's traceback is
#: printed beside its one line. An environment variable, so child processes
#: started by spawning (versions, fuzz, mutate) see it too.
DEBUG_ENV = "DPSIM_DEBUG"


def debugging() -> bool:
    """Whether ``--debug`` (or ``DPSIM_DEBUG``) asks for tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")
