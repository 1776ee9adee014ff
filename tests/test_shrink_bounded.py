"""The shrink is bounded by work, not by the clock: on a machine slow enough that
every call seems to take ten minutes, it still ends on the same minimal case."""

from __future__ import annotations

import itertools
import math
import time
from random import Random
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine
from hypothesis.reporting import report, with_reporter

from dpsim.search.bounded import bounded_shrinking

SETTINGS = settings(
    max_examples=200,
    database=None,
    deadline=None,
    phases=(Phase.generate, Phase.shrink),
    suppress_health_check=list(HealthCheck),
)


def _smallest_big_list() -> list[int]:
    """A failure that takes many shrink steps: the list's sum reaching 500."""
    return find(
        st.lists(st.integers(0, 1000), min_size=3),
        lambda xs: sum(xs) >= 500,
        settings=SETTINGS,
        random=Random(0),
    )


@pytest.fixture
def slow_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis' engine reads a clock that moves ten minutes per reading."""
    ticks = itertools.count(step=600.0)

    def clock() -> float:
        return float(next(ticks))

    slow = SimpleNamespace(**vars(time))
    slow.perf_counter = slow.monotonic = clock
    monkeypatch.setattr(engine, "time", slow)


def test_a_slow_machine_shrinks_to_the_same_case_inside_the_block(
    slow_clock: None,
) -> None:
    with bounded_shrinking():
        shrunk = _smallest_big_list()
    assert shrunk == [0, 0, 500]


def test_without_the_block_the_clock_cuts_the_shrink_short(
    slow_clock: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # The control: Hypothesis' own limit is by wall-clock time.
    told: list[object] = []
    with with_reporter(told.append):
        shrunk = _smallest_big_list()
    assert shrunk != [0, 0, 500] and sum(shrunk) >= 500
    assert any("five minutes" in str(message) for message in told)


def test_the_real_clock_shrinks_to_the_same_case() -> None:
    with bounded_shrinking():
        assert _smallest_big_list() == [0, 0, 500]


def test_hypothesis_reports_go_to_stderr_and_the_limit_comes_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def limit() -> float:
        return float(engine.MAX_SHRINKING_SECONDS)

    before = limit()
    with bounded_shrinking():
        with bounded_shrinking():
            assert limit() == math.inf
        assert limit() == math.inf  # the outer block holds
        report("a message from Hypothesis")
    assert limit() == before
    out, err = capsys.readouterr()
    assert out == "" and "a message from Hypothesis" in err
