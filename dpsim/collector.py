"""Keep the collector's full collections off the heap a search starts with.

A check's process holds a large heap before its first case: torch, the
release's vLLM modules loaded through the shim, Hypothesis, dpsim. Every case
allocates enough that some of its objects (a new policy's capture tables
above all: thousands of lists each) reach the collector's oldest generation,
so every few dozen cases a full collection walks that whole heap again:
about 0.1 s each, a quarter of a 400-case fast check's CPU at 8 ranks.

:func:`frozen_heap` moves what is alive when a search starts into the
collector's permanent generation (:func:`gc.freeze`), which collections do
not walk, and back into the oldest generation when the search ends
(:func:`gc.unfreeze`), so nothing is kept longer than the search: an object
of that heap that becomes cyclic garbage meanwhile is reclaimed after it.
Objects made during the search are collected as before. No result depends
on when the collector runs: it frees only what nothing can reach.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The heap alive now, left out of collections for the block.

    A heap someone else froze (the runner lane's ``heap.settle``, an outer
    block) is left as it is: unfreezing it here would undo theirs.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
