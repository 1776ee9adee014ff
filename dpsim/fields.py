"""Validation declared per field: what each value read from a user must be.

Policies, counterexample files and workloads all read values a stranger
wrote, and each refuses a bad one in a single line naming the field. Rather
than each writing its own loops, a reader declares its fields here: a
:class:`Field` is a name, a :data:`Check` (built from the bounds in
:mod:`dpsim.limits`) and an optional note. A check answers with the problem
as the end of a sentence that starts with the field's name (``"must be an
integer >= 1, got 0"``), or None, so each reader keeps its own way of naming
the field (``max_num_seqs: ...``, ``case.dp_size ...``, ``file:3: rank 0:
num_reqs ...``) and every refusal of one kind of value reads the same.

Each check built here also carries the JSON Schema of the values it accepts
(:func:`schema_of`), so the published schemas of dpsim's files
(:mod:`dpsim.cex.schema`) are made of the very checks the readers run; a
reader's own check declares its schema with :func:`described`.

Hand-written rather than attrs validators, pydantic or msgspec: those raise
their own exception types with their own (often multi-line) wording, our
messages are asserted word for word, and the records that use this must stay
cheap to import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dpsim.limits import int_problem, shown

__all__ = [
    "Check",
    "Field",
    "boolean",
    "described",
    "integer",
    "integers",
    "member",
    "object_schema",
    "optional",
    "schema_of",
]

#: What is wrong with a value, completing "<field> ...", or None when nothing is.
Check = Callable[[Any], "str | None"]

#: The attribute a check's JSON Schema is kept in.
_SCHEMA = "json_schema"


def described(check: Check, schema: dict[str, Any]) -> Check:
    """``check``, carrying ``schema``: the JSON Schema of what it accepts."""
    setattr(check, _SCHEMA, schema)
    return check


def schema_of(check: Check) -> dict[str, Any]:
    """The JSON Schema declared with ``check``; a check declared without one
    is refused, so no field of a published schema is silently unconstrained."""
    schema = getattr(check, _SCHEMA, None)
    if schema is None:
        raise TypeError(f"{check!r} declares no JSON Schema (see fields.described)")
    return dict(schema)


def object_schema(
    declared: Iterable[Field],
    required: Iterable[str] = (),
    *,
    closed: bool = True,
    more: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON Schema of a mapping whose keys are ``declared`` (each with its
    check's schema) and ``more`` (keys its reader checks itself); ``required``
    must be there, and a ``closed`` mapping has no other key."""
    properties = {spec.name: schema_of(spec.check) for spec in declared}
    properties.update(more or {})
    needed = list(required)
    unknown = [name for name in needed if name not in properties]
    if unknown:
        raise ValueError(f"required keys not declared: {', '.join(unknown)}")
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if needed:
        schema["required"] = [name for name in properties if name in needed]
    if closed:
        schema["additionalProperties"] = False
    return schema


@dataclass(frozen=True)
class Field:
    """One field a reader takes from a file: its name, its check, a note.

    ``note`` follows the problem, to say how to fix it where that is not
    obvious (``" (leave it out for the largest capture size)"``).
    """

    name: str
    check: Check
    note: str = ""

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` as this field, or None."""
        problem = self.check(value)
        return None if problem is None else problem + self.note


def integer(low: int, high: int) -> Check:
    """An integer in ``low..high`` (never a bool): :func:`~dpsim.limits.int_problem`."""
    return described(
        lambda value: int_problem(value, low, high),
        {"type": "integer", "minimum": low, "maximum": high},
    )


def boolean(value: Any) -> str | None:
    """``true`` or ``false``; a 0 or a ``"yes"`` is not."""
    if isinstance(value, bool):
        return None
    return f"must be true or false, got {shown(value)}"


described(boolean, {"type": "boolean"})


def member(choices: Iterable[str], what: str) -> Check:
    """One of ``choices`` (in the order given, which the refusal lists)."""
    allowed = tuple(choices)

    def check(value: Any) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        return f"unknown {what} {shown(value)}; expected one of {', '.join(allowed)}"

    return described(check, {"enum": [_json_value(choice) for choice in allowed]})


def _json_value(choice: Any) -> Any:
    """A choice as a file spells it (an enum member by its value)."""
    return choice.value if isinstance(choice, Enum) else choice


def optional(check: Check) -> Check:
    """None, or a value ``check`` accepts."""

    def optional_check(value: Any) -> str | None:
        return None if value is None else check(value)

    inner = getattr(check, _SCHEMA, None)
    if inner is None:
        return optional_check
    return described(optional_check, {"anyOf": [{"type": "null"}, inner]})


def integers(most: int, each: Check, item: str, *, empty: str | None = None) -> Check:
    """A list (or tuple) of at most ``most`` distinct values ``each`` accepts.

    ``item`` names one entry in the refusal (``"every size must be ..."``,
    ``"size 8 is listed twice"``); ``empty``, when given, refuses an empty
    list with that text.
    """

    def check(value: Any) -> str | None:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return f"expected a list of integers, got {shown(value)}"
        if len(value) > most:
            return f"{len(value):,} entries; at most {most:,} allowed"
        if empty is not None and not value:
            return empty
        for entry in value:
            problem = each(entry)
            if problem is not None:
                return f"every {item} {problem}"
        if len(set(value)) != len(value):
            twice = next(entry for entry in value if value.count(entry) > 1)
            return f"{item} {twice} is listed twice"
        return None

    schema: dict[str, Any] = {
        "type": "array",
        "items": schema_of(each),
        "maxItems": most,
        "uniqueItems": True,
    }
    if empty is not None:
        schema["minItems"] = 1
    return described(check, schema)
