"""heap.settle: the process's heap is frozen once, later objects are collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dpsim.lanes.runner import heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector reclaims it


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(heap, "_settled", False)
    gc.unfreeze()
    yield
    gc.unfreeze()  # leave the test process as other tests expect it


def test_settle_freezes_what_is_alive_once(fresh: None) -> None:
    early = _Node()
    heap.settle()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    ref = weakref.ref(early)
    del early
    gc.collect()
    assert ref() is not None  # alive at the freeze: not walked again
    heap.settle()  # the second call does nothing
    assert gc.get_freeze_count() == frozen


def test_objects_made_after_settling_are_still_collected(fresh: None) -> None:
    heap.settle()
    late = _Node()
    ref = weakref.ref(late)
    del late
    gc.collect()
    assert ref() is None
