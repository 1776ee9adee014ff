"""The runner lane's sync recorder: each real sync call becomes a SyncRecord.

Fast tests call the recorder around a sync written here (not vLLM's) from
callers compiled with vLLM-like file names, so the caller detection reads the
same frames it reads in a run; the release-marked test wraps a cached
release's real ``dispatch_cg_and_sync_dp``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from dpsim.lanes.runner.syncs import (
    DRAFTER_FORWARD_EVENT,
    Phases,
    record_drafter_forward,
    recording_sync,
)
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import SYNC_EVENT, SyncRecord, sync_records
from dpsim.scenarios.run import manager_for, tables_for
from dpsim.sim import simulate
from dpsim.targets import adapters


class _Mode(enum.Enum):
    NONE = 0
    FULL = 2


@dataclass
class _Desc:
    cg_mode: _Mode
    num_tokens: int
    num_reqs: int | None


@dataclass
class _State:
    num_tokens_across_dp: torch.Tensor
    uniform_token_count: int | None
    eager: bool


def fake_sync(
    cudagraph_manager: Any,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    dp_size: int,
    dp_rank: int,
    max_query_len: int | None = None,
    need_eager: bool = False,
    dp_sync_state: Any = None,
) -> tuple[_Desc, _State | None]:
    """Pads to 8 tokens, or raises for a negative count."""
    if num_tokens < 0:
        raise ValueError("negative")
    if dp_sync_state is not None:
        return _Desc(_Mode.FULL, 8, num_reqs), dp_sync_state
    counts = torch.tensor([8] * dp_size)
    return _Desc(_Mode.FULL, 8, num_reqs), _State(counts, uniform_token_count, False)


class _Target:
    class api:  # what the recorder reads of a loaded target
        describe = staticmethod(adapters.describe)
        agreement = staticmethod(adapters.agreement_of)


_CALLERS = """
def execute_model(sync, n):
    return sync(None, 1, n, None, 2, 0, max_query_len=n)

def _dummy_run(sync):
    return execute_model(sync, 1)

def propose(sync, state):
    sync(None, 1, 2, 1, 2, 0, dp_sync_state=state)
    sync(None, 1, 1, 1, 2, 0, dp_sync_state=state)
"""


def _callers(tmp_path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fake callers, compiled as a model runner's and a speculator's."""
    runner: dict[str, Any] = {}
    exec(compile(_CALLERS, str(tmp_path / "gpu" / "model_runner.py"), "exec"), runner)
    drafter: dict[str, Any] = {}
    spec = tmp_path / "gpu" / "spec_decode" / "ar" / "speculator.py"
    exec(compile(_CALLERS, str(spec), "exec"), drafter)
    return runner, drafter


def _run(program: Callable[[int], Any], ranks: int = 1) -> list[list[SyncRecord]]:
    result = simulate(program, ranks=ranks)
    return [sync_records(trace.events) for trace in result.ranks]


def test_a_step_its_drafter_and_a_dummy_are_named_by_forward_step(
    tmp_path: Any,
) -> None:
    runner, drafter = _callers(tmp_path)

    def program(rank: int) -> None:
        sync = recording_sync(_Target(), fake_sync, Phases())
        _, state = runner["execute_model"](sync, 5)
        drafter["propose"](sync, state)
        runner["_dummy_run"](sync)

    (records,) = _run(program)
    assert [r.phase for r in records] == [
        "iter 1 model",
        "iter 1 drafter prefill",
        "iter 1 drafter decode",
        "iter 2 model",
    ]
    step, prefill, decode, dummy = records
    assert step.inputs.num_tokens == 5 and step.inputs.max_query_len == 5
    assert step.inputs.kind == "batch" and not step.reused
    assert step.descriptor is not None and step.descriptor.num_tokens == 8
    assert step.agreement is not None
    assert step.agreement.num_tokens_across_dp == (8, 8)
    assert prefill.reused and decode.reused and prefill.inputs.kind == "decode"
    assert dummy.inputs.kind == "dummy"


def test_the_recorder_keeps_the_real_signature_and_results() -> None:
    import inspect

    sync = recording_sync(_Target(), fake_sync, Phases())
    assert inspect.signature(sync) == inspect.signature(fake_sync)

    def program(rank: int) -> list[int]:
        descriptor, state = sync(None, 2, 3, None, 1, 0)
        return [descriptor.num_tokens, int(state.num_tokens_across_dp[0])]

    result = simulate(program, ranks=1)
    assert result.returns() == [[8, 8]]


def test_a_raising_sync_is_recorded_and_raised() -> None:
    def program(rank: int) -> None:
        sync = recording_sync(_Target(), fake_sync, Phases())
        sync(None, 1, -1, None, 1, 0)

    result = simulate(program, ranks=1)
    (records,) = [sync_records(trace.events) for trace in result.ranks]
    assert [r.error for r in records] == ["ValueError: negative"]
    assert result.ranks[0].state == "raised"


def test_drafter_forwards_leave_events() -> None:
    def program(rank: int) -> None:
        record_drafter_forward(3)

    result = simulate(program, ranks=1)
    events = result.ranks[0].events
    assert [(e.kind, e.payload) for e in events] == [
        (DRAFTER_FORWARD_EVENT, {"tokens": 3})
    ]
    assert SYNC_EVENT not in {e.kind for e in events}


def test_phases_number_later_drafter_syncs() -> None:
    phases = Phases()
    assert phases("drafter") == "iter 0 drafter prefill"
    assert phases("model") == "iter 1 model"
    names = [phases("drafter") for _ in range(4)]
    assert names[2:] == ["iter 1 drafter decode 2", "iter 1 drafter decode 3"]


@pytest.mark.release
def test_the_real_sync_of_0_33_is_recorded_on_every_rank(
    release: Callable[[str], Any],
) -> None:
    target = release("0.33.0")
    policy = CapturePolicy(capture_sizes=(1, 2, 4, 8))
    manager = manager_for(target, tables_for(target, policy, 2).target)
    real = target.api._sync

    def program(rank: int) -> None:
        sync = recording_sync(target, real, Phases())
        tokens = 3 if rank == 0 else 1
        sync(manager, 1, tokens, None, 2, rank, max_query_len=tokens)

    records = _run(program, ranks=2)
    assert [r[0].phase for r in records] == ["iter 1 model"] * 2
    agreements = {r[0].agreement for r in records}
    assert len(agreements) == 1
    (agreement,) = agreements
    assert agreement is not None and len(agreement.num_tokens_across_dp) == 2


_DERIVING = """
def propose(sync, state):
    sync(None, 1, 8, None, 2, 0, dp_sync_state=state)
    derived = type(state)(state.num_tokens_across_dp, 1, False)
    sync(None, 1, 8, 1, 2, 0, dp_sync_state=derived)
"""


def test_a_derived_agreement_handed_in_is_noted_for_reuse(tmp_path: Any) -> None:
    """0.32+'s drafter decode hands the sync an agreement it derived from
    the target's: the recorder notes it, and `reuse` judges the call against
    it (not against the target's), so the real code is no false alarm."""
    from dpsim.properties import PROPERTIES, judge
    from dpsim.records.sync import REUSE_GIVEN_EVENT

    runner, _ = _callers(tmp_path)
    drafter: dict[str, Any] = {}
    spec = tmp_path / "gpu" / "spec_decode" / "ar" / "derive.py"
    exec(compile(_DERIVING, str(spec), "exec"), drafter)

    def program(rank: int) -> None:
        sync = recording_sync(_Target(), fake_sync, Phases())
        _, state = runner["execute_model"](sync, 5)
        drafter["propose"](sync, state)

    result = simulate(program, ranks=1)
    kinds = [event.kind for event in result.ranks[0].events]
    assert kinds == [SYNC_EVENT, SYNC_EVENT, REUSE_GIVEN_EVENT, SYNC_EVENT]
    case = _RunnerLikeCase()
    assert judge(case, result, [PROPERTIES["reuse"]]) == []


class _RunnerLikeCase:
    scenario = "runner"
    policy = None
    dp_size = 1


def test_a_sync_taking_star_args_is_refused_each_time() -> None:
    # The signature is read once per function (cached); a refusal is not.
    def loose(*args: Any) -> None:
        return None

    for _ in range(2):
        with pytest.raises(TypeError, match="loose takes \\*args or \\*\\*kwargs"):
            recording_sync(_Target(), loose, Phases())
