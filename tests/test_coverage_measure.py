"""Target coverage on a hand-written target file (no release needed)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from greenlet import greenlet

from dpsim.coverage import EXIT, CoverageResult, Scope, Unreachable, measure
from dpsim.coverage.html import write_html
from dpsim.coverage.render import render_text
from dpsim.coverage.scope import self_calls
from dpsim.errors import TargetError

SOURCE = '''\
import os


def pick(x):
    """Docstring: not a statement that runs."""
    if x > 1:
        return "big"
    for i in range(x):
        if i:
            pass
    return "small"


class Manager:
    def dispatch(self, n):
        if n:
            return self._helper(n)
        return 0

    def _helper(self, n):
        return n if n > 2 else -n

    def unused(self):
        return 1
'''


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "vllm" / "v1" / "worker" / "target.py"
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE)
    return path


def load(path: Path, cut: str | None = None) -> dict[str, Any]:
    """Compile the file under its real name, as dpsim loads a target; with
    ``cut``, only that top-level definition (as the V1 caller cuts a method)."""
    tree = ast.parse(path.read_text())
    if cut is not None:
        tree.body = [node for node in tree.body if getattr(node, "name", None) == cut]
    namespace: dict[str, Any] = {}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace


def scopes(path: Path) -> tuple[Scope, ...]:
    return (
        Scope(str(path), "v1/worker/target.py", ("pick",)),
        Scope(
            str(path), "v1/worker/target.py", ("Manager.dispatch", "Manager._helper")
        ),
    )


def test_missing_lines_and_branches_are_pinned(target: Path) -> None:
    code = load(target)
    with measure(scopes(target)) as measurement, measurement.running("step", "caller"):
        code["pick"](0)
        code["Manager"]().dispatch(3)
    (file,) = measurement.result("0.33.0").files  # one scope per file
    assert file.executable_lines == {6, 7, 8, 9, 10, 11, 16, 17, 18, 21}
    assert file.executed_lines == {6, 8, 11, 16, 17, 21}
    assert file.missing_lines == {7, 9, 10, 18}
    # Lines 9's branches never ran with their line: listed as unrun, not missing.
    assert file.missing_branches == {(6, 7), (8, 9), (16, 18)}
    assert file.unrun_branches == {(9, 10), (9, 8)}
    assert (21, EXIT) not in file.branches  # a ternary is one line, one way out
    assert 24 not in file.executable_lines  # Manager.unused is out of scope


def test_a_function_cut_out_of_its_file_has_the_files_arcs(target: Path) -> None:
    code = load(target, cut="pick")
    with measure(scopes(target)[:1]) as measurement, measurement.running():
        code["pick"](2)
        code["pick"](3)
    (file,) = measurement.result(None).files
    assert file.executed_branches == {(6, 7)}
    assert file.missing_branches == {(6, 8)}


def test_only_running_blocks_count_per_context_across_greenlets(target: Path) -> None:
    code = load(target)

    def rank(x: int) -> None:
        code["pick"](x)
        parent.switch()  # interleave the ranks
        code["pick"](x + 2)

    parent = greenlet.getcurrent()
    with measure(scopes(target)) as measurement:
        code["pick"](5)  # outside any running block: not counted
        ranks = [greenlet(rank) for _ in range(2)]
        with measurement.running("a", "caller"):
            for each in ranks:
                each.switch(0)
        with measurement.running("b", "contract"):
            for each in ranks:
                each.switch()
    result = measurement.result(None)
    assert result.context_keys == (("a", "caller"), ("b", "contract"))
    (a,) = result.context("a", "caller")
    (b,) = result.context("b", "contract")
    assert a.executed_lines == {6, 8, 11}
    assert b.executed_lines == {6, 7}
    assert b.executed_branches == {(6, 7)}
    (total,) = result.files
    assert total.executed_branches == {(6, 7), (6, 8), (8, 11)}


def test_marks_list_a_branch_apart_and_report_reached_and_stale(target: Path) -> None:
    marks = (
        Unreachable(
            "<0.30", "v1/worker/target.py", "pick", "if x > 1:", 'return "big"', "x < 2"
        ),
        Unreachable(
            "",
            "v1/worker/target.py",
            "Manager.dispatch",
            "if n:",
            "return self._helper(n)",
            "n is never set",
        ),
        Unreachable("", "v1/worker/target.py", "pick", "if x > 2:", "exit", "moved"),
        Unreachable("", "v1/worker/target.py", "pick", 'return "big"', None, "x < 2"),
    )
    code = load(target)
    with measure(scopes(target), marks) as measurement, measurement.running():
        code["pick"](0)
        code["Manager"]().dispatch(1)
    (file,) = measurement.result("0.29.0").files
    assert file.unreachable_branches == {(6, 7): "x < 2"}
    assert file.unreachable_lines == {7: "x < 2"}
    assert (6, 7) not in file.missing_branches and 7 not in file.missing_lines
    assert [mark.reason for mark in file.marked.reached] == ["n is never set"]
    assert [mark.reason for mark in file.marked.stale] == ["moved"]
    # The release range: on 0.30.0 the first mark does not apply.
    (later,) = measurement.result("0.30.0").files
    assert (6, 7) in later.missing_branches
    text = render_text(measurement.result("0.29.0"))
    assert "unreachable target.py:6->7: x < 2" in text
    assert "marked unreachable but reached" in text


def test_a_mark_bound_to_a_profile_holds_for_that_profiles_cases_only(
    target: Path,
) -> None:
    # pick(x > 1) is unreachable by the "callers", not by the "contract".
    marks = (
        Unreachable(
            "",
            "v1/worker/target.py",
            "pick",
            "if x > 1:",
            'return "big"',
            "callers pass x < 2",
            profiles=("caller",),
        ),
        Unreachable(
            "",
            "v1/worker/target.py",
            "pick",
            'return "big"',
            None,
            "callers pass x < 2",
            profiles=("caller",),
        ),
    )
    code = load(target)
    with measure(scopes(target), marks) as measurement:
        with measurement.running("step", "caller"):
            code["pick"](0)
        with measurement.running("step", "contract"):
            code["pick"](1)
    result = measurement.result(None)
    assert result.profiles == ("caller", "contract")
    (caller,) = result.profile("caller")
    assert caller.unreachable_branches == {(6, 7): "callers pass x < 2"}
    assert caller.unreachable_lines == {7: "callers pass x < 2"}
    assert (6, 7) not in caller.missing_branches and 7 not in caller.missing_lines
    # The contract must reach it: missing there, and in both profiles' totals.
    (contract,) = result.profile("contract")
    (total,) = result.files
    for file in (contract, total):
        assert not file.unreachable_branches and not file.unreachable_lines
        assert (6, 7) in file.missing_branches and 7 in file.missing_lines
        assert not file.marked.stale  # a mark that does not apply is not stale
    # A context is judged by its own profile's marks.
    (step_caller,) = result.context("step", "caller")
    assert (6, 7) not in step_caller.missing_branches
    data = result.to_json()
    assert [item["profile"] for item in data["profiles"]] == ["caller", "contract"]
    (caller_json,) = data["profiles"][0]["files"]
    assert caller_json["unreachable_branches"] == {"6->7": "callers pass x < 2"}
    text = render_text(result)
    assert "  all profiles together:" in text and "  profile caller:" in text
    assert "    unreachable target.py:6->7: callers pass x < 2" in text
    # Reached by the caller profile's cases: reported, for that profile only.
    with measure(scopes(target), marks) as again, again.running("step", "caller"):
        code["pick"](2)
    (reached,) = again.result(None).files
    assert [mark.reason for mark in reached.marked.reached] == [
        "callers pass x < 2"
    ] * 2
    assert "(profile caller)" in render_text(again.result(None))


def test_json_round_trip_and_html(target: Path, tmp_path: Path) -> None:
    code = load(target)
    with measure(scopes(target)) as measurement, measurement.running("step", "caller"):
        code["pick"](0)
    result = measurement.result("0.33.0")
    data = json.loads(json.dumps(result.to_json()))
    back = CoverageResult.from_json(data)
    assert back.to_json() == result.to_json()
    (file,) = data["files"]
    assert file["missing_lines"] == [7, 9, 10, 16, 17, 18, 21]
    assert file["missing_branches"] == [[6, 7], [8, 9]]
    index = write_html(result, tmp_path / "html", "vllm 0.33.0")
    page = (tmp_path / "html" / "v1_worker_target.py.html").read_text()
    assert "never taken: 6-&gt;7" in page
    assert "http" not in page and "<script" not in page
    assert "v1_worker_target.py.html" in index.read_text()


def test_an_unknown_function_is_refused_in_one_line(target: Path) -> None:
    with pytest.raises(TargetError, match=r"has no function Manager\.nope"):
        measure([Scope(str(target), "v1/worker/target.py", ("Manager.nope",))])


def test_a_methods_scope_follows_its_self_and_module_calls(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.py"
    path.write_text(
        "def helper(x):\n    return deeper(x)\n\n\ndef deeper(x):\n    return x\n\n\n"
        "def unused():\n    return 0\n\n\n"
        "class Manager:\n"
        "    def dispatch(self, n):\n        return self._pick(n) + helper(n)\n\n"
        "    def _pick(self, n):\n        return self._last(n)\n\n"
        "    def _last(self, n):\n        return n\n\n"
        "    def capture(self):\n        return 1\n"
    )
    # Breadth first through each body, then on to what each callee calls.
    assert self_calls(str(path), "Manager.dispatch") == (
        "Manager.dispatch",
        "helper",
        "Manager._pick",
        "deeper",
        "Manager._last",
    )
    with pytest.raises(TargetError, match=r"has no Manager\.nope"):
        self_calls(str(path), "Manager.nope")
