"""Faulty targets: known DP-sync bugs planted one at a time in a correct twin.

Why: a property suite is only worth running if it catches the bugs vLLM has
actually shipped. Each :class:`FaultyTarget` is a small, realistic diff
against a correct dp_utils written for dpsim from the documented contract
(``reference_v29.py`` for the 0.29.0 API, ``reference_v33.py`` for 0.33.0,
``reference_v1_v33.py`` for the V1 runner's sync of 0.33.0), modelled on an
upstream fix and naming the property that must catch it. Each entry names
the runner whose sync it replaces (``dpsim check --runner``).

Two kinds of entry: ``issue`` entries replay a bug class from the public
record and may trip several properties; ``witness`` entries are built so that
exactly one property fails, proving that property pulls its weight alone.
"""

from __future__ import annotations

from dpsim.corpus.entries import CORPUS
from dpsim.corpus.model import (
    BUG_CLASSES,
    KINDS,
    REFERENCES,
    CorpusError,
    FaultyTarget,
    apply_edits,
    materialize,
    reference_path,
    source,
)

NAMES = tuple(item.name for item in CORPUS)


def entry(name: str) -> FaultyTarget:
    """The corpus entry called ``name``."""
    for candidate in CORPUS:
        if candidate.name == name:
            return candidate
    raise CorpusError(f"unknown faulty target {name!r}; known: {', '.join(NAMES)}")


__all__ = [
    "BUG_CLASSES",
    "CORPUS",
    "KINDS",
    "NAMES",
    "REFERENCES",
    "CorpusError",
    "FaultyTarget",
    "apply_edits",
    "entry",
    "materialize",
    "reference_path",
    "source",
]
