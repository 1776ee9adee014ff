"""What the cascade-attention tests of both V1 profiles share: a decode batch,
stand-in callers that take (and may ignore) a parameter list, a stand-in
mode enum, and 0.12.0's dispatcher branch for cascade attention."""

from __future__ import annotations

import enum
from typing import Any

from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.targets.v1.api import V1API

#: Graphs of every mode up to 32 tokens.
POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16, 32),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=32,
)
#: Two sizes of FULL decode graphs and no PIECEWISE ones: a rank left without
#: FULL has no graph to run.
FULL_DECODES = CapturePolicy(
    capture_sizes=(8, 16), cudagraph_mode="FULL_DECODE_ONLY", max_num_seqs=16
)
#: 0.12.0's dispatcher: ``if not use_cascade_attn:`` and, when the flag is
#: set, the PIECEWISE lookup after it.
DISPATCHER_012 = "v1/cudagraph_dispatcher.py"
CASCADE_BRANCH_012 = (168, 179)


class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


def decodes(reqs: int, **extra: Any) -> RankBatch:
    """A decode of ``reqs`` one-token requests (``extra``: other fields)."""
    return RankBatch(
        num_reqs=reqs,
        num_tokens=reqs,
        uniform_token_count=1,
        max_query_len=1,
        allow_ubatching=True,
        kind="decode",
        **extra,
    )


class _Caller:
    def __init__(self, parameters: tuple[str, ...], ignored: tuple[str, ...]) -> None:
        self.parameters = parameters
        self.ignored = ignored

    def invoke(self, state: Any, arguments: dict[str, Any]) -> tuple[Any, ...]:
        raise AssertionError("not called")


def api_taking(parameters: tuple[str, ...], ignored: tuple[str, ...] = ()) -> V1API:
    """A V1 API whose caller method takes ``parameters`` and never reads
    ``ignored``; calling it fails the test."""
    return V1API(
        caller=_Caller(parameters, ignored),
        parameters=(),
        agreement_fields=(),
        descriptor_fields=(),
        collective="all_reduce",
        tensor_rows=None,
        mode_enum=None,
    )


def cascade_step(profile: str) -> Case:
    """Two ranks decoding 16 requests each under FULL_DECODE_ONLY, the second
    cascading: where vLLM reads the flag it has no graph to run."""
    return Case(
        "step",
        profile,
        FULL_DECODES,
        ((decodes(16), decodes(16, cascade_attn=True)),),
    )
