"""dpsim bench: a row per model runner, each measured on its own runner.

Figures are never asserted (speed targets live in dpsim.bench, not in timed
tests): only that each row is there, names its runner and is well formed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dpsim import bench
from dpsim.cli import main
from dpsim.targets import load_target

pytestmark = pytest.mark.release


def test_sim_and_check_have_a_row_per_runner(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["bench", "--vllm", "0.33.0", "--ranks", "2", "--json"]
    assert main([*common, "--measure", "sim", "--rounds", "3"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["measure"], row["runner"]) for row in rows] == [
        ("sim", "v2"),
        ("sim", "v1"),
    ]
    assert "V1 runner" in rows[1]["target"]
    assert all(row["overhead"] > 0 and row["rounds"] == 3 for row in rows)
    assert main([*common, "--measure", "sim", "--rounds", "3", "--runner", "v1"]) == 0
    (only,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert only["runner"] == "v1"


def test_check_measures_v1_cases() -> None:
    row = bench.bench_check(load_target("0.33.0", runner="v1"), 2, 10)
    assert row["runner"] == "v1" and row["cases"] >= 1
    assert row["cases_judged_per_s"] > 0


def test_check_splits_a_case_into_generation_simulation_and_judging() -> None:
    row = bench.bench_check(load_target("0.33.0"), 2, 10)
    parts = [row[f"{part}_s"] for part in ("generation", "simulation", "judging")]
    assert all(part > 0 for part in parts)
    assert row["end_to_end_cases_per_cpu_s"] > 0


class _Clock:
    """Both of bench's clocks, each reading from a list of its own."""

    def __init__(self, wall: list[float], cpu: list[float]) -> None:
        self.wall, self.cpu = iter(wall), iter(cpu)

    def perf_counter(self) -> float:
        return next(self.wall)

    def process_time(self) -> float:
        return next(self.cpu)


def test_a_check_row_splits_the_clocks_readings_into_its_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 3 s of wall clock and 2 s of CPU for 8 cases, of which the runs spent
    # 1.5 s judging (simulating included) and 0.75 s simulating.
    monkeypatch.setattr(bench, "time", _Clock([100.0, 103.0], [50.0, 52.0]))
    runs = [
        SimpleNamespace(judging_seconds=1.0, simulating_seconds=0.5),
        SimpleNamespace(judging_seconds=0.5, simulating_seconds=0.25),
    ]
    report = SimpleNamespace(examples=8, runs=runs, passed=False)
    monkeypatch.setattr(bench, "run_check", lambda target, options: report)
    target = SimpleNamespace(label="a target", runner="v2")
    row = bench.bench_check(target, 2, 8)  # type: ignore[arg-type]
    assert row == {
        "measure": "check",
        "target": "a target",
        "runner": "v2",
        "engine": "hypothesis",
        "ranks": 2,
        "cases": 8,
        "seconds": 3.0,
        "cpu_seconds": 2.0,
        # Generation is what neither simulating nor judging took.
        "generation_s": 1.5,
        "simulation_s": 0.75,
        "judging_s": 0.75,
        "generation_us_per_case": 187_500.0,
        "simulation_us_per_case": 93_750.0,
        "judging_us_per_case": 93_750.0,
        "cases_judged_per_s": 8 / 1.5,
        "end_to_end_cases_per_s": 8 / 3.0,
        "end_to_end_cases_per_cpu_s": 4.0,
        "verdict": "fail",
    }


def test_corpus_reports_first_counterexamples_apart_from_shrinking() -> None:
    (entry,) = [row for row in bench.corpus_entries("v2") if row[0] == "witness-solo"]
    result = bench.bench_corpus([entry])
    (row,) = result["rows"]
    assert row["caught"]
    assert 0 < row["first_counterexample_s"] <= row["with_shrinking_s"]
    assert result["first_counterexamples_s"] == row["first_counterexample_s"]
    assert result["median_with_shrinking_s"] == row["with_shrinking_s"]
    assert result["total_s"] >= row["with_shrinking_s"]


def test_startup_times_a_fresh_check_and_its_imports() -> None:
    row = bench.bench_startup("0.33.0", "v2", repeats=1)
    assert row["measure"] == "startup" and row["repeats"] == 1
    assert row["imports_s"] > 0 and row["to_first_case_s"] > 0


def test_corpus_entries_keep_to_their_runner() -> None:
    v1 = bench.corpus_entries("v1")
    assert v1 and all(target.runner == "v1" for _, target, _ in v1)
    assert all(name.startswith("v1-") for name, _, _ in v1)


def test_a_release_without_v2s_sync_measures_v1_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["bench", "--vllm", "0.17.0", "--ranks", "2", "--rounds", "2", "--json"]
    assert main([*common, "--measure", "sim"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["runner"] for row in rows] == ["v1"]
    assert main([*common, "--measure", "sim", "--runner", "v2"]) == 2
    assert "older than dpsim supports with the V2 runner" in capsys.readouterr().err


def test_a_check_row_searches_in_a_process_of_its_own(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A search in this process would meet the patched function: the row must
    # come from a fresh process, where no earlier row warmed the caches.
    def in_this_process(*_: object) -> None:
        raise AssertionError("the check row ran in the bench's own process")

    monkeypatch.setattr(bench, "bench_check", in_this_process)
    common = ["bench", "--vllm", "0.33.0", "--ranks", "2", "--runner", "v2"]
    argv = [*common, "--measure", "check", "--engine", "fast", "--cases", "5"]
    assert main([*argv, "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["measure"], row["engine"], row["ranks"]) == ("check", "fast", 2)
    assert row["cases"] >= 5 and row["end_to_end_cases_per_s"] > 0


def test_check_rows_refuse_no_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--vllm", "0.33.0", "--cases", "0"]) == 2
    assert "--cases must be at least 1" in capsys.readouterr().err
