"""A FastData's ConjectureData state, set without ConjectureData.__init__
(dpsim.search.blank), is what __init__ sets: the same attributes, of the same
types and values, and nothing that can change shared between two objects."""

from __future__ import annotations

from random import Random
from typing import Any

from dpsim.search import blank
from dpsim.search.draw import FastData
from dpsim.search.internals import ConjectureData

#: Set per object by __init__ too: a counter and clock readings.
PER_OBJECT = {"testcounter", "start_time", "gc_start_time"}


class Initialised(FastData):
    """A FastData whose ConjectureData state __init__ set."""

    def __init__(self, random: Random) -> None:
        ConjectureData.__init__(self, random=random)


def state(data: ConjectureData) -> dict[str, Any]:
    ours = {"drawn", "replay", "first_part", "lean"}
    return {name: value for name, value in vars(data).items() if name not in ours}


def test_the_layout_is_this_hypothesis_own() -> None:
    assert blank.READY


def test_a_filled_object_has_what_init_gives_it() -> None:
    random = Random(0)
    filled, built = state(FastData(random)), state(Initialised(random))
    assert filled.keys() == built.keys()
    for name, value in built.items():
        assert type(filled[name]) is type(value), name
        if name in PER_OBJECT or name in {"provider", "observer"}:
            continue
        if name == "_ConjectureData__span_record":
            assert vars(filled[name]).keys() == vars(value).keys()
            continue
        assert filled[name] == value, name
    assert filled["testcounter"] > built["testcounter"] - 2
    assert filled["_random"] is random


def test_nothing_that_can_change_is_shared_between_two_objects() -> None:
    first, second = FastData(Random(0)), FastData(Random(0))
    for name, value in state(first).items():
        if blank._constant(value):
            continue
        if name == "_random":
            continue
        assert value is not state(second)[name], name
    assert first.provider._cd is first
    assert getattr(first.provider, "_random", None) is first._random
    assert first.testcounter != second.testcounter


def test_every_attribute_made_per_object_is_not_a_constant() -> None:
    # The other way round: what fill shares is constant in every object.
    data = FastData(Random(0))
    for name, value in state(data).items():
        assert (name in blank.MADE) or blank._constant(value), name
