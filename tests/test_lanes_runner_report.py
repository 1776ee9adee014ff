"""report.measure: the runner lane's rate is the best of its timed passes."""

from __future__ import annotations

from typing import Any

import pytest

from dpsim.errors import TargetError
from dpsim.lanes.runner import report


def test_the_rate_is_the_best_pass_over_the_usable_cases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    clock = iter([0.0, 4.0, 10.0, 11.0, 20.0, 22.0])  # passes of 4 s, 1 s, 2 s

    def run(target: Any, case: str) -> None:
        ran.append(case)
        if case == "refused":
            raise TargetError("runner lane cannot drive it")

    drawn_for: list[str] = []

    def bench_cases(count: int, runner: str) -> list[str]:
        drawn_for.append(runner)
        return ["a", "refused", "b"]

    monkeypatch.setattr(report, "bench_cases", bench_cases)
    monkeypatch.setattr(report, "run_runner_case", run)
    monkeypatch.setattr(report.time, "perf_counter", lambda: next(clock))
    target: Any = type("T", (), {"label": "vllm 9.9.9", "runner": "v1"})()
    shown = report.measure(target, count=3, passes=3)
    # The cases are drawn for the target's model runner.
    assert drawn_for == ["v1"] and shown["runner"] == "v1"
    assert (shown["cases"], shown["refused"], shown["passes"]) == (2, 1, 3)
    assert (shown["seconds"], shown["cases_per_s"]) == (1.0, 2.0)
    # A warm-up over all cases, three timed passes and one profiled pass.
    assert ran == ["a", "refused", "b"] + ["a", "b"] * 4
