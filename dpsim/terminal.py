"""Text from outside dpsim, made safe to show on a terminal.

Counterexample files, target exception messages and file names are not
dpsim's own text: a ``\\x1b[`` sequence, a ``\\r`` or a newline in one could
recolour, overwrite or forge lines of a report. Everything that shows such
text passes it through :func:`printable` first.
"""

from __future__ import annotations


def printable(text: object) -> str:
    """``str(text)`` with every non-printable character (controls, line and
    paragraph separators, bidi overrides) written as a Python escape, e.g.
    ``\\x1b``, ``\\n``, ``\\u202e``; plain text comes back unchanged."""
    shown = str(text)
    if shown.isprintable():
        return shown
    return "".join(
        char
        if char.isprintable()
        else char.encode("unicode_escape", "backslashreplace").decode("ascii")
        for char in shown
    )
