"""where: which frames are vLLM's, and which of its lines ran."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import greenlet

from dpsim.lanes.runner import where
from dpsim.lanes.runner.where import LineCoverage, vllm_location, vllm_stack

# Hand-written (not vLLM's text).
SOURCE = """\
def outer(callback):
    return inner(callback)


def inner(callback):
    return callback()


def branchy(flag):
    if flag:
        total = sum(x for x in range(3))
    else:
        total = -1
    return total
"""


def _load(tmp_path: Path, *, register: bool = True) -> dict[str, Any]:
    path = tmp_path / "vllm" / "v1" / "engine" / "fake_core.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SOURCE)
    if register:
        where.register_file(path)
    namespace: dict[str, Any] = {}
    exec(compile(SOURCE, str(path), "exec"), namespace)
    return namespace


def _here() -> FrameType:
    return sys._getframe(1)


def test_the_innermost_vllm_frame_and_the_stack(tmp_path: Path) -> None:
    code = _load(tmp_path)
    frame = code["outer"](_here)
    assert vllm_location(frame) == "v1/engine/fake_core.py:6 in inner"
    assert vllm_stack(frame) == (
        "v1/engine/fake_core.py:6 in inner",
        "v1/engine/fake_core.py:2 in outer",
    )


def test_an_unregistered_file_is_not_vllm_even_under_a_vllm_folder(
    tmp_path: Path,
) -> None:
    code = _load(tmp_path / "elsewhere", register=False)
    frame = code["outer"](_here)
    assert vllm_location(frame) is None
    assert vllm_stack(frame) == ()


def test_display_names() -> None:
    assert where.display_name(Path("/c/vllm-0.33.0/vllm/v1/outputs.py")) == (
        "v1/outputs.py"
    )
    assert where.display_name(Path("/tmp/dp_utils.py")) == "dp_utils.py"


def test_line_coverage_counts_executed_and_executable_lines(tmp_path: Path) -> None:
    code = _load(tmp_path)
    with LineCoverage([code["branchy"].__code__, code["inner"].__code__]) as coverage:
        code["branchy"](True)
    code["branchy"](False)  # after the block: not counted
    branchy, inner = coverage.functions()
    assert (branchy.name, branchy.first_line) == ("branchy", 9)
    # The generator expression's lines are branchy's own.
    assert branchy.executable == frozenset({9, 10, 11, 13, 14})
    assert branchy.executed == frozenset({9, 10, 11, 14})
    assert branchy.missed == frozenset({13})
    assert branchy.shown == "v1/engine/fake_core.py:9 branchy"
    assert inner.executed == frozenset()


def test_line_coverage_sees_every_greenlet_and_restores_the_tracer(
    tmp_path: Path,
) -> None:
    code = _load(tmp_path)
    parked = greenlet.greenlet(lambda: code["branchy"](False))
    before = sys.gettrace()
    with LineCoverage([code["branchy"].__code__]) as coverage:
        greenlet.greenlet(lambda: code["branchy"](True)).switch()
        parked.switch()
    assert sys.gettrace() is before
    assert coverage.functions()[0].missed == frozenset()
