"""Errors that reach a user as one line and exit status 2.

Anything a user can get wrong (a spec, a file, a flag) raises a subclass of
:class:`UsageError`; the CLI prints its message alone, with no traceback, and
leaves nothing half-written behind.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class TargetError(UsageError):
    """A target could not be found, fetched, loaded or adapted."""
