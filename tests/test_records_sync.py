"""dpsim.records.sync: sync and oracle records keep the trace's JSON form, and
refuse what is not one."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import (
    EXPECT_EVENT,
    SYNC_EVENT,
    Agreement,
    Choice,
    Descriptor,
    ExpectRecord,
    SyncRecord,
    expect_records,
    recorded_syncs,
    sync_records,
)
from dpsim.records.trace import Event

BATCH = RankBatch(num_reqs=3, num_tokens=3, uniform_token_count=1, kind="decode")
DESCRIPTOR = Descriptor(CudagraphMode.FULL, 4, 4, uniform_token_count=1)
AGREEMENT = Agreement((4, 4), uniform_token_count=1, eager=False)
RETURNED = SyncRecord("step 0", BATCH, False, False, DESCRIPTOR, AGREEMENT)
RAISED = SyncRecord("step 0", BATCH, True, False, error="AssertionError: padding")


def test_a_returned_sync_is_written_key_for_key_as_the_trace_always_held_it() -> None:
    # Key for key and in the order the scenarios wrote sync events before the
    # records were typed (the replay lane's logs keep it).
    assert json.dumps(RETURNED.to_json()) == (
        '{"phase": "step 0", "inputs": {"num_reqs": 3, "num_tokens": 3, '
        '"uniform_token_count": 1, "max_query_len": null, "need_eager": false, '
        '"num_active_loras": 0, "allow_ubatching": false, "uniform_decode": false, '
        '"allow_skip_drafts": false, "kind": "decode"}, "reused": false, '
        '"solo": false, "descriptor": {"cg_mode": "FULL", "num_tokens": 4, '
        '"num_reqs": 4, "uniform_token_count": 1, "max_query_len": null, '
        '"num_active_loras": 0, "num_ubatches": 1}, "agreement": '
        '{"num_tokens_across_dp": [4, 4], "uniform_token_count": 1, '
        '"eager": false, "num_reqs": null, "skip_drafts": null}}'
    )


def test_a_raised_sync_has_an_error_and_no_descriptor_or_agreement_keys() -> None:
    assert RAISED.raised and not RETURNED.raised
    assert RAISED.to_json() == {
        "phase": "step 0",
        "inputs": BATCH.to_dict(),
        "reused": True,
        "solo": False,
        "error": "AssertionError: padding",
    }


@pytest.mark.parametrize(
    "record",
    [RETURNED, RAISED, SyncRecord("solo 1", BATCH, False, True, DESCRIPTOR, None)],
)
def test_a_sync_record_reads_back_what_it_wrote(record: SyncRecord) -> None:
    back = SyncRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert back == record
    # The mode comes back as the enum member, not merely an equal string.
    assert back.descriptor is None or type(back.descriptor.cg_mode) is CudagraphMode


def test_a_sync_record_is_either_returned_or_raised() -> None:
    with pytest.raises(ValueError, match="either a descriptor"):
        SyncRecord("step 0", BATCH, False, False)
    with pytest.raises(ValueError, match="either a descriptor"):
        SyncRecord("step 0", BATCH, False, False, DESCRIPTOR, error="X: y")


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in data.items() if name != key}


@pytest.mark.parametrize(
    "payload",
    [
        _without(RETURNED.to_json(), "descriptor"),
        _without(RETURNED.to_json(), "solo"),
        {**RETURNED.to_json(), "error": "X: y"},
        {**RETURNED.to_json(), "extra": 1},
        {**RETURNED.to_json(), "inputs": {**BATCH.to_dict(), "tokens": 3}},
        {**RETURNED.to_json(), "descriptor": {"cg_mode": "FULL"}},
        {
            **RETURNED.to_json(),
            "descriptor": {**DESCRIPTOR.to_json(), "cg_mode": "full"},
        },
        {**RETURNED.to_json(), "agreement": {"eager": True}},
        {**RAISED.to_json(), "agreement": None},
        {**RAISED.to_json(), "error": None},
        "not a record",
    ],
)
def test_a_payload_that_is_not_a_sync_record_is_refused_by_name(payload: Any) -> None:
    with pytest.raises(ValueError, match=r"^malformed sync record: "):
        SyncRecord.from_json(payload)


def test_an_expect_record_keeps_the_oracles_json_and_refuses_others() -> None:
    record = ExpectRecord("step 0", (Choice(CudagraphMode.FULL, 4, 1, 3, 1, None),) * 2)
    written = record.to_json()
    assert written["choices"][0] == {
        "cg_mode": "FULL",
        "num_tokens": 4,
        "num_ubatches": 1,
        "largest": 3,
        "uniform": 1,
        "bound": None,
    }
    assert ExpectRecord.from_json(json.loads(json.dumps(written))) == record
    for choice in ({"cg_mode": "FULL"}, {**written["choices"][0], "cg_mode": "BEST"}):
        with pytest.raises(ValueError, match=r"^malformed expect record: "):
            ExpectRecord.from_json({"phase": "step 0", "choices": [choice]})


def test_a_ranks_events_give_its_syncs_and_oracle_in_order_and_nothing_else() -> None:
    expect = ExpectRecord("step 0", (Choice(CudagraphMode.FULL, 4, 1, 3, 1, None),))
    events = [
        Event(EXPECT_EVENT, 0, expect.to_json()),
        Event(SYNC_EVENT, 0, RETURNED.to_json()),
        Event("note", 1, {"anything": True}),
        Event(SYNC_EVENT, 2, RAISED.to_json()),
    ]
    assert list(recorded_syncs(events)) == [(0, RETURNED), (2, RAISED)]
    assert sync_records(events) == [RETURNED, RAISED]
    assert list(expect_records(events)) == [expect]


def test_a_v1_agreement_carries_the_synced_mode_and_microbatching() -> None:
    agreement = Agreement((32, 32), cg_mode=CudagraphMode.PIECEWISE, ubatch=False)
    written = agreement.to_json()
    assert list(written)[-2:] == ["cg_mode", "ubatch"]
    assert (written["cg_mode"], written["ubatch"]) == ("PIECEWISE", False)
    back = Agreement.from_json(json.loads(json.dumps(written)))
    assert back == agreement and type(back.cg_mode) is CudagraphMode
    # Only what is set is written: 0.11-0.12 sync no mode.
    assert "cg_mode" not in Agreement((4, 4), ubatch=True).to_json()


def test_a_recorded_sync_reads_back_as_the_record_it_was_written_from() -> None:
    # The judge reads back the very record a rank wrote, not a parse of it,
    # while the payload is the JSON the trace always held, written when read.
    expect = ExpectRecord("step 0", (Choice(CudagraphMode.FULL, 4, 1, 3, 1, None),))
    events = [
        Event.of(EXPECT_EVENT, 0, expect.to_event()),
        Event.of(SYNC_EVENT, 1, RETURNED.to_event()),
    ]
    assert sync_records(events)[0] is RETURNED
    assert next(expect_records(events)) is expect
    assert "payload" not in events[1].__dict__  # not written for the judge
    assert events == [
        Event(EXPECT_EVENT, 0, expect.to_json()),
        Event(SYNC_EVENT, 1, RETURNED.to_json()),
    ]
    assert type(events[1].payload) is dict
    assert json.dumps(events[1].payload) == json.dumps(RETURNED.to_json())
    assert events[1].to_dict()["payload"] == RETURNED.to_json()


@pytest.mark.parametrize(
    "travel",
    [lambda event: pickle.loads(pickle.dumps(event)), copy.deepcopy, copy.copy],
)
def test_a_recorded_sync_travels_as_plain_json_and_is_parsed_there(
    travel: Callable[[Event], Event],
) -> None:
    event = Event.of(SYNC_EVENT, 0, RETURNED.to_event())
    moved = travel(event)
    assert moved == event and moved.kept is None
    assert type(moved.payload) is dict and moved.payload == RETURNED.to_json()
    (record,) = sync_records([moved])
    assert record == RETURNED and record is not RETURNED


@dataclass(frozen=True)
class _OwnBatch(RankBatch):
    pass


def test_a_sync_whose_inputs_would_read_back_otherwise_is_parsed() -> None:
    # Any batch but a RankBatch itself reads back as a RankBatch: keeping the
    # record would hand the judge something parsing would not give.
    inputs = _OwnBatch(num_reqs=3, num_tokens=3)
    record = SyncRecord("step 0", inputs, False, False, DESCRIPTOR, AGREEMENT)
    (read,) = sync_records([Event.of(SYNC_EVENT, 0, record.to_event())])
    assert read is not record and type(read.inputs) is RankBatch


def test_the_fast_constructors_make_what_the_constructors_make() -> None:
    made = [
        (
            Descriptor.unchecked(CudagraphMode.FULL, 4, 4, 1, None, 0, 1),
            Descriptor(CudagraphMode.FULL, 4, 4, uniform_token_count=1),
        ),
        (
            Agreement.unchecked((4, 4), 1, False, None, None),
            Agreement((4, 4), uniform_token_count=1, eager=False),
        ),
        (
            Choice.unchecked(CudagraphMode.FULL, 4, 1, 3, 1, None),
            Choice(CudagraphMode.FULL, 4, 1, 3, 1, None),
        ),
        (
            SyncRecord.returned("step 0", BATCH, False, False, DESCRIPTOR, AGREEMENT),
            RETURNED,
        ),
    ]
    for fast, slow in made:
        assert fast == slow and repr(fast) == repr(slow)
        assert list(fast.__dict__) == list(slow.__dict__)  # same pickle, same order
