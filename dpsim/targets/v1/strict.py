"""Stand-in objects that answer exactly what they were given, and fail loudly.

vLLM's V1 caller method and dispatcher read a handful of attributes off the
model runner (``self``) and off ``VllmConfig``; a stand-in carrying only those
keeps dpsim honest: a release that starts reading something new gets an
:class:`AttributeError` naming the attribute and where vLLM reads it, rather
than a default dpsim made up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: Says where vLLM reads a dotted attribute path (e.g. "in X, file.py:12"),
#: or "" when its source does not say.
Where = Callable[[str], str]


def _nowhere(path: str) -> str:
    return ""


class StrictView:
    """An object holding exactly ``values`` (nest views for nested objects).

    Reading anything else raises ``AttributeError("dpsim's stand-in for
    <owner> has no attribute <path> (<where>)")``; setting anything raises too,
    since the code run through it is meant to read, not write.
    """

    def __init__(
        self,
        owner: str,
        values: Mapping[str, Any],
        *,
        where: Where = _nowhere,
        path: str = "",
    ) -> None:
        held = dict(values)
        object.__setattr__(self, "_dpsim_view", (owner, path, where, held))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        owner, path, where, held = object.__getattribute__(self, "_dpsim_view")
        if name in held:
            return held[name]
        dotted = f"{path}{name}"
        said = where(dotted)
        raise AttributeError(
            f"dpsim's stand-in for {owner} has no attribute {dotted}"
            + (f" ({said})" if said else "")
        )

    def __setattr__(self, name: str, value: Any) -> None:
        owner, path, _, _ = object.__getattribute__(self, "_dpsim_view")
        raise AttributeError(
            f"dpsim's stand-in for {owner} is read-only (vLLM set {path}{name})"
        )

    def __repr__(self) -> str:
        owner, path, _, _ = object.__getattribute__(self, "_dpsim_view")
        return f"<dpsim's stand-in for {owner}{'.' + path.rstrip('.') if path else ''}>"


def view_of_paths(
    owner: str, values: Mapping[tuple[str, ...], Any], *, where: Where = _nowhere
) -> StrictView:
    """A view answering each dotted path of ``values`` (``("a", "b")`` is
    ``view.a.b``), with views for the objects in between and nothing else."""
    return _view(owner, values, where, ())


def _view(
    owner: str,
    values: Mapping[tuple[str, ...], Any],
    where: Where,
    prefix: tuple[str, ...],
) -> StrictView:
    depth = len(prefix)
    leaves: dict[str, Any] = {}
    inner: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in values.items():
        if len(path) == depth + 1:
            leaves[path[depth]] = value
        else:
            inner.setdefault(path[depth], {})[path] = value
    for name, below in inner.items():
        if name in leaves:
            raise ValueError(f"{'.'.join((*prefix, name))} is both a value and a view")
        leaves[name] = _view(owner, below, where, (*prefix, name))
    path_text = "".join(f"{part}." for part in prefix)
    return StrictView(owner, leaves, where=where, path=path_text)
