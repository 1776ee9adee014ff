"""Field-by-field checks of a parsed counterexample, before anything is built from it.

A counterexample may come from a stranger, so every value is checked for its
type and for a size dpsim can run in reasonable time before a ``Case`` or a
target spec is made of it: a ``"num_tokens": "12"`` or a 10**6-rank case must
be refused in one line, not surface later as a traceback in the simulator or a
machine swapping. Each check raises :class:`Malformed` naming the field's path.
"""

from __future__ import annotations

import re
from typing import Any

from dpsim import fields
from dpsim.errors import UsageError
from dpsim.limits import (
    MAX_CAPTURE_ENTRIES,
    MAX_INT,
    MAX_RANKS,
    MAX_SPECULATIVE_TOKENS,
    int_problem,
)
from dpsim.options import RUNNERS
from dpsim.records.case import BATCH_KINDS, PROFILES
from dpsim.records.trace import Outcome
from dpsim.scenarios.programs import SCENARIOS

#: Bounds of a counterexample's own shape, well above anything a real case
#: needs and low enough that a replay of the biggest allowed case still ends
#: in seconds; bounds shared with policies, workloads and flags (ranks,
#: counts, list lengths) are in :mod:`dpsim.limits`.
MAX_STEPS = 256
MAX_CHOICES = 10_000_000
MAX_TEXT = 4096

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_OUTCOMES = frozenset(outcome.value for outcome in Outcome)


def _true_or_false(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


#: A rank batch's fields, checked in this order: the required counts, then
#: the optional counts and flags, each only when given.
_BATCH_FIELDS = (
    fields.Field("num_reqs", fields.integer(0, MAX_INT)),
    fields.Field("num_tokens", fields.integer(0, MAX_INT)),
    fields.Field("num_active_loras", fields.integer(0, MAX_INT)),
    fields.Field("uniform_token_count", fields.optional(fields.integer(0, MAX_INT))),
    fields.Field("max_query_len", fields.optional(fields.integer(0, MAX_INT))),
    fields.Field("need_eager", _true_or_false),
    fields.Field("allow_ubatching", _true_or_false),
    fields.Field("uniform_decode", _true_or_false),
    fields.Field("allow_skip_drafts", _true_or_false),
    fields.Field("num_encoder_reqs", fields.integer(0, MAX_INT)),
    fields.Field("cascade_attn", _true_or_false),
)
_REQUIRED_BATCH_FIELDS = frozenset(("num_reqs", "num_tokens", "num_active_loras"))

#: A drafter's reuse call (the contract profile's ``reuse_calls``): what it
#: passes beside the agreement it reuses.
_REUSE_FIELDS = (
    fields.Field("num_reqs", fields.integer(0, MAX_INT)),
    fields.Field("max_query_len", fields.optional(fields.integer(0, MAX_INT))),
    fields.Field("num_active_loras", fields.integer(0, MAX_INT)),
)
_REQUIRED_REUSE_FIELDS = frozenset(("num_reqs",))


class Malformed(UsageError):
    """A field of a counterexample has the wrong type, shape or size."""


def mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed(f"{where} must be an object, got {_kind(value)}")
    return value


def sequence(value: Any, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise Malformed(f"{where} must be a list, got {_kind(value)}")
    if len(value) > limit:
        raise Malformed(f"{where} has {len(value)} entries; at most {limit} allowed")
    return value


def integer(value: Any, where: str, low: int = 0, high: int = MAX_INT) -> int:
    problem = int_problem(value, low, high)
    if problem is not None:
        raise Malformed(f"{where} {problem}")
    return int(value)


def text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Malformed(f"{where} must be a string, got {_kind(value)}")
    if len(value) > MAX_TEXT:
        raise Malformed(f"{where} is {len(value)} characters; at most {MAX_TEXT}")
    return value


def optional_text(value: Any, where: str) -> str | None:
    return None if value is None else text(value, where)


def required(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise Malformed(f"{where} has no {key!r}")
    return data[key]


def one_of(value: Any, allowed: Any, where: str) -> str:
    name = text(value, where)
    if name not in allowed:
        raise Malformed(
            f"{where} = {name!r}; expected one of {', '.join(sorted(allowed))}"
        )
    return name


def target(value: Any) -> dict[str, Any]:
    data = mapping(value, "target")
    spec = mapping(required(data, "spec", "target"), "target.spec")
    one_of(
        required(spec, "kind", "target.spec"), {"release", "tree"}, "target.spec.kind"
    )
    text(required(spec, "base", "target.spec"), "target.spec.base")
    optional_text(spec.get("dp_utils_file"), "target.spec.dp_utils_file")
    # Absent in every file written before dpsim knew the V1 runner: V2 then.
    if spec.get("runner") is not None:
        one_of(spec["runner"], RUNNERS, "target.spec.runner")
    optional_text(spec.get("caller_file"), "target.spec.caller_file")
    optional_text(data.get("label"), "target.label")
    optional_text(data.get("version"), "target.version")
    files = mapping(required(data, "files", "target"), "target.files")
    for module, digest in files.items():
        if not _MODULE.match(module):
            raise Malformed(f"target.files: {module[:80]!r} is not a module name")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise Malformed(f"target.files[{module!r}] is not a SHA-256 hex digest")
    return data


def case(value: Any) -> dict[str, Any]:
    """Check the case's shape and sizes; ``Case.from_dict`` checks the policy."""
    data = mapping(value, "case")
    one_of(required(data, "scenario", "case"), SCENARIOS, "case.scenario")
    one_of(required(data, "profile", "case"), PROFILES, "case.profile")
    _bounded(mapping(required(data, "policy", "case"), "case.policy"), "case.policy")
    integer(
        data.get("num_speculative_steps", 0),
        "case.num_speculative_steps",
        0,
        MAX_SPECULATIVE_TOKENS,
    )
    steps = sequence(required(data, "steps", "case"), "case.steps", MAX_STEPS)
    if not steps:
        raise Malformed("case.steps is empty; a case has at least one step")
    widths = set()
    for index, step in enumerate(steps):
        where = f"case.steps[{index}]"
        batches = sequence(step, where, MAX_RANKS)
        if not batches:
            raise Malformed(f"{where} has no ranks")
        widths.add(len(batches))
        for rank, batch in enumerate(batches):
            _batch(batch, f"{where}[{rank}]")
    if len(widths) != 1:
        raise Malformed("case.steps: every step needs one batch per rank")
    if "reuse_calls" in data:
        calls = sequence(data["reuse_calls"], "case.reuse_calls", MAX_STEPS)
        for index, step in enumerate(calls):
            where = f"case.reuse_calls[{index}]"
            for rank, call in enumerate(sequence(step, where, MAX_RANKS)):
                _record(call, f"{where}[{rank}]", _REUSE_FIELDS, _REQUIRED_REUSE_FIELDS)
    if "dp_size" in data:
        dp_size = integer(data["dp_size"], "case.dp_size", 1, MAX_RANKS)
        if dp_size != len(steps[0]):
            raise Malformed(
                f"case.dp_size is {dp_size} but each step has {len(steps[0])} batches"
            )
    return data


def _bounded(value: Any, where: str, depth: int = 0) -> None:
    """Sizes only: ``CapturePolicy`` checks the meaning of each key itself."""
    if depth > 4:
        raise Malformed(f"{where} is nested too deeply")
    if isinstance(value, dict):
        for key, item in value.items():
            _bounded(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        sequence(value, where, MAX_CAPTURE_ENTRIES)
        for index, item in enumerate(value):
            _bounded(item, f"{where}[{index}]", depth + 1)
    elif isinstance(value, int) and not isinstance(value, bool):
        integer(value, where, -MAX_INT, MAX_INT)
    elif isinstance(value, str):
        text(value, where)


def _batch(value: Any, where: str) -> None:
    batch = _record(value, where, _BATCH_FIELDS, _REQUIRED_BATCH_FIELDS, ("kind",))
    if "kind" in batch:
        one_of(batch["kind"], BATCH_KINDS, f"{where}.kind")


def _record(
    value: Any,
    where: str,
    specs: tuple[fields.Field, ...],
    required_names: frozenset[str],
    other_keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A mapping of ``specs``' fields (and ``other_keys``, checked by the
    caller), each checked in ``specs``' order; ``required_names`` must be there."""
    record = mapping(value, where)
    unknown = set(record) - {spec.name for spec in specs} - set(other_keys)
    if unknown:
        raise Malformed(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    for spec in specs:
        if spec.name in required_names:
            item = required(record, spec.name, where)
        elif spec.name in record:
            item = record[spec.name]
        else:
            continue
        problem = spec.problem(item)
        if problem is not None:
            raise Malformed(f"{where}.{spec.name} {problem}")
    return record


def choices(value: Any, ranks: int) -> tuple[int, ...]:
    items = sequence(value, "choices", MAX_CHOICES)
    for index, choice in enumerate(items):
        # The common case is valid: check cheaply, describe only a failure.
        if type(choice) is not int or not 0 <= choice < ranks:
            integer(choice, f"choices[{index}]", 0, ranks - 1)
    return tuple(items)


def names(value: Any, where: str, known: Any) -> tuple[str, ...]:
    return tuple(
        one_of(name, known, f"{where}[{index}]")
        for index, name in enumerate(sequence(value, where, 64))
    )


def verdicts(value: Any, known: Any, ranks: int) -> tuple[dict[str, Any], ...]:
    checked = []
    for index, item in enumerate(sequence(value, "verdicts", 64)):
        where = f"verdicts[{index}]"
        verdict = mapping(item, where)
        one_of(required(verdict, "property", where), known, f"{where}.property")
        optional_text(verdict.get("phase"), f"{where}.phase")
        text(required(verdict, "message", where), f"{where}.message")
        seen: set[int] = set()
        for position, rank in enumerate(
            sequence(required(verdict, "ranks", where), f"{where}.ranks", ranks)
        ):
            # A verdict names the set of ranks involved (see Verdict).
            if integer(rank, f"{where}.ranks[{position}]", 0, ranks - 1) in seen:
                raise Malformed(f"{where}.ranks lists rank {rank} twice")
            seen.add(rank)
        checked.append(verdict)
    return tuple(checked)


def outcome(value: Any) -> str:
    return one_of(value, _OUTCOMES, "outcome")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)
