"""Strict objects and the gap log: what the runner lane does not model refuses.

Every stand-in the lane hands vLLM (a config, a model, a collaborator) and
every real vLLM class it rebuilds (:func:`~dpsim.lanes.runner.extract.real_class`)
derives from :class:`StrictObject`. Reading an attribute it does not hold is a
*gap*: dpsim was not written for that question. A gap is logged into the
active gap log (:func:`collect_gaps`), naming the owner, the attribute and
the vLLM line that asked, and :class:`ModelGap` is raised. vLLM wraps much of
its code in ``except Exception`` and probes with ``getattr(x, name, default)``,
which would swallow the exception; the log does not forget, and the lane
refuses any run whose log is not empty at the end.

Attributes the real vLLM object does not have either are listed in the
class's ``ABSENT``: reading one raises a plain :class:`AttributeError`, so a
``getattr`` probe takes its default exactly as it does in vLLM.

Dunder names (``__len__``, ``__deepcopy__``, ...) are never gaps: Python and
libraries probe them on instances routinely, and vLLM's own code does not.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

from dpsim.lanes.runner.where import vllm_location

T = TypeVar("T")


class ModelGap(Exception):
    """vLLM asked dpsim something its stand-ins were not written to answer."""


#: The active gap logs, outermost first; a gap goes into each.
_logs: list[list[str]] = []


@contextmanager
def collect_gaps() -> Iterator[list[str]]:
    """The gaps met inside the block, in order, each once.

    Nested blocks each get every gap met while they are active (an outer run
    refuses whatever an inner one saw).
    """
    gaps: list[str] = []
    _logs.append(gaps)
    try:
        yield gaps
    finally:
        # By identity: a list equal to another must not remove the other.
        index = next(i for i, log in enumerate(_logs) if log is gaps)
        del _logs[index]


def gap(text: str) -> ModelGap:
    """Log ``text`` as a gap in every active log; the exception to raise."""
    for log in _logs:
        if text not in log:
            log.append(text)
    return ModelGap(text)


def asked_at(depth: int = 1) -> str:
    """Where the vLLM code asking is: the innermost vLLM frame from the
    caller's caller (``depth`` frames up) outward, or a plain note."""
    return vllm_location(sys._getframe(depth + 1)) or "(no vLLM frame on the stack)"


class StrictObject:
    """Base of every stand-in and every rebuilt vLLM class: an attribute it
    does not hold is a gap (logged, :class:`ModelGap`), unless the real vLLM
    object lacks it too (``ABSENT``: plain :class:`AttributeError`)."""

    ABSENT: ClassVar[frozenset[str]] = frozenset()
    #: How gaps name the object; the class name when None.
    OWNER: ClassVar[str | None] = None

    def __getattr__(self, name: str) -> Any:
        cls = type(self)
        if (name.startswith("__") and name.endswith("__")) or name in cls.ABSENT:
            raise AttributeError(
                f"{cls.OWNER or cls.__name__!s} object has no attribute {name!r}"
            )
        raise gap(f"{cls.OWNER or cls.__name__}.{name} read at {asked_at()}")


def standin(owner: str, *, absent: Any = (), **members: Any) -> StrictObject:
    """A strict object answering exactly ``members`` (values, or callables
    called as ``obj.name(...)`` with no ``self``), named ``owner`` in gaps;
    the names in ``absent`` raise plain :class:`AttributeError`."""
    made = _standin_class(owner, frozenset(absent))()
    made.__dict__.update(members)
    return made


@functools.cache
def _standin_class(owner: str, absent: frozenset[str]) -> type[StrictObject]:
    """The class of stand-ins named ``owner`` with ``absent``: one per pair,
    made once (a class per stand-in cost the lane's hot paths a type
    creation and the garbage collector a cycle each)."""
    return type(
        f"StandIn[{owner}]",
        (StrictObject,),
        {"ABSENT": absent, "OWNER": owner, "__module__": __name__},
    )


def instance(cls: type[T], **attributes: Any) -> T:
    """An instance of ``cls`` made without its ``__init__`` (vLLM's builds
    GPU state), holding exactly ``attributes``."""
    made = cls.__new__(cls)
    for name, value in attributes.items():
        setattr(made, name, value)
    return made
