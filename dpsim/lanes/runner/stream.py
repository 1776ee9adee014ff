"""What the runner lane's modelled scheduler sees: engine options and request streams.

Plain frozen data, torch-free, written to and read from JSON as part of a
runner case. A :class:`RankStream` is what one DP rank's engine is asked to
serve: each :class:`RequestScript` says when a request reaches the engine's
input queue (``arrival``, in that rank's engine-loop iterations), how long its
prompt and output are, how many iterations it waits for a remote KV transfer
(``kv_wait``: held with 0 tokens scheduled), and how many of the drafts
scheduled for it are accepted at each verification (``accepted``, cycled).
:class:`EngineOptions` are the engine, scheduler and speculative settings the
lane's real code branches on.

JSON form: every field is always written, in declaration order, so a file
says everything explicitly and is byte-stable; reading refuses unknown keys
and fills a missing optional field with its default (so a field added later
reads old files). Every value is checked when the object is made (by
``from_json`` or in code), and a bad one is refused in one line naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeVar

from dpsim.errors import UsageError
from dpsim.fields import (
    Field,
    boolean,
    described,
    integer,
    object_schema,
    schema_of,
)
from dpsim.limits import (
    MAX_INT,
    MAX_NUM_SEQS,
    MAX_RANK_STEPS,
    MAX_RANKS,
    MAX_SPECULATIVE_TOKENS,
    MAX_WORKLOAD_REQUESTS,
    shown,
)

__all__ = [
    "EXECUTORS",
    "SPECULATORS",
    "V1_SPECULATORS",
    "EngineOptions",
    "RankStream",
    "RequestScript",
    "speculators_of",
    "streams_from_json",
    "streams_to_json",
]

#: The speculators the lane drives: the target-dependent autoregressive one
#: (0.29's ``spec_decode/autoregressive``, 0.33's ``target_dependent_ar``) and MTP.
SPECULATORS = ("ar", "mtp")
#: The drafters the lane drives on the V1 model runner: its ``EagleProposer``
#: with method ``eagle`` or ``mtp``.
V1_SPECULATORS = ("eagle", "mtp")
#: Every speculator name an engine's options may carry (a case refuses one
#: its model runner does not have: :func:`speculators_of`).
_ALL_SPECULATORS = tuple(dict.fromkeys((*SPECULATORS, *V1_SPECULATORS)))
#: The executor backends an engine may run (``distributed_executor_backend``):
#: in-process, or worker processes (the default with DP, ``ParallelConfig``).
EXECUTORS = ("uni", "mp")
#: vLLM's default ``dp_sync_interval`` (ParallelConfig, 0.30+).
DEFAULT_DP_SYNC_INTERVAL = 16
#: Largest model length a case may name; far beyond what a case needs, it
#: keeps token arithmetic small.
MAX_MODEL_LEN = 1 << 20
#: Longest ``accepted`` cycle a request may carry.
MAX_ACCEPTED_ENTRIES = 4096


@dataclass(frozen=True)
class EngineOptions:
    """The engine's and scheduler's settings that the lane's real code branches on.

    ``async_scheduling`` puts the engine on ``step_with_batch_queue`` (a batch
    queue of 2). ``dp_sync_interval`` is how often the engine loop's
    unfinished-requests all-reduce runs (0.30+'s ``ParallelConfig``); vLLM
    0.29 ignores it (its interval is a hard-coded 32, with no step-1 sync).
    ``prefill_schedule_interval`` > 1 makes the DP engine throttle prefills to
    steps where its step counter is a multiple of it. ``speculator`` and
    ``num_speculative_tokens`` (k) go together: both set or neither.
    ``long_prefill_token_threshold`` (0: off) caps one request's chunk when
    more than one request is eligible, as vLLM's scheduler does.
    ``executor`` is the engine's executor backend (:data:`EXECUTORS`):
    ``uni`` (``UniProcExecutor``) or ``mp`` (``MultiprocExecutor``, what a DP
    deployment gets by default), whose step futures 0.34's engine polls,
    handling new requests while a step runs (:mod:`.engine` says how it is
    modelled).
    """

    async_scheduling: bool = False
    dp_sync_interval: int = DEFAULT_DP_SYNC_INTERVAL
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64
    max_model_len: int = 256
    long_prefill_token_threshold: int = 0
    prefill_schedule_interval: int = 1
    speculator: str | None = None
    num_speculative_tokens: int = 0
    executor: str = "uni"

    def __post_init__(self) -> None:
        _check(self, OPTION_FIELDS, "engine options")
        if (self.speculator is None) != (self.num_speculative_tokens == 0):
            raise UsageError(
                "engine options: speculator and num_speculative_tokens go together "
                f"(speculator {shown(self.speculator)}, num_speculative_tokens "
                f"{self.num_speculative_tokens})"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's SchedulerConfig refuses this too.
            raise UsageError(
                f"engine options: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if self.max_num_batched_tokens <= self.num_speculative_tokens:
            raise UsageError(
                f"engine options: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                "must exceed num_speculative_tokens "
                f"({self.num_speculative_tokens}): no decode would fit"
            )

    @property
    def decode_query_len(self) -> int:
        """Tokens a decode step schedules for one request: 1 + k."""
        return 1 + self.num_speculative_tokens

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping of every field."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any) -> EngineOptions:
        return _from_json(cls, data, "engine options")


def speculators_of(runner: str) -> tuple[str, ...]:
    """The speculators the lane drives on ``runner``'s model runner."""
    return V1_SPECULATORS if runner == "v1" else SPECULATORS


def _executor(value: Any) -> str | None:
    if isinstance(value, str) and value in EXECUTORS:
        return None
    return f"must be one of {', '.join(EXECUTORS)}, got {shown(value)}"


def _speculator(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value in _ALL_SPECULATORS):
        return None
    return f"must be one of {', '.join(_ALL_SPECULATORS)} or null, got {shown(value)}"


described(_executor, {"enum": list(EXECUTORS)})
described(_speculator, {"enum": [*_ALL_SPECULATORS, None]})


OPTION_FIELDS = (
    Field("async_scheduling", boolean),
    Field("dp_sync_interval", integer(1, MAX_RANK_STEPS)),
    Field("max_num_seqs", integer(1, MAX_NUM_SEQS)),
    Field("max_num_batched_tokens", integer(1, MAX_INT)),
    Field("max_model_len", integer(2, MAX_MODEL_LEN)),
    Field("long_prefill_token_threshold", integer(0, MAX_INT)),
    Field("prefill_schedule_interval", integer(1, MAX_RANK_STEPS)),
    Field("speculator", _speculator),
    Field("num_speculative_tokens", integer(0, MAX_SPECULATIVE_TOKENS)),
    Field("executor", _executor),
)


@dataclass(frozen=True)
class RequestScript:
    """One request as the modelled scheduler plays it.

    ``arrival``: the rank-local engine-loop iteration (0-based) at whose input
    poll the request is in the engine's input queue. ``output_len`` is the
    request's ``max_tokens``; it also stops at ``max_model_len`` (vLLM's
    ``check_stop``), whichever comes first. ``kv_wait``: iterations the request
    spends waiting for a remote KV transfer (WAITING_FOR_REMOTE_KVS) before
    its prefill can be scheduled; the engine has it but schedules 0 tokens for
    it. ``accepted``: drafts accepted at each verification, cycled; an entry
    above the drafts scheduled that step means all of them; empty: every
    draft is accepted.
    """

    req_id: str
    arrival: int
    prompt_len: int
    output_len: int
    kv_wait: int = 0
    accepted: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.req_id, str) or not _req_id_ok(self.req_id):
            raise UsageError(
                f"request: req_id must be 1-64 letters, digits, '-' or '_', "
                f"got {shown(self.req_id)}"
            )
        _check(self, REQUEST_FIELDS, f"request {self.req_id}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready mapping of every field (``accepted`` as a list)."""
        return _to_json(self)

    @classmethod
    def from_json(cls, data: Any) -> RequestScript:
        if isinstance(data, Mapping) and isinstance(data.get("accepted"), list):
            data = {**data, "accepted": tuple(data["accepted"])}
        return _from_json(cls, data, "request")


def _req_id_ok(text: str) -> bool:
    return 0 < len(text) <= 64 and all(
        c.isascii() and (c.isalnum() or c in "-_") for c in text
    )


#: What :func:`_req_id_ok` accepts, as the published schema spells it.
REQ_ID_PATTERN = "^[A-Za-z0-9_-]{1,64}$"


#: One verification's accepted drafts.
_ACCEPTED_ENTRY = integer(0, MAX_SPECULATIVE_TOKENS)


def _accepted(value: Any) -> str | None:
    if not isinstance(value, tuple):
        return f"expected a list of integers, got {shown(value)}"
    if len(value) > MAX_ACCEPTED_ENTRIES:
        return f"{len(value):,} entries; at most {MAX_ACCEPTED_ENTRIES:,} allowed"
    for entry in value:
        problem = _ACCEPTED_ENTRY(entry)
        if problem is not None:
            return f"every entry {problem}"
    return None


described(
    _accepted,
    {
        "type": "array",
        "items": schema_of(_ACCEPTED_ENTRY),
        "maxItems": MAX_ACCEPTED_ENTRIES,
    },
)


REQUEST_FIELDS = (
    Field("arrival", integer(0, MAX_RANK_STEPS)),
    Field("prompt_len", integer(1, MAX_MODEL_LEN)),
    Field("output_len", integer(1, MAX_MODEL_LEN)),
    Field("kv_wait", integer(0, MAX_RANK_STEPS)),
    Field("accepted", _accepted),
)


@dataclass(frozen=True)
class RankStream:
    """The requests one DP rank's engine receives, in arrival order."""

    requests: tuple[RequestScript, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple) or not all(
            isinstance(request, RequestScript) for request in self.requests
        ):
            raise UsageError("rank stream: requests must be a list of requests")
        if len(self.requests) > MAX_WORKLOAD_REQUESTS:
            raise UsageError(
                f"rank stream: {len(self.requests):,} requests; "
                f"at most {MAX_WORKLOAD_REQUESTS:,} allowed"
            )
        arrivals = [request.arrival for request in self.requests]
        if arrivals != sorted(arrivals):
            raise UsageError("rank stream: requests must be listed in arrival order")
        _unique_ids(self.requests)

    def check_for(self, options: EngineOptions) -> None:
        """Refuse a request the engine would refuse at input (its prompt leaves
        no room for one output token within ``max_model_len``)."""
        for request in self.requests:
            if request.prompt_len >= options.max_model_len:
                raise UsageError(
                    f"request {request.req_id}: prompt_len ({request.prompt_len}) must "
                    f"be below max_model_len ({options.max_model_len})"
                )

    def to_json(self) -> dict[str, Any]:
        return {"requests": [request.to_json() for request in self.requests]}

    @classmethod
    def from_json(cls, data: Any) -> RankStream:
        if not isinstance(data, Mapping):
            raise UsageError(f"rank stream: expected a mapping, got {shown(data)}")
        unknown = set(data) - {"requests"}
        if unknown:
            raise UsageError(f"rank stream: unknown keys: {', '.join(sorted(unknown))}")
        requests = data.get("requests", [])
        if not isinstance(requests, list):
            raise UsageError(
                f"rank stream: requests must be a list, got {shown(requests)}"
            )
        return cls(tuple(RequestScript.from_json(request) for request in requests))


def streams_to_json(streams: Sequence[RankStream]) -> list[dict[str, Any]]:
    """Per-rank streams as JSON-ready data (one entry per rank)."""
    return [stream.to_json() for stream in streams]


def streams_from_json(data: Any, options: EngineOptions) -> tuple[RankStream, ...]:
    """Per-rank streams read back, checked against ``options`` and each other
    (request ids are unique across ranks, so a trace names each once)."""
    if not isinstance(data, list) or not data:
        raise UsageError(
            f"streams: expected a list with one stream per rank, got {shown(data)}"
        )
    if len(data) > MAX_RANKS:
        raise UsageError(f"streams: {len(data):,} ranks; at most {MAX_RANKS:,} allowed")
    streams = tuple(RankStream.from_json(stream) for stream in data)
    check_streams(streams, options)
    return streams


def options_schema() -> dict[str, Any]:
    """The JSON Schema of :meth:`EngineOptions.from_json`'s mapping, from the
    checks it runs (the options' cross-field rules are its own)."""
    return _declared_schema(EngineOptions, OPTION_FIELDS)


def streams_schema() -> dict[str, Any]:
    """The JSON Schema of :func:`streams_from_json`'s list: a stream per rank."""
    request = _declared_schema(
        RequestScript,
        REQUEST_FIELDS,
        {"req_id": {"type": "string", "pattern": REQ_ID_PATTERN}},
    )
    stream = object_schema(
        (),
        more={
            "requests": {
                "type": "array",
                "items": request,
                "maxItems": MAX_WORKLOAD_REQUESTS,
            }
        },
    )
    return {"type": "array", "items": stream, "minItems": 1, "maxItems": MAX_RANKS}


def _declared_schema(
    cls: type, declared: Sequence[Field], more: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A dataclass's JSON form as :func:`_from_json` reads it: its fields,
    those without a default required, no other key."""
    members = fields(cls)
    schema = object_schema(
        declared,
        [
            member.name
            for member in members
            if member.default is MISSING and member.default_factory is MISSING
        ],
        more=more,
    )
    if set(schema["properties"]) != {member.name for member in members}:
        raise ValueError(f"{cls.__name__}: a field has no schema")
    return schema


def check_streams(streams: Sequence[RankStream], options: EngineOptions) -> None:
    """Refuse streams the engine would refuse, or that reuse a request id."""
    for stream in streams:
        stream.check_for(options)
    _unique_ids(request for stream in streams for request in stream.requests)


def _unique_ids(requests: Iterable[RequestScript]) -> None:
    seen: set[str] = set()
    for request in requests:
        if request.req_id in seen:
            raise UsageError(f"request {request.req_id}: req_id is used twice")
        seen.add(request.req_id)


_T = TypeVar("_T")


def _check(obj: object, checked: Sequence[Field], owner: str) -> None:
    for field in checked:
        problem = field.problem(getattr(obj, field.name))
        if problem is not None:
            raise UsageError(f"{owner}: {field.name} {problem}")


def _to_json(obj: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def _from_json(cls: type[_T], data: Any, owner: str) -> _T:
    if not isinstance(data, Mapping):
        raise UsageError(f"{owner}: expected a mapping, got {shown(data)}")
    known = {field.name: field for field in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - known.keys()
    if unknown:
        raise UsageError(
            f"{owner}: unknown keys: {', '.join(sorted(map(str, unknown)))}"
        )
    missing = [
        name
        for name, field in known.items()
        if name not in data and field.default is MISSING
    ]
    if missing:
        raise UsageError(f"{owner}: missing keys: {', '.join(missing)}")
    return cls(**data)
