"""Runner cases and their files: round trips byte for byte, refusals in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpsim.errors import UsageError
from dpsim.lanes.runner import case as runner_case
from dpsim.lanes.runner.case import RunnerCase, RunnerCaseFile
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.records.policy import CapturePolicy

POLICY = CapturePolicy(capture_sizes=(1, 2, 4, 8), decode_query_len=3)
OPTIONS = EngineOptions(speculator="ar", num_speculative_tokens=2)
CASE = RunnerCase(
    POLICY,
    OPTIONS,
    (RankStream((RequestScript("a", 0, 5, 3),)), RankStream()),
    seed=7,
)
TARGET = {
    "label": "vLLM 0.33.0",
    "spec": {"kind": "release", "base": "0.33.0"},
    "version": "0.33.0",
    "files": {"vllm.v1.worker.gpu.dp_utils": "0" * 64},
}


def _file(**changes: Any) -> RunnerCaseFile:
    fields: dict[str, Any] = {
        "target": TARGET,
        "case": CASE,
        "properties": ("no-hang", "drafter-forwards"),
        "verdicts": (
            {"property": "no-hang", "phase": None, "ranks": [1], "message": "hang"},
        ),
        "outcome": "hang",
        "trace": {"outcome": "hang"},
        "dpsim_version": "0.0.test",
    }
    return RunnerCaseFile(**(fields | changes))


def test_a_case_round_trips() -> None:
    data = CASE.to_dict()
    assert data["lane"] == "runner" and data["dp_size"] == 2
    again = RunnerCase.from_dict(json.loads(json.dumps(data)))
    assert again == CASE
    assert again.to_dict() == data


def test_a_file_round_trips_byte_for_byte(tmp_path: Path) -> None:
    written = _file().write(tmp_path)
    assert written.name.startswith("runner-no-hang-")
    read = runner_case.read(written)
    assert read == _file()
    assert read.encode() == written.read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lane": "sync"}, "lane must be 'runner', got 'sync'"),
        ({"dp_size": 3}, "dp_size 3 but 2 request streams"),
        ({"runner": "v3"}, "drives the v2 and v1 runners, not 'v3'"),
        ({"runner": "v1"}, "the V1 runner's speculators are eagle, mtp, not 'ar'"),
        ({"seed": -1}, "case.seed"),
        ({"extra": 1}, "unknown keys: extra"),
        ({"policy": {"capture_sizes": [1], "decode_query_len": 1}}, "must be 1 + "),
        ({"streams": []}, "one stream per rank"),
    ],
)
def test_a_bad_case_is_refused_in_one_line(
    change: dict[str, Any], message: str
) -> None:
    data = CASE.to_dict() | change
    with pytest.raises(UsageError) as raised:
        RunnerCase.from_dict(data)
    text = str(raised.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "dpsim-counterexample"}, "not a dpsim runner case file"),
        ({"schema": 9}, "runner case schema '9'"),
        ({"lane": "sync"}, "lane must be 'runner'"),
        ({"properties": ["nope"]}, "properties"),
        ({"outcome": "fine"}, "outcome"),
    ],
)
def test_a_bad_file_is_refused_in_one_line(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(_file().to_dict() | change))
    with pytest.raises(UsageError) as raised:
        runner_case.read(path)
    text = str(raised.value)
    assert message in text and str(path) in text and "\n" not in text


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "case.json"
    path.write_text("{")
    with pytest.raises(UsageError, match="not JSON"):
        runner_case.read(path)


def test_recorded_lane_files_must_be_digests(tmp_path: Path) -> None:
    path = tmp_path / "case.json"
    target = TARGET | {"lane_files": {"vllm.v1.engine.core": "nope"}}
    path.write_text(json.dumps(_file(target=target).to_dict()))
    with pytest.raises(UsageError, match="lane_files"):
        runner_case.read(path)
