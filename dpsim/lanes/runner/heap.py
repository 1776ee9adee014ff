"""The collector and the runner lane's long-lived heap.

A runner-lane process holds a large heap that lives as long as it does:
torch, the release's vLLM modules loaded through the shim, the rebuilt
classes, Hypothesis. Each case allocates enough that objects of the running
case reach the collector's oldest generation, so every few dozen cases a full
collection walks that whole heap again (about 0.2 s on 0.33.0: a tenth of a
campaign's time, measured over 100 cases of ``bench --measure runner``).

:func:`settle` runs once per process, after the first case has loaded and
rebuilt what the release needs: it collects, then moves everything still
alive into the collector's permanent generation (:func:`gc.freeze`), which
later collections do not walk. Objects created afterwards (every later case)
are collected as before; only an object alive at that moment that later
becomes part of a reference cycle is never reclaimed (its memory is the
price; none of the lane's results depend on when the collector runs).
"""

from __future__ import annotations

import gc

_settled = False


def settle() -> None:
    """Freeze the heap the process holds now, the first time only."""
    global _settled
    if _settled:
        return
    _settled = True
    gc.collect()
    gc.freeze()
