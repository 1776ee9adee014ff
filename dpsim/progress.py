"""A long command's progress on stderr, kept out of its report on stdout.

On a terminal one status line is redrawn at most five times a second and
wiped at the end; elsewhere (``2>&1 | tee``, CI logs) a line is written every
30 seconds, so a long run still shows it is alive without flooding the log.
"""

from __future__ import annotations

import sys
import time

_WIDTH = 100


class StatusLine:
    """Shows the latest of the lines it is given, throttled as above."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.every = 0.2 if self.tty else 30.0
        self.last = 0.0 if self.tty else time.monotonic()
        self.drawn = False

    def show(self, line: str) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        if self.tty:
            sys.stderr.write("\r" + line[:_WIDTH].ljust(_WIDTH))
            self.drawn = True
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r" + " " * _WIDTH + "\r")
            sys.stderr.flush()
