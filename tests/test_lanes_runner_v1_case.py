"""Runner cases of the V1 model runner: the ``runner`` key, its speculators,
old files, and what generation draws for V1's drafters.

Fast tier: no release is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st

from dpsim.errors import UsageError
from dpsim.lanes.runner import case as runner_case
from dpsim.lanes.runner.case import RunnerCase, RunnerCaseFile
from dpsim.lanes.runner.check import runner_cases
from dpsim.lanes.runner.generate import workloads
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.records.policy import CapturePolicy
from dpsim.scenarios.generate import seeded_draws_only

POLICY = CapturePolicy(capture_sizes=(1, 2, 4, 8), decode_query_len=4)
TARGET = {
    "label": "vLLM 0.33.0",
    "spec": {"kind": "release", "base": "0.33.0"},
    "version": "0.33.0",
    "files": {"vllm.v1.worker.dp_utils": "0" * 64},
}


def _case(speculator: str | None = "eagle", runner: str = "v1") -> RunnerCase:
    k = 3 if speculator else 0
    return RunnerCase(
        CapturePolicy(capture_sizes=(1, 2, 4, 8), decode_query_len=1 + k),
        EngineOptions(speculator=speculator, num_speculative_tokens=k),
        (RankStream((RequestScript("a", 0, 5, 3, accepted=(1, 3)),)), RankStream()),
        seed=2,
        runner=runner,
    )


def _draw(strategy: st.SearchStrategy[Any], count: int = 200) -> list[Any]:
    drawn: list[Any] = []

    def keep(value: Any) -> bool:
        drawn.append(value)
        return len(drawn) >= count

    with seeded_draws_only():
        find(
            strategy,
            keep,
            settings=settings(
                max_examples=count,
                database=None,
                deadline=None,
                phases=(Phase.generate,),
                suppress_health_check=list(HealthCheck),
            ),
            random=Random(0),
        )
    return drawn


@pytest.mark.parametrize("speculator", ["eagle", "mtp", None])
def test_a_v1_case_round_trips_with_its_runner(
    speculator: str | None, tmp_path: Path
) -> None:
    case = _case(speculator)
    data = case.to_dict()
    assert data["runner"] == "v1"
    assert RunnerCase.from_dict(json.loads(json.dumps(data))) == case
    written = RunnerCaseFile(
        target=TARGET,
        case=case,
        properties=("no-hang",),
        verdicts=(),
        outcome="ok",
        trace={"outcome": "ok"},
        dpsim_version="0.0.test",
    ).write(tmp_path)
    read = runner_case.read(written)
    assert read.case.runner == "v1"
    assert read.encode() == written.read_text()


#: A V2 runner case file as dpsim wrote them before the lane drove V1
#: (written out by hand: every key, sorted, indent 1).
_OLD_FILE = """{
 "case": {
  "dp_size": 2,
  "lane": "runner",
  "options": {
   "async_scheduling": false,
   "dp_sync_interval": 16,
   "executor": "uni",
   "long_prefill_token_threshold": 0,
   "max_model_len": 256,
   "max_num_batched_tokens": 64,
   "max_num_seqs": 8,
   "num_speculative_tokens": 2,
   "prefill_schedule_interval": 1,
   "speculator": "ar"
  },
  "policy": %(policy)s,
  "runner": "v2",
  "seed": 7,
  "streams": [
   {
    "requests": [
     {
      "accepted": [],
      "arrival": 0,
      "kv_wait": 0,
      "output_len": 3,
      "prompt_len": 5,
      "req_id": "a"
     }
    ]
   },
   {
    "requests": []
   }
  ]
 },
 "dpsim_version": "0.0.test",
 "kind": "dpsim-runner-case",
 "lane": "runner",
 "outcome": "ok",
 "properties": [
  "no-hang"
 ],
 "schema": 1,
 "target": %(target)s,
 "trace": {
  "outcome": "ok"
 },
 "verdicts": []
}
"""


def _old_file() -> str:
    policy = CapturePolicy(capture_sizes=(1, 2, 4, 8), decode_query_len=3)

    def nested(value: Any) -> str:
        # Indented as json.dumps(indent=1) indents a value two levels down.
        return json.dumps(value, indent=1, sort_keys=True).replace("\n", "\n  ")

    return _OLD_FILE % {
        "policy": nested(policy.to_dict()),
        "target": json.dumps(TARGET, indent=1, sort_keys=True).replace("\n", "\n "),
    }


def test_a_file_written_before_v1_reads_as_v2_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(_old_file())
    read = runner_case.read(path)
    assert read.case.runner == "v2"
    assert read.encode() == path.read_text()


def test_a_case_without_a_runner_key_is_v2s() -> None:
    data = _case(None, runner="v2").to_dict()
    del data["runner"]
    assert RunnerCase.from_dict(data).runner == "v2"


@pytest.mark.parametrize(
    ("runner", "speculator", "message"),
    [
        ("v1", "ar", "the V1 runner's speculators are eagle, mtp, not 'ar'"),
        ("v2", "eagle", "the V2 runner's speculators are ar, mtp, not 'eagle'"),
        ("v0", None, "drives the v2 and v1 runners, not 'v0'"),
    ],
)
def test_a_speculator_or_runner_the_lane_does_not_pair_is_refused(
    runner: str, speculator: str | None, message: str
) -> None:
    with pytest.raises(UsageError) as refused:
        _case(speculator, runner=runner)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_v1_cases_are_drawn_with_v1s_drafters_and_runner() -> None:
    cases = _draw(runner_cases(runner="v1"), 150)
    assert {case.runner for case in cases} == {"v1"}
    drawn = {case.options.speculator for case in cases}
    assert drawn == {None, "eagle", "mtp"}
    assert {case.options.num_speculative_tokens for case in cases} >= {1, 7}
    v2 = _draw(runner_cases(), 150)
    assert {case.runner for case in v2} == {"v2"}
    assert {case.options.speculator for case in v2} == {None, "ar", "mtp"}


def test_v1_prompts_reach_both_sides_of_the_drafter_fit_check() -> None:
    """With k = 7 and max_model_len 16 the fit check (max_seq_len + k <=
    max_model_len) flips at a sequence of 9 tokens: V1's draws start
    requests up to k + 1 before the end (prompts 7..15) and run them to
    max_model_len, where V2's near-the-end prompts start 3 before (12..15)
    and its short ones end at 8: 9..11 only V1 draws."""
    options = EngineOptions(
        max_model_len=16,
        max_num_batched_tokens=64,
        speculator="eagle",
        num_speculative_tokens=7,
    )

    def requests(runner: str) -> list[Any]:
        drawn = _draw(workloads(options=st.just(options), runner=runner), 150)
        return [
            request
            for _, streams in drawn
            for stream in streams
            for request in stream.requests
        ]

    v1_requests = requests("v1")
    v1 = {request.prompt_len for request in v1_requests}
    v2 = {request.prompt_len for request in requests("v2")}
    assert v1 & {9, 10, 11}
    assert not v2 & {9, 10, 11}
    # Such a request runs to max_model_len: through the edge.
    ran_out = [
        request
        for request in v1_requests
        if request.prompt_len in (9, 10, 11)
        and request.prompt_len + request.output_len >= 16
    ]
    assert ran_out
