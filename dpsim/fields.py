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

Hand-written rather than attrs validators, pydantic or msgspec: those raise
their own exception types with their own (often multi-line) wording, our
messages are asserted word for word, and the records that use this must stay
cheap to import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dpsim.limits import int_problem, shown

__all__ = [
    "Check",
    "Field",
    "boolean",
    "integer",
    "integers",
    "member",
    "optional",
]

#: What is wrong with a value, completing "<field> ...", or None when nothing is.
Check = Callable[[Any], "str | None"]


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
    return lambda value: int_problem(value, low, high)


def boolean(value: Any) -> str | None:
    """``true`` or ``false``; a 0 or a ``"yes"`` is not."""
    if isinstance(value, bool):
        return None
    return f"must be true or false, got {shown(value)}"


def member(choices: Iterable[str], what: str) -> Check:
    """One of ``choices`` (in the order given, which the refusal lists)."""
    allowed = tuple(choices)

    def check(value: Any) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        return f"unknown {what} {shown(value)}; expected one of {', '.join(allowed)}"

    return check


def optional(check: Check) -> Check:
    """None, or a value ``check`` accepts."""
    return lambda value: None if value is None else check(value)


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

    return check
