"""Request streams and engine options: JSON round trips and one-line refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dpsim.errors import UsageError
from dpsim.lanes.runner.stream import (
    EngineOptions,
    RankStream,
    RequestScript,
    check_streams,
    streams_from_json,
    streams_to_json,
)

OPTIONS = EngineOptions(
    async_scheduling=True,
    dp_sync_interval=4,
    max_num_seqs=3,
    max_num_batched_tokens=24,
    max_model_len=40,
    long_prefill_token_threshold=8,
    prefill_schedule_interval=2,
    speculator="mtp",
    num_speculative_tokens=3,
)
STREAMS = (
    RankStream(
        (
            RequestScript("r0-0", 0, 30, 4, kv_wait=2, accepted=(3, 0, 1)),
            RequestScript("r0-1", 2, 1, 39),
        )
    ),
    RankStream(),
)


def test_options_round_trip_is_byte_stable() -> None:
    text = json.dumps(OPTIONS.to_json())
    again = EngineOptions.from_json(json.loads(text))
    assert again == OPTIONS
    assert json.dumps(again.to_json()) == text
    # Every field is written, in declaration order.
    assert list(json.loads(text)) == [
        "async_scheduling",
        "dp_sync_interval",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "long_prefill_token_threshold",
        "prefill_schedule_interval",
        "speculator",
        "num_speculative_tokens",
        "executor",
    ]


def test_streams_round_trip_is_byte_stable() -> None:
    text = json.dumps(streams_to_json(STREAMS))
    again = streams_from_json(json.loads(text), OPTIONS)
    assert again == STREAMS
    assert json.dumps(streams_to_json(again)) == text
    assert json.loads(text)[0]["requests"][0] == {
        "req_id": "r0-0",
        "arrival": 0,
        "prompt_len": 30,
        "output_len": 4,
        "kv_wait": 2,
        "accepted": [3, 0, 1],
    }


def test_missing_optional_fields_take_their_defaults() -> None:
    assert EngineOptions.from_json({}) == EngineOptions()
    # A file written before the executor was an option ran UniProcExecutor's.
    assert EngineOptions.from_json({}).executor == "uni"
    script = RequestScript.from_json(
        {"req_id": "a", "arrival": 1, "prompt_len": 2, "output_len": 3}
    )
    assert script == RequestScript("a", 1, 2, 3, kv_wait=0, accepted=())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"max_num_seqs": 0},
            "engine options: max_num_seqs must be an integer >= 1, got 0",
        ),
        (
            {"async_scheduling": 1},
            "engine options: async_scheduling must be true or false, got 1",
        ),
        (
            {"executor": "ray"},
            "engine options: executor must be one of uni, mp, got 'ray'",
        ),
        (
            {"speculator": "medusa", "num_speculative_tokens": 2},
            "engine options: speculator must be one of ar, mtp, eagle or null, "
            "got 'medusa'",
        ),
        (
            {"speculator": "ar"},
            "engine options: speculator and num_speculative_tokens go together "
            "(speculator 'ar', num_speculative_tokens 0)",
        ),
        (
            {"num_speculative_tokens": 2},
            "engine options: speculator and num_speculative_tokens go together "
            "(speculator None, num_speculative_tokens 2)",
        ),
        (
            {"max_num_seqs": 16, "max_num_batched_tokens": 8},
            "engine options: max_num_batched_tokens (8) must be >= max_num_seqs (16)",
        ),
        (
            {"dp_sync_interval": 0},
            "engine options: dp_sync_interval must be an integer >= 1, got 0",
        ),
        (
            {"max_model_len": 1},
            "engine options: max_model_len must be an integer >= 2, got 1",
        ),
        ({"bogus": 1, "also": 2}, "engine options: unknown keys: also, bogus"),
        ([], "engine options: expected a mapping, got []"),
    ],
)
def test_options_refusals_are_one_line(data: Any, message: str) -> None:
    with pytest.raises(UsageError) as error:
        EngineOptions.from_json(data)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"req_id": "a", "arrival": 0, "prompt_len": 1},
            "request: missing keys: output_len",
        ),
        (
            {"req_id": "a b", "arrival": 0, "prompt_len": 1, "output_len": 1},
            "request: req_id must be 1-64 letters, digits, '-' or '_', got 'a b'",
        ),
        (
            {"req_id": "a", "arrival": -1, "prompt_len": 1, "output_len": 1},
            "request a: arrival must be an integer >= 0, got -1",
        ),
        (
            {"req_id": "a", "arrival": 0, "prompt_len": 0, "output_len": 1},
            "request a: prompt_len must be an integer >= 1, got 0",
        ),
        (
            {
                "req_id": "a",
                "arrival": 0,
                "prompt_len": 1,
                "output_len": 1,
                "accepted": [1, -2],
            },
            "request a: accepted every entry must be an integer >= 0, got -2",
        ),
        (
            {
                "req_id": "a",
                "arrival": 0,
                "prompt_len": 1,
                "output_len": 1,
                "accepted": 3,
            },
            "request a: accepted expected a list of integers, got 3",
        ),
    ],
)
def test_request_refusals_are_one_line(data: Any, message: str) -> None:
    with pytest.raises(UsageError) as error:
        RequestScript.from_json(data)
    assert str(error.value) == message


def test_stream_refusals() -> None:
    late_first = [RequestScript("a", 3, 1, 1), RequestScript("b", 1, 1, 1)]
    with pytest.raises(
        UsageError, match=r"^rank stream: requests must be listed in arrival order$"
    ):
        RankStream(tuple(late_first))
    twice = (
        RankStream((RequestScript("a", 0, 1, 1),)),
        RankStream((RequestScript("a", 0, 1, 1),)),
    )
    with pytest.raises(UsageError, match=r"^request a: req_id is used twice$"):
        check_streams(twice, EngineOptions())
    too_long = [
        {"requests": [{"req_id": "a", "arrival": 0, "prompt_len": 40, "output_len": 1}]}
    ]
    with pytest.raises(
        UsageError,
        match=r"^request a: prompt_len \(40\) must be below max_model_len \(40\)$",
    ):
        streams_from_json(too_long, OPTIONS)
    with pytest.raises(
        UsageError, match=r"^streams: expected a list with one stream per rank"
    ):
        streams_from_json([], OPTIONS)
    with pytest.raises(UsageError, match=r"^rank stream: unknown keys: extra$"):
        streams_from_json([{"requests": [], "extra": 1}], OPTIONS)


def test_decode_query_len() -> None:
    assert OPTIONS.decode_query_len == 4
    assert EngineOptions().decode_query_len == 1
