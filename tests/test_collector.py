"""A search's starting heap is out of the collector's way, and only for the search."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from dpsim.collector import frozen_heap


class _Node:
    """A cycle's member: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


def _cycle() -> weakref.ref[_Node]:
    return weakref.ref(_Node())


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    # A heap frozen earlier in this process (a runner-lane test's
    # heap.settle) would hide what these tests look at; none is left behind.
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_garbage_from_before_the_block_waits_for_its_end() -> None:
    before = _cycle()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert before() is not None  # frozen: no collection walks it
        during = _cycle()
        gc.collect()
        assert during() is None  # made in the block: collected as ever
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert before() is None  # thawed: nothing outlives the block


def test_an_error_in_the_block_still_thaws_the_heap() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError
    assert gc.get_freeze_count() == 0


def test_a_heap_someone_else_froze_stays_frozen() -> None:
    theirs = _cycle()
    gc.freeze()
    with frozen_heap():
        pass
    assert gc.get_freeze_count() > 0
    gc.collect()
    assert theirs() is not None


@pytest.mark.release
def test_a_check_searches_inside_the_frozen_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dpsim.check as check
    from dpsim.check import CheckOptions, run_check
    from dpsim.targets import load_target

    seen: list[int] = []
    real = check.run_case

    def run_case(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(check, "run_case", run_case)
    run_check(load_target("0.29.0"), CheckOptions(scenarios=("step",), examples=3))
    assert seen and all(seen)
    assert gc.get_freeze_count() == 0


def test_a_fuzz_round_searches_inside_the_frozen_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queue import Queue
    from threading import Event
    from types import SimpleNamespace

    import dpsim.suite.build as build
    from dpsim.fuzz import worker

    seen: list[int] = []
    monkeypatch.setattr(
        build,
        "check_drawn_case",
        lambda *args, **kwargs: seen.append(gc.get_freeze_count()),
    )
    plan = SimpleNamespace(
        batch=3,
        index=0,
        suite=SimpleNamespace(database_key=lambda scenario: b"collector-test"),
    )
    queue: Queue[object] = Queue()
    suite = SimpleNamespace(lane="sync")
    outcome = worker._round(plan, suite, None, "step", queue, Event())  # type: ignore[arg-type]
    assert outcome is None
    assert seen and all(seen)
    assert gc.get_freeze_count() == 0


def test_the_plugins_child_runs_a_suite_test_inside_the_frozen_heap(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    import dpsim.pytest_plugin as plugin

    seen: list[int] = []
    monkeypatch.setattr(plugin, "_current", lambda: SimpleNamespace(coverage=False))
    code = plugin._run_suite_test(
        lambda: seen.append(gc.get_freeze_count()),
        SimpleNamespace(),  # type: ignore[arg-type]
    )
    assert code == 0
    assert seen and all(seen)
    assert gc.get_freeze_count() == 0
