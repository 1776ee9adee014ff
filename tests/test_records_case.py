"""dpsim.records.case: a batch's encoder requests travel only when there are some."""

from __future__ import annotations

import json

from dpsim.cex.validate import _batch
from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import Descriptor, SyncRecord

PREFILL = RankBatch(num_reqs=2, num_tokens=40, max_query_len=20, kind="prefill")
WITH_ENCODERS = RankBatch(
    num_reqs=2, num_tokens=40, max_query_len=20, num_encoder_reqs=2, kind="prefill"
)


def test_no_encoder_requests_leave_the_batch_mapping_as_it_was() -> None:
    # Every case file and trace from before the field (and every V2 one).
    assert "num_encoder_reqs" not in PREFILL.to_dict()
    assert list(PREFILL.to_dict())[-1] == "kind"
    assert RankBatch.from_dict(PREFILL.to_dict()) == PREFILL


def test_encoder_requests_are_written_and_read_back() -> None:
    data = WITH_ENCODERS.to_dict()
    assert data["num_encoder_reqs"] == 2
    assert RankBatch.from_dict(json.loads(json.dumps(data))) == WITH_ENCODERS
    _batch(data, "steps[0][0]")  # a counterexample file may carry it


def test_a_sync_record_reads_back_inputs_with_and_without_encoder_requests() -> None:
    descriptor = Descriptor(CudagraphMode.PIECEWISE, 48, 2)
    for batch in (PREFILL, WITH_ENCODERS):
        record = SyncRecord("step 0", batch, False, False, descriptor, None)
        back = SyncRecord.from_json(json.loads(json.dumps(record.to_json())))
        assert back == record
