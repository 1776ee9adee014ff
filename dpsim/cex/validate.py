"""Field-by-field checks of a parsed counterexample, before anything is built from it.

A counterexample may come from a stranger, so every value is checked for its
type and for a size dpsim can run in reasonable time before a ``Case`` or a
target spec is made of it: a ``"num_tokens": "12"`` or a 10**6-rank case must
be refused in one line, not surface later as a traceback in the simulator or a
machine swapping. Each check raises :class:`Malformed` naming the field's path.

The fields are declared (:class:`~dpsim.fields.Field`, each check carrying the
JSON Schema of what it accepts), and :mod:`dpsim.cex.schema` publishes the
file format from these declarations: the schema a reader checks a file
against is made of the checks that read it.
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
#: Properties named, or verdicts given, in one file: well above the number of properties.
MAX_NAMES = 64

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
OUTCOMES = frozenset(outcome.value for outcome in Outcome)


def _true_or_false(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


fields.described(_true_or_false, {"type": "boolean"})


def text_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, got {_kind(value)}"
    if len(value) > MAX_TEXT:
        return f"is {len(value)} characters; at most {MAX_TEXT}"
    return None


fields.described(text_problem, {"type": "string", "maxLength": MAX_TEXT})
optional_text_check = fields.optional(text_problem)


def one_of_check(allowed: Any) -> fields.Check:
    """A string among ``allowed`` (listed sorted when refused)."""
    names = sorted(allowed)

    def check(value: Any) -> str | None:
        problem = text_problem(value)
        if problem is not None:
            return problem
        if value not in allowed:
            return f"= {value!r}; expected one of {', '.join(names)}"
        return None

    return fields.described(check, {"type": "string", "enum": names})


#: A target's spec: what ``dpsim replay`` loads (release or tree, its base,
#: the ``--target`` file, the runner, the ``--caller-file``).
SPEC_FIELDS = (
    fields.Field("kind", one_of_check({"release", "tree"})),
    fields.Field("base", text_problem),
    fields.Field("dp_utils_file", optional_text_check),
    # Absent in every file written before dpsim knew the V1 runner: V2 then.
    fields.Field("runner", fields.optional(one_of_check(RUNNERS))),
    fields.Field("caller_file", optional_text_check),
)
REQUIRED_SPEC_FIELDS = frozenset(("kind", "base"))
#: A target's own fields besides its spec and its files.
TARGET_FIELDS = (
    fields.Field("label", optional_text_check),
    fields.Field("version", optional_text_check),
)
#: A recorded source file: its module name, and its SHA-256.
MODULE_PATTERN = _MODULE.pattern
SHA256_PATTERN = _SHA256.pattern


#: A rank batch's fields, checked in this order: the required counts, then
#: the optional counts and flags, each only when given.
BATCH_FIELDS = (
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
    # Why the batch came about (a counterexample's reader's aid): checked last.
    fields.Field("kind", one_of_check(BATCH_KINDS)),
)
REQUIRED_BATCH_FIELDS = frozenset(("num_reqs", "num_tokens", "num_active_loras"))

#: A drafter's reuse call (the contract profile's ``reuse_calls``): what it
#: passes beside the agreement it reuses.
REUSE_FIELDS = (
    fields.Field("num_reqs", fields.integer(0, MAX_INT)),
    fields.Field("max_query_len", fields.optional(fields.integer(0, MAX_INT))),
    fields.Field("num_active_loras", fields.integer(0, MAX_INT)),
)
REQUIRED_REUSE_FIELDS = frozenset(("num_reqs",))

#: A case's own scalar fields, in the order they are checked around its
#: policy and steps (read apart); ``dp_size``, when given, must match the
#: steps' width.
_CASE_NAMES = (
    fields.Field("scenario", one_of_check(SCENARIOS)),
    fields.Field("profile", one_of_check(PROFILES)),
)
_CASE_SPECULATION = (
    fields.Field("num_speculative_steps", fields.integer(0, MAX_SPECULATIVE_TOKENS)),
)
_CASE_WIDTH = (fields.Field("dp_size", fields.integer(1, MAX_RANKS)),)
CASE_FIELDS = (*_CASE_NAMES, *_CASE_SPECULATION, *_CASE_WIDTH)
REQUIRED_CASE_FIELDS = frozenset(("scenario", "profile"))


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
    problem = text_problem(value)
    if problem is not None:
        raise Malformed(f"{where} {problem}")
    return str(value)


def optional_text(value: Any, where: str) -> str | None:
    return None if value is None else text(value, where)


def required(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise Malformed(f"{where} has no {key!r}")
    return data[key]


def one_of(value: Any, allowed: Any, where: str) -> str:
    problem = one_of_check(allowed)(value)
    if problem is not None:
        raise Malformed(f"{where} {problem}")
    return str(value)


def target(value: Any) -> dict[str, Any]:
    data = mapping(value, "target")
    spec = required(data, "spec", "target")
    _record(spec, "target.spec", SPEC_FIELDS, REQUIRED_SPEC_FIELDS, closed=False)
    _record(data, "target", TARGET_FIELDS, frozenset(), closed=False)
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
    _record(data, "case", _CASE_NAMES, REQUIRED_CASE_FIELDS, closed=False)
    _bounded(mapping(required(data, "policy", "case"), "case.policy"), "case.policy")
    _record(data, "case", _CASE_SPECULATION, frozenset(), closed=False)
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
                _record(call, f"{where}[{rank}]", REUSE_FIELDS, REQUIRED_REUSE_FIELDS)
    if "dp_size" in data:
        _record(data, "case", _CASE_WIDTH, frozenset(), closed=False)
        dp_size = data["dp_size"]
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
    _record(value, where, BATCH_FIELDS, REQUIRED_BATCH_FIELDS)


def _record(
    value: Any,
    where: str,
    specs: tuple[fields.Field, ...],
    required_names: frozenset[str],
    other_keys: tuple[str, ...] = (),
    *,
    closed: bool = True,
) -> dict[str, Any]:
    """A mapping of ``specs``' fields (and ``other_keys``, checked by the
    caller), each checked in ``specs``' order; ``required_names`` must be there.
    A ``closed`` record refuses any other key; an open one leaves the others
    to its caller (a target's files, a case's steps)."""
    record = mapping(value, where)
    if closed:
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
        for index, name in enumerate(sequence(value, where, MAX_NAMES))
    )


def verdicts(value: Any, known: Any, ranks: int) -> tuple[dict[str, Any], ...]:
    checked = []
    for index, item in enumerate(sequence(value, "verdicts", MAX_NAMES)):
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
    return one_of(value, OUTCOMES, "outcome")


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
