"""How the adapter calls a version's sync: which arguments, passed how."""

from __future__ import annotations

import sys
from typing import Any

from standin_sync import sync_api

from dpsim.records.case import SyncInputs
from dpsim.targets.adapters import SyncAPI, dispatch, dispatcher


def _api(parameters: tuple[str, ...], seen: list[Any]) -> SyncAPI:
    def sync(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        # The frame that called the sync, for the test below.
        seen.append((args, kwargs, sys._getframe(1)))
        return "descriptor", "agreement"

    return sync_api(parameters, sync)


LEADING = ("cudagraph_manager", "num_reqs", "num_tokens", "uniform_token_count")


def test_the_sync_gets_what_its_signature_takes_and_the_agreement_only_to_reuse() -> (
    None
):
    seen: list[Any] = []
    api = _api(
        (
            *LEADING,
            "dp_size",
            "dp_rank",
            "max_query_len",
            "num_active_loras",
            "dp_sync",
        ),
        seen,
    )
    inputs = SyncInputs(3, 8, 2, max_query_len=2, num_active_loras=1)
    assert api.call("m", inputs, 4, 1) == ("descriptor", "agreement")
    api.call("m", inputs, 4, 1, parallel_config="config", reuse="earlier")
    assert [(args, kwargs) for args, kwargs, _ in seen] == [
        (("m", 3, 8, 2, 4, 1), {"max_query_len": 2, "num_active_loras": 1}),
        (
            ("m", 3, 8, 2, 4, 1),
            {"max_query_len": 2, "num_active_loras": 1, "dp_sync": "earlier"},
        ),
    ]


def test_a_sync_taking_the_parallel_config_gets_it_by_name() -> None:
    seen: list[Any] = []
    api = _api((*LEADING, "dp_size", "dp_rank", "parallel_config"), seen)
    api.call("m", SyncInputs(1, 1), 2, 0, parallel_config="config")
    assert [(args, kwargs) for args, kwargs, _ in seen] == [
        (("m", 1, 1, None, 2, 0), {"parallel_config": "config"})
    ]


def test_the_sync_is_called_from_python_not_through_a_star_star_call() -> None:
    # A call through ``**kwargs`` would come from SyncAPI.call itself, and
    # start a second C eval frame on every rank's stack; the call made once
    # per version comes from its own small function.
    seen: list[Any] = []
    api = _api((*LEADING, "dp_size", "dp_rank", "num_active_loras"), seen)
    api.call("m", SyncInputs(1, 1), 2, 0)
    caller = seen[0][2]
    assert caller.f_code is not SyncAPI.call.__code__
    assert caller.f_back.f_code is SyncAPI.call.__code__


class _OldTable:
    """A release's manager before LoRA counts and query bounds."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def dispatch(
        self, num_reqs: int, num_tokens: int, uniform_token_count: int | None
    ) -> str:
        self.asked.append((num_reqs, num_tokens, uniform_token_count))
        return "old"


class _NewTable:
    """A release's manager that requires a LoRA count (0.24+)."""

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def dispatch(
        self,
        num_reqs: int,
        num_tokens: int,
        uniform_token_count: int | None,
        num_active_loras: int,
        max_query_len: int | None = None,
    ) -> str:
        self.asked.append(
            (num_reqs, num_tokens, uniform_token_count, num_active_loras, max_query_len)
        )
        return "new"


def test_a_dispatcher_passes_what_the_release_takes_and_a_required_lora_count() -> None:
    old, new = _OldTable(), _NewTable()
    for table in (old, new):
        ask = dispatcher(table, "num_active_loras", "max_query_len")
        ask(table, 2, 8, None, 1, 4)
        dispatch(table, 2, 8, None, num_active_loras=1, max_query_len=4)
        # Not given, but required from 0.24: 0, as a LoRA-free caller passes.
        dispatcher(table, "max_query_len")(table, 3, 9, 3, 3)
        dispatch(table, 3, 9, 3, max_query_len=3)
    assert old.asked == [(2, 8, None)] * 2 + [(3, 9, 3)] * 2
    assert new.asked == [(2, 8, None, 1, 4)] * 2 + [(3, 9, 3, 0, 3)] * 2
