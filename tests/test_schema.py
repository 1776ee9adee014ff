"""dpsim.cex.schema: the published JSON Schemas agree with the readers they describe.

A file dpsim writes validates; and for every single-field change of such a
file (a field dropped, given a value of the wrong type or past every bound,
or a key added), the schema refuses exactly what dpsim's reader refuses,
except where only the reader can know (a rank index against the rank count).
Without a release: the files are built from dpsim's own records.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dpsim.cex import files, schema
from dpsim.errors import UsageError
from dpsim.lanes.runner import case as runner_case
from dpsim.lanes.runner.case import RunnerCase, RunnerCaseFile
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.properties import PROPERTY_NAMES
from dpsim.records.case import Case, RankBatch, ReuseCall
from dpsim.records.policy import CapturePolicy, Microbatching

TARGET = {
    "label": "vLLM 0.33.0",
    "spec": {"kind": "release", "base": "0.33.0", "runner": "v2"},
    "version": "0.33.0",
    "files": {"vllm.v1.worker.gpu.dp_utils": "0" * 64},
}
VERDICTS = (
    {"property": "no-hang", "phase": "step 0", "ranks": [0, 1], "message": "hang"},
)
#: A policy with every key set, so that every key's schema is exercised.
POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8),
    cudagraph_mode="FULL_AND_PIECEWISE",  # type: ignore[arg-type]
    decode_query_len=2,
    lora_capture_cases=(0, 1),
    varlen_decode=True,
    max_capture_size=8,
    microbatching=Microbatching(),
    drafter=CapturePolicy(capture_sizes=(1, 2), decode_query_len=2),
    encoder_decoder=True,
)
BUSY = RankBatch(
    num_reqs=2,
    num_tokens=4,
    uniform_token_count=2,
    max_query_len=2,
    need_eager=True,
    num_active_loras=1,
    allow_ubatching=True,
    uniform_decode=True,
    allow_skip_drafts=True,
    num_encoder_reqs=1,
    cascade_attn=True,
    kind="decode",
)
IDLE = RankBatch(num_reqs=1, num_tokens=1, kind="dummy")


def _counterexample() -> dict[str, Any]:
    case = Case(
        scenario="drafter",
        profile="contract",
        policy=POLICY,
        steps=((BUSY, IDLE),),
        num_speculative_steps=2,
        reuse_calls=((ReuseCall(2, 3, 1), ReuseCall(1)),),
    )
    written = files.Counterexample(
        target=TARGET,
        case=case,
        choices=(0, 1, 1, 0),
        properties=tuple(PROPERTY_NAMES),
        verdicts=VERDICTS,
        outcome="hang",
        trace={"outcome": "hang"},
        dpsim_version="0.1.0",
    )
    return json.loads(files.encode(written))


def _runner_case() -> dict[str, Any]:
    case = RunnerCase(
        CapturePolicy(capture_sizes=(1, 2, 4, 8), decode_query_len=3),
        EngineOptions(speculator="ar", num_speculative_tokens=2),
        (
            RankStream((RequestScript("a", 0, 5, 3, kv_wait=1, accepted=(1, 2)),)),
            RankStream(),
        ),
        seed=7,
    )
    written = RunnerCaseFile(
        target={**TARGET, "lane_files": {"vllm.v1.engine.core": "1" * 64}},
        case=case,
        properties=("no-hang", "drafter-forwards"),
        verdicts=VERDICTS,
        outcome="hang",
        trace={"outcome": "hang"},
    )
    return json.loads(written.encode())


def _read_counterexample(tmp: Path, data: Any) -> None:
    path = tmp / "file.json"
    path.write_text(json.dumps(data))
    files.read(path)


def _read_runner_case(tmp: Path, data: Any) -> None:
    runner_case.parse(data, tmp / "file.json")


KINDS = {
    "counterexample": (
        _counterexample,
        schema.counterexample_schema,
        _read_counterexample,
    ),
    "runner case": (_runner_case, schema.runner_case_schema, _read_runner_case),
}
#: Where the reader alone can judge a change (the schemas' descriptions say
#: so): a rank index against the rank count, and rules across fields.
READER_ONLY = {
    "choices/": "each choice is a rank, below the case's rank count",
    "verdicts/0/ranks/": "each is a rank, below the case's rank count",
    "case/options/speculator": "speculator and num_speculative_tokens go together",
    "case/options/num_speculative_tokens": "... and num_speculative_tokens too",
    "case/policy/decode_query_len": "the policy's is 1 + num_speculative_tokens",
}


def _changes(data: Any, path: str = "") -> Iterator[tuple[str, Callable[[Any], None]]]:
    """Every single-field change of ``data``: (what, a function making it)."""
    if isinstance(data, dict):
        items: list[tuple[Any, Any]] = list(data.items())
        yield f"{path}+unknown", lambda doc: _at(doc, path).__setitem__("zz_new", 1)
    elif isinstance(data, list):
        items = list(enumerate(data))
    else:
        return
    for key, value in items:
        where = f"{path}{key}"
        if isinstance(data, dict):
            yield f"{where}-dropped", lambda doc, p=path, k=key: _at(doc, p).pop(k)
        wrong = 7 if isinstance(value, str) else "seven"
        for label, replacement in (("wrong type", wrong), ("past bounds", 2**31)):
            if label == "past bounds" and not (
                isinstance(value, int) and not isinstance(value, bool)
            ):
                continue
            yield (
                f"{where} {label}",
                lambda doc, p=path, k=key, r=replacement: _at(doc, p).__setitem__(k, r),
            )
        if where != "trace":
            yield from _changes(value, f"{where}/")


def _at(doc: Any, path: str) -> Any:
    for part in filter(None, path.split("/")):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_dpsim_writes_validates_against_its_published_schema(
    kind: str, tmp_path: Path
) -> None:
    make, schema_of, read = KINDS[kind]
    published = schema_of()
    jsonschema.Draft202012Validator.check_schema(published)
    data = make()
    read(tmp_path, data)
    assert list(jsonschema.Draft202012Validator(published).iter_errors(data)) == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_schema_refuses_a_changed_field_exactly_when_the_reader_does(
    kind: str, tmp_path: Path
) -> None:
    make, schema_of, read = KINDS[kind]
    validator = jsonschema.Draft202012Validator(schema_of())
    valid = make()
    disagreements = []
    changes = list(_changes(valid))
    assert len(changes) > 100  # every field of the file is changed in turn
    for what, change in changes:
        data = copy.deepcopy(valid)
        change(data)
        try:
            read(tmp_path, data)
            reader_refuses = False
        except UsageError:
            reader_refuses = True
        schema_refuses = not validator.is_valid(data)
        if reader_refuses == schema_refuses:
            continue
        if reader_refuses and what.startswith(tuple(READER_ONLY)):
            continue
        disagreements.append(
            f"{what}: reader {'refuses' if reader_refuses else 'accepts'}, "
            f"schema {'refuses' if schema_refuses else 'accepts'}"
        )
    assert disagreements == []
