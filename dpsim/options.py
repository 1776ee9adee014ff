"""Options every command and the pytest suite spell the same way.

Torch-free and free of the CLI, so the suite's configuration (imported in
every pytest session) and each command parse a ``--ranks`` alike, against
the bound in :mod:`dpsim.limits`, with the same refusal.
"""

from __future__ import annotations

from dpsim.errors import UsageError
from dpsim.limits import MAX_RANKS


def parse_ranks(text: str) -> tuple[int, int]:
    """``N`` or ``LO..HI`` as ``(low, high)``; a one-line UsageError otherwise."""
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
        else:
            low = high = int(text)
    except ValueError:
        raise UsageError(
            f"--ranks {text!r}: expected N or LO..HI, e.g. 2..16"
        ) from None
    if not 1 <= low <= high:
        raise UsageError(f"--ranks {text!r}: need 1 <= LO <= HI")
    if high > MAX_RANKS:
        raise UsageError(f"--ranks {text!r}: at most {MAX_RANKS:,} ranks")
    return low, high
