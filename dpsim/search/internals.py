"""The one place dpsim reaches into Hypothesis' internals, and the check that they are there.

The fast engine (:mod:`dpsim.search.fast`) draws cases through Hypothesis' own
strategies and its own provider (so values keep Hypothesis' distribution and
edge bias) but without its engine, and hands a failing case's choice sequence
back to Hypothesis' engine to shrink, with one shrink pass of dpsim's added
to its shrinker. No public API does any of these: ``find()`` always runs the
engine's per-choice bookkeeping, a seeded ``find()`` turns the example
database off, so it cannot be told to start shrinking from a given choice
sequence, and the shrinker's passes are its own. Every internal name used is imported here, so a
Hypothesis that moved one fails at import with one line (exit status 2)
rather than drawing different cases or shrinking wrongly.

Checked on the Hypothesis versions in :data:`CHECKED_ON` (the set-up installs the last).
"""

from __future__ import annotations

import hypothesis

from dpsim.errors import UsageError

#: Versions the fast engine was checked on, by drawing the same cases as
#: Hypothesis' engine from the same choice sequences (tests/test_search_*.py).
CHECKED_ON = ("6.170.17", "6.170.27")

try:
    from hypothesis.control import BuildContext
    from hypothesis.database import choices_from_bytes, choices_to_bytes
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.choice import (
        choice_constraints_key,
        choice_from_index,
        choice_permitted,
        choice_size,
    )
    from hypothesis.internal.conjecture.data import (
        MAX_DEPTH,
        ConjectureData,
        DataObserver,
        SpanRecord,
        Status,
    )
    from hypothesis.internal.conjecture.data import threadlocal as DATA_THREADLOCAL
    from hypothesis.internal.conjecture.engine import (
        BUFFER_SIZE,
        ConjectureRunner,
        RunIsComplete,
    )
    from hypothesis.internal.conjecture.junkdrawer import gc_cumulative_time
    from hypothesis.internal.conjecture.providers import (
        CONSTANTS_CACHE,
        GLOBAL_CONSTANTS,
        INTEGERS_DISTRIBUTION,
        HypothesisProvider,
    )
    from hypothesis.internal.conjecture.shrinker import Shrinker, ShrinkPass
    from hypothesis.internal.conjecture.shrinking.choicetree import Chooser
    from hypothesis.internal.conjecture.utils import Sampler
    from hypothesis.internal.escalation import InterestingOrigin
    from hypothesis.internal.observability import PredicateCounts
    from hypothesis.internal.statistics import (
        PiecewiseDistribution,
        UniformDistribution,
    )
    from hypothesis.strategies._internal.lazy import unwrap_strategies

    # The type of the provider's constant pools (Hypothesis' own dependency),
    # which are sorted by value.
    from sortedcontainers import SortedSet
except ImportError as error:  # pragma: no cover - depends on the installed version
    raise UsageError(
        f"--engine fast needs Hypothesis internals that Hypothesis "
        f"{hypothesis.__version__} lacks ({error}); it was checked on "
        f"{', '.join(CHECKED_ON)}: use --engine hypothesis"
    ) from None

__all__ = [
    "BUFFER_SIZE",
    "CHECKED_ON",
    "CONSTANTS_CACHE",
    "DATA_THREADLOCAL",
    "GLOBAL_CONSTANTS",
    "INTEGERS_DISTRIBUTION",
    "MAX_DEPTH",
    "BuildContext",
    "Chooser",
    "ConjectureData",
    "ConjectureRunner",
    "DataObserver",
    "HypothesisProvider",
    "InterestingOrigin",
    "PiecewiseDistribution",
    "PredicateCounts",
    "RunIsComplete",
    "Sampler",
    "ShrinkPass",
    "Shrinker",
    "SortedSet",
    "SpanRecord",
    "Status",
    "StopTest",
    "UniformDistribution",
    "choice_constraints_key",
    "choice_from_index",
    "choice_permitted",
    "choice_size",
    "choices_from_bytes",
    "choices_to_bytes",
    "gc_cumulative_time",
    "unwrap_strategies",
]
