"""The runner lane's strategies draw every edge the lane needs, and only valid input."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import HypothesisWarning, NoSuchExample

from dpsim.lanes.runner.generate import (
    MAX_ITERATIONS,
    engine_options,
    rank_streams,
    workloads,
)
from dpsim.lanes.runner.stream import (
    EngineOptions,
    RankStream,
    check_streams,
    streams_from_json,
    streams_to_json,
)

Workload = tuple[EngineOptions, tuple[RankStream, ...]]
#: An edge is found, not shrunk: the first drawn example shows it is drawn.
FIND = settings(
    max_examples=2000,
    database=None,
    derandomize=True,
    phases=(Phase.generate,),
    suppress_health_check=list(HealthCheck),
)
SHRINK = settings(FIND, phases=(Phase.generate, Phase.shrink))


def requests(workload: Workload) -> list[Any]:
    return [request for stream in workload[1] for request in stream.requests]


EDGES: dict[str, Callable[[Workload], bool]] = {
    "idle rank": lambda w: any(not s.requests for s in w[1]) and bool(requests(w)),
    "late wave": lambda w: any(r.arrival >= MAX_ITERATIONS - 2 for r in requests(w)),
    "kv wait": lambda w: any(r.kv_wait for r in requests(w)),
    "chunked prompt": lambda w: any(
        r.prompt_len > w[0].max_num_batched_tokens for r in requests(w)
    ),
    "ends at max_model_len": lambda w: any(
        r.prompt_len + r.output_len >= w[0].max_model_len for r in requests(w)
    ),
    "k = 1": lambda w: w[0].num_speculative_tokens == 1,
    "k = 7": lambda w: w[0].num_speculative_tokens == 7,
    "ar": lambda w: w[0].speculator == "ar",
    "mtp": lambda w: w[0].speculator == "mtp",
    "partial acceptance": lambda w: any(
        0 < min(r.accepted, default=0) < w[0].num_speculative_tokens
        for r in requests(w)
    ),
    "async scheduling": lambda w: w[0].async_scheduling,
    "unequal loads": lambda w: len({len(s.requests) for s in w[1]}) > 1,
    "many small requests": lambda w: any(
        sum(r.prompt_len <= 8 for r in s.requests) >= 5 for s in w[1]
    ),
    "four ranks": lambda w: len(w[1]) == 4,
    "prefill throttling": lambda w: w[0].prefill_schedule_interval > 1,
    "long prefill threshold": lambda w: w[0].long_prefill_token_threshold > 0,
}


@pytest.mark.parametrize("edge", sorted(EDGES))
def test_each_edge_is_drawn(edge: str) -> None:
    found = find(workloads(), EDGES[edge], settings=FIND)
    assert EDGES[edge](found)


def test_shrinks_towards_less() -> None:
    smallest = find(workloads(), lambda w: bool(requests(w)), settings=SHRINK)
    options, streams = smallest
    assert len(streams) == 2
    assert len(requests(smallest)) == 1
    assert options.speculator is None
    (request,) = requests(smallest)
    assert (request.arrival, request.prompt_len, request.output_len) == (0, 1, 1)
    assert request.kv_wait == 0


@settings(max_examples=60, database=None, deadline=None, derandomize=True)
@given(workloads())
def test_drawn_workloads_are_valid_and_round_trip(workload: Workload) -> None:
    options, streams = workload
    check_streams(streams, options)
    assert 2 <= len(streams) <= 4
    assert EngineOptions.from_json(json.loads(json.dumps(options.to_json()))) == options
    text = json.dumps(streams_to_json(streams))
    assert streams_from_json(json.loads(text), options) == streams
    for request in requests(workload):
        assert request.arrival < MAX_ITERATIONS
        assert request.prompt_len <= 3 * options.max_num_batched_tokens


def test_options_and_streams_can_be_fixed() -> None:
    fixed = find(
        engine_options(speculators=("mtp",), async_scheduling=True),
        lambda o: True,
        settings=FIND,
    )
    assert fixed.speculator == "mtp" and fixed.async_scheduling
    streams = find(rank_streams(3, EngineOptions()), lambda s: True, settings=FIND)
    assert len(streams) == 3


def test_no_threshold_vllm_asserts_on_is_drawn() -> None:
    """A long-prefill threshold of 1..k cuts a request padded to 1 + k, where
    vLLM's scheduler asserts (and the modelled one refuses): never drawn."""
    with pytest.raises(NoSuchExample):
        find(
            engine_options(speculators=("ar", "mtp")),
            lambda o: 0 < o.long_prefill_token_threshold <= o.num_speculative_tokens,
            settings=FIND,
        )


def test_a_given_options_strategy_is_used_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HypothesisWarning)
        strategy = workloads(options=engine_options(speculators=("mtp",)))
        found = find(strategy, lambda w: True, settings=FIND)
    assert found[0].speculator == "mtp"
