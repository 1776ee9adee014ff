"""A new data object's ConjectureData state, set without ConjectureData.__init__.

``ConjectureData.__init__`` sets some sixty attributes one at a time, makes a
provider, an observer and a span record, and reads the clocks: about an
eighth of what drawing a case costs the fast engine, which makes one data
object per case. Nearly all of it is the same for every object: constants,
and containers that start empty. :func:`fill` sets the same attributes from
one dict of the constants (taken from a data object ``__init__`` built) and
makes the rest as ``__init__`` makes them: new empty containers, a new
provider, span record and observer, the object's test counter and clock
readings.

:data:`READY` says whether that layout is the installed Hypothesis' own: it
is checked once, against an object ``__init__`` built (the same attributes,
every other one a constant); where it is not, data objects are built by
``__init__`` (:class:`dpsim.search.draw.FastData`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from enum import Enum
from random import Random
from typing import Any

from dpsim.search.internals import (
    CHECKED_ON,
    DATA_THREADLOCAL,
    ConjectureData,
    DataObserver,
    HypothesisProvider,
    PredicateCounts,
    SpanRecord,
    gc_cumulative_time,
)


def fill(data: ConjectureData, random: Random) -> None:
    """Give ``data`` (not yet initialised) the state ``ConjectureData(random=random)``
    gives a new FastData."""
    # A copy of a dict that already holds every attribute: filling an empty
    # one grew it several times over.
    state = _CONSTANTS.copy()
    state["_random"] = random
    state["testcounter"] = DATA_THREADLOCAL.global_test_counter
    DATA_THREADLOCAL.global_test_counter += 1
    state["start_time"] = time.perf_counter()
    state["gc_start_time"] = gc_cumulative_time()
    state["observer"] = DataObserver()
    state["notes"] = []
    state["events"] = {}
    state["draw_times"] = {}
    state["_stateful_run_times"] = defaultdict(float)
    state["target_observations"] = {}
    state["tags"] = set()
    state["labels_for_structure_stack"] = []
    state["_ConjectureData__span_record"] = SpanRecord()
    state["arg_spans"] = set()
    state["span_comments"] = {}
    state["_observability_args"] = {}
    state["_observability_predicates"] = defaultdict(PredicateCounts)
    state["_shared_strategy_draws"] = {}
    state["_nodes"] = []
    data.__dict__ = state
    state["provider"] = HypothesisProvider(data)


#: The attributes :func:`fill` makes per object; every other one is a constant.
MADE = frozenset(
    (
        "_random",
        "testcounter",
        "start_time",
        "gc_start_time",
        "observer",
        "notes",
        "events",
        "draw_times",
        "_stateful_run_times",
        "target_observations",
        "tags",
        "labels_for_structure_stack",
        "_ConjectureData__span_record",
        "arg_spans",
        "span_comments",
        "_observability_args",
        "_observability_predicates",
        "_shared_strategy_draws",
        "_nodes",
        "provider",
    )
)


#: The attributes FastData sets itself, after :func:`fill`.
FASTDATA_OWN = frozenset(("drawn", "replay", "first_part", "lean"))


def _constant(value: Any) -> bool:
    """Whether ``value`` can be shared by every data object: nothing can
    change it (None, numbers, strings, enum members, empty tuples, and
    Hypothesis' ``not_set`` marker, compared by identity only)."""
    if value is None or isinstance(value, (bool, int, float, str, Enum)):
        return True
    return value == () or type(value).__name__ == "UniqueIdentifier"


def _constants() -> dict[str, Any] | None:
    """The constant attributes of a new data object, as ``__init__`` sets
    them; None when its attributes are not :data:`MADE` plus constants, or
    a made one is not of the type :func:`fill` makes."""
    import hypothesis

    if hypothesis.__version__ not in CHECKED_ON:
        return None  # pragma: no cover - another Hypothesis
    built = ConjectureData(random=Random(0)).__dict__
    if not built.keys() >= MADE:
        return None  # pragma: no cover - another Hypothesis
    constants = {name: value for name, value in built.items() if name not in MADE}
    if not all(_constant(value) for value in constants.values()):
        return None  # pragma: no cover - another Hypothesis
    # __init__ starts the top-level span, which to a FastData is a depth of
    # 0 (its start_span counts depth and nothing else).
    constants["depth"] = 0
    # Room for what fill makes and FastData adds, set over these.
    constants.update(dict.fromkeys(MADE | FASTDATA_OWN))
    return constants


_CONSTANTS = _constants() or {}
#: Whether :func:`fill` sets what ``ConjectureData.__init__`` sets.
READY = bool(_CONSTANTS)
