"""Strict objects and the gap log: what the runner lane does not model refuses.

Every stand-in the lane hands vLLM (a config, a model, a collaborator) and
every real vLLM class it rebuilds (:func:`~dpsim.lanes.runner.extract.real_class`)
derives from :class:`StrictObject`. Reading an attribute it does not hold is a
*gap*: dpsim was not written for that question. A gap is logged into the
active gap log (:func:`~dpsim.boundary.collect_gaps`), naming the owner, the
attribute and the vLLM line that asked, and :class:`ModelGap` is raised. vLLM wraps much of
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
from typing import Any, ClassVar, TypeVar

# The gap log is every lane's (the sync lane's stand-ins log gaps too); the
# lane's modules and tests keep importing it from here.
from dpsim.boundary import ModelGap, asked_at, collect_gaps, gap, modelled

__all__ = [
    "ModelGap",
    "StrictObject",
    "asked_at",
    "collect_gaps",
    "gap",
    "instance",
    "standin",
]

T = TypeVar("T")


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
            # What the real object raises too: vLLM's own doing if it escapes.
            raise modelled(
                AttributeError(
                    f"{cls.OWNER or cls.__name__!s} object has no attribute {name!r}"
                )
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
