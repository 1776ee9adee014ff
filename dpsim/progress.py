"""A long command's progress on stderr, kept out of its report on stdout.

On a terminal one status line is redrawn at most five times a second and
wiped at the end; elsewhere (``2>&1 | tee``, CI logs) a line is written every
30 seconds, so a long run still shows it is alive without flooding the log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

_WIDTH = 100


class StatusLine:
    """Shows the latest of the lines it is given, throttled as above."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.every = 0.2 if self.tty else 30.0
        self.last = 0.0 if self.tty else time.monotonic()
        self.drawn = False

    def show(self, line: str | Callable[[], str]) -> None:
        """Draw ``line`` if one is due; a callable is asked only then, so a
        caller whose line costs something to make may call this often."""
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        if callable(line):
            line = line()
        if self.tty:
            sys.stderr.write("\r" + line[:_WIDTH].ljust(_WIDTH))
            self.drawn = True
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def announce(self, text: str) -> None:
        """A line that stays (an event, not progress), written at once."""
        self.close()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * _WIDTH + "\r")
            sys.stderr.flush()
            self.drawn = False
