"""Target coverage from the suite's tests: the pytest plugin's children send it back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
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


@pytest.mark.release
def test_the_plugin_prints_and_writes_the_suites_coverage(tmp_path: Path) -> None:
    out = tmp_path / "out"
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--pyargs", "dpsim.suite"),
            # Two xdist workers: their coverage reaches the controller.
            *("-p", "no:cacheprovider", "-q", "-n", "2", "-k", "profile or step"),
            *("--dpsim-vllm", "0.33.0", "--dpsim-examples", "3"),
            *("--dpsim-out", str(out), "--dpsim-coverage"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "CI": ""},
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "dpsim target coverage" in completed.stdout
    assert "  v1/worker/gpu/dp_utils.py: lines " in completed.stdout
    data = json.loads((out / "coverage" / "coverage.json").read_text())
    assert data["files"][0]["file"] == "v1/worker/gpu/dp_utils.py"
    assert data["files"][0]["lines_executed"] > 0
    assert sorted(item["scenario"] for item in data["contexts"]) == ["profile", "step"]
    assert (out / "coverage" / "index.html").is_file()


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
