"""A shrink bounded by work, not by the clock, and Hypothesis' messages off stdout.

Hypothesis stops shrinking a failure after ``MAX_SHRINKING_SECONDS`` (300 s
in 6.170) of wall-clock time and prints a warning. A long shrink's result
then depends on how fast the machine was that minute, which breaks dpsim's
rule that the same case and seed give the same result, byte for byte, and the
warning lands on stdout ahead of ``--json``'s one line.

Inside :func:`bounded_shrinking` the time limit is lifted, so a shrink ends
only by work, which Hypothesis counts in test calls: after ``MAX_SHRINKS``
(500) improvements, when the shrinker stalls (a run of calls without one),
or at its fixpoint. Hypothesis documents these engine constants as
monkeypatchable; the limit is read when a shrink starts, so the block must
enclose the whole search. Whatever Hypothesis reports inside the block goes
to stderr.

Checked on the Hypothesis versions in :data:`dpsim.search.internals.CHECKED_ON`.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis.internal.conjecture import engine
from hypothesis.reporting import with_reporter

from dpsim.errors import UsageError

#: The engine constant holding the wall-clock limit.
_LIMIT = "MAX_SHRINKING_SECONDS"

_lock = threading.Lock()
#: Open blocks; the limit comes back when the last one closes.
_depth = 0
_saved: list[float] = []


def _to_stderr(message: object) -> None:
    print(message, file=sys.stderr)


@contextmanager
def bounded_shrinking() -> Iterator[None]:
    """Within the block, Hypothesis shrinks without a time limit and reports
    to stderr. Nests; the limit is restored when the outermost block ends."""
    global _depth
    with _lock:
        if _depth == 0:
            if not hasattr(engine, _LIMIT):
                raise UsageError(
                    f"Hypothesis {_version()} has no {_LIMIT}: dpsim cannot bound "
                    "its shrink by work (checked on 6.170.17 and 6.170.27)"
                )
            _saved[:] = [getattr(engine, _LIMIT)]
            setattr(engine, _LIMIT, math.inf)
        _depth += 1
    try:
        with with_reporter(_to_stderr):
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                setattr(engine, _LIMIT, _saved.pop())


def _version() -> str:
    import hypothesis

    return hypothesis.__version__
