"""Target coverage from the suite's tests: the pytest plugin's children send it back."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dpsim.coverage import Scope, measure
from dpsim.coverage import suite as coverage_suite

SOURCE = "def f(x):\n    if x:\n        return 1\n    return 2\n"


def test_children_results_merge_into_one(tmp_path: Path) -> None:
    path = tmp_path / "target.py"
    path.write_text(SOURCE)
    namespace: dict[str, object] = {}
    exec(compile(SOURCE, str(path), "exec"), namespace)
    f = namespace["f"]
    sent = []
    for argument, scenario in ((0, "step"), (1, "profile")):
        measurement = measure([Scope(str(path), "target.py")])
        with measurement.running(scenario, "caller"):
            f(argument)  # type: ignore[operator]
        sent.append(json.loads(json.dumps(measurement.result(None).to_json())))
    merged = coverage_suite.merged(sent)
    assert merged is not None
    (file,) = merged.files
    assert file.executed_lines == {2, 3, 4}
    assert file.missing_branches == frozenset()
    assert merged.context_keys == (("step", "caller"), ("profile", "caller"))
    assert coverage_suite.merged([]) is None


def test_a_case_is_traced_only_while_a_measurement_is_installed() -> None:
    assert isinstance(coverage_suite.running("step", "caller"), contextlib.nullcontext)
    target = SimpleNamespace(files=(), api=None)  # a target with nothing to measure
    with coverage_suite.measuring(target):
        running = coverage_suite.running("step", "caller")
        assert not isinstance(running, contextlib.nullcontext)
    assert isinstance(coverage_suite.running("step", "caller"), contextlib.nullcontext)


def test_the_environment_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(coverage_suite.ENV, "0")
    assert not coverage_suite.enabled(False)
    monkeypatch.setenv(coverage_suite.ENV, "1")
    assert coverage_suite.enabled(False)
    monkeypatch.delenv(coverage_suite.ENV)
    assert coverage_suite.enabled(True) and not coverage_suite.enabled(False)


# The plugin's end of it under xdist (two workers' coverage merged, printed
# and written) runs in tests/test_plugin.py's suite-under-xdist test, in the
# same pytest session as the JUnit check.


@pytest.mark.release
def test_fuzz_workers_send_their_coverage_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpsim.cli import main

    code = main(
        [
            *("fuzz", "--vllm", "0.33.0", "--workers", "1", "--for", "3s"),
            *("--scenario", "profile", "--db", str(tmp_path / "db")),
            *("--out", str(tmp_path / "out"), "--coverage", "--json"),
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    dp_utils = data["coverage"]["files"][0]
    assert dp_utils["file"] == "v1/worker/gpu/dp_utils.py"
    assert dp_utils["lines_executed"] > 0
    assert data["coverage"]["html"] == str(tmp_path / "out" / "coverage" / "index.html")
