"""A real vLLM class rebuilt from chosen methods of its source file.

vLLM's runner-side classes (``GPUModelRunner``, ``Worker``, the speculators,
``DPEngineCoreProc``) live in files that import half of vLLM and build GPU
state in ``__init__``. The lane runs their real methods anyway:
:func:`real_class` parses the file with the targets' one reader
(:func:`~dpsim.targets.shim.parse_source`), keeps only the named methods of
the class (properties, setters and cached properties included) and its
class-level settings with literal values (``num_query_per_req: int = 1``),
strips annotations, gives every loop the shim's tick, and executes a synthesized
``class Name(*bases): <the kept methods>`` compiled with the REAL file name
and line numbers: tracebacks, :mod:`~dpsim.lanes.runner.where`, coverage and
zero-argument ``super()`` (which needs a real class statement for
``__class__``) all work as in vLLM.

Decorators: one whose source text (``ast.unparse``, so quotes and spacing
do not matter) is a key of ``decorators`` is replaced by the value, or dropped when the value is None
(the caller's code says why: e.g. ``torch.inference_mode()`` is per-thread
state in vLLM, which the installed world enters once for every rank, so
dropping it is what keeps one rank from leaving it under another); any other
is evaluated for real.

Global names the kept methods (and their nested functions, lambdas and
comprehensions, and their decorators) use resolve from ``globals_``, then
builtins; any other becomes an object that logs a gap and raises
:class:`~dpsim.lanes.runner.strict.ModelGap` on any use, naming the name and
the vLLM line. Methods the class does not keep are not there: reading one
off an instance is a gap like any other unknown attribute. Instances are made
without ``__init__`` (:func:`~dpsim.lanes.runner.strict.instance`).
"""

from __future__ import annotations

import ast
import builtins
import copy
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

from dpsim.errors import TargetError
from dpsim.lanes.runner import where
from dpsim.lanes.runner.strict import ModelGap, StrictObject, gap
from dpsim.targets.cut import StripAnnotations, Unsupplied, loaded_names, tick
from dpsim.targets.shim import TICK_NAME, _TickEveryLoop, innermost_line, parse_source


@dataclass(frozen=True)
class Origin:
    """Where a rebuilt class came from (``cls.DPSIM_ORIGIN``)."""

    path: Path
    version: str | None
    class_name: str
    methods: tuple[str, ...]
    #: The compiled class statement; its constants hold every method's code.
    code: CodeType
    #: The globals the methods see (a copy of ``globals_`` plus what dpsim
    #: put there); :func:`supply` adds to it.
    namespace: dict[str, Any] = field(repr=False, compare=False)

    def codes(self) -> Iterator[CodeType]:
        """Every function code object compiled from the file: the methods and
        what they nest (functions, lambdas, comprehensions)."""
        return _nested_codes(self.code)


def real_class(
    path: Path,
    class_name: str,
    methods: Collection[str],
    *,
    version: str | None,
    globals_: Mapping[str, Any],
    bases: tuple[type, ...] = (StrictObject,),
    decorators: Mapping[str, Callable[..., Any] | None] | None = None,
    absent: Collection[str] = (),
    class_attributes: Mapping[str, Any] | None = None,
) -> type:
    """``class_name`` of vLLM file ``path`` with only ``methods``, runnable.

    ``absent``: attributes the real object lacks too (``ABSENT``, so
    ``getattr`` probes take their default); ``class_attributes``: class-level
    names vLLM's class body defines with a non-literal value that the methods
    read via ``self`` (literal ones are kept from the file; these win).
    A ``global`` statement in a kept method writes the rebuilt class's own
    copy of ``globals_``, not the mapping passed.
    A missing class or method is a one-line :class:`TargetError`.
    """
    # Keys normalised the way the file's decorators are (quotes, spacing).
    decorators = {
        ast.unparse(ast.parse(text, mode="eval").body): value
        for text, value in (decorators or {}).items()
    }
    owner = _owner(path, version)
    found = class_node(path, class_name, version=version)
    wanted = list(dict.fromkeys(methods))
    kept: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    body: list[ast.stmt] = []
    for node in found.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in wanted:
                kept.append(copy.deepcopy(node))  # transformers edit in place
                body.append(kept[-1])
        elif _literal_setting(node):
            body.append(copy.deepcopy(node))
    have = {node.name for node in kept}
    for name in wanted:
        if name not in have:
            raise TargetError(f"runner lane: {owner} has no {class_name}.{name}")

    namespace: dict[str, Any] = dict(globals_)
    namespace.setdefault("__builtins__", builtins.__dict__)
    namespace.setdefault("__name__", f"dpsim.lanes.runner.real.{class_name}")
    namespace[TICK_NAME] = tick()
    for node in kept:
        node.decorator_list = [
            replaced
            for decorator in node.decorator_list
            if (replaced := _decorator(decorator, decorators, namespace)) is not None
        ]
    statement = ast.ClassDef(
        name=class_name,
        bases=[],
        keywords=[],
        # Nothing kept (a class vLLM's lane paths only inherit through, such
        # as 0.29's SpeculatorCudaGraphManager): a class body needs a statement.
        body=body or [ast.copy_location(ast.Pass(), found)],
        decorator_list=[],
    )
    for index, base in enumerate(bases):
        name = f"__dpsim_base_{index}__"
        namespace[name] = base
        statement.bases.append(ast.Name(name, ast.Load()))
    ast.copy_location(statement, found)
    module = ast.Module(body=[statement], type_ignores=[])
    module = _TickEveryLoop().visit(StripAnnotations().visit(module))
    ast.fix_missing_locations(module)

    for node in kept:
        for name in sorted(loaded_names(node) - have):
            if name not in namespace:
                namespace[name] = _unsupplied(name)
    where.register_file(path)
    code = compile(module, str(path), "exec", dont_inherit=True)
    try:
        exec(code, namespace)
    except ModelGap:
        raise
    except Exception as error:
        line = innermost_line(error, str(path))
        raise TargetError(
            f"runner lane: {owner}{line}: building {class_name} failed: "
            f"{type(error).__name__}: {error}"
        ) from error
    cls = namespace[class_name]
    assert isinstance(cls, type)
    cls.ABSENT = frozenset(absent) | getattr(cls, "ABSENT", frozenset())  # type: ignore[attr-defined]
    for name, value in (class_attributes or {}).items():
        setattr(cls, name, value)
    cls.DPSIM_ORIGIN = Origin(path, version, class_name, tuple(wanted), code, namespace)  # type: ignore[attr-defined]
    return cls


def supply(cls: type, **values: Any) -> None:
    """Give a rebuilt class's methods globals known only after it was built
    (a class built from it, say), replacing their refusing stand-ins.
    ``globals_`` was copied when the class was built: writing into it later
    changes nothing."""
    origin: Origin = cls.DPSIM_ORIGIN  # type: ignore[attr-defined]
    origin.namespace.update(values)


def class_methods(
    path: Path, class_name: str, *, version: str | None
) -> tuple[str, ...]:
    """The methods (properties included) ``class_name`` defines in its own
    body in ``path``, in file order: what a caller may ask :func:`real_class`
    for when a method is optional across releases."""
    found = class_node(path, class_name, version=version)
    return tuple(
        dict.fromkeys(
            node.name
            for node in found.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        )
    )


def _owner(path: Path, version: str | None) -> str:
    return f"vLLM {version or '(this tree)'}'s {where.register_file(path)}"


def class_node(path: Path, class_name: str, *, version: str | None) -> ast.ClassDef:
    """The file's top-level class statement ``class_name``, parsed by the
    targets' one reader, for callers that read a class's bases or its
    builders' ``self.X =`` targets; a one-line :class:`TargetError` when
    there is none."""
    found = find_class(path, class_name)
    if found is None:
        raise TargetError(
            f"runner lane: {_owner(path, version)} has no class {class_name}"
        )
    return found


def find_class(path: Path, class_name: str) -> ast.ClassDef | None:
    """The file's top-level class statement ``class_name``, or None."""
    _, tree = parse_source(path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return node
    return None


def _literal_setting(node: ast.stmt) -> bool:
    """Whether ``node`` is a class-level setting with a literal value
    (``num_query_per_req: int = 1``): the rebuilt class keeps those, as the
    real one has them and they cannot run anything."""
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets, value = [node.target], node.value
    else:
        return False
    if not all(isinstance(target, ast.Name) for target in targets):
        return False
    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _decorator(
    node: ast.expr,
    replacements: Mapping[str, Callable[..., Any] | None],
    namespace: dict[str, Any],
) -> ast.expr | None:
    """A kept method's decorator as the rebuilt class applies it."""
    text = ast.unparse(node)
    if text not in replacements:
        return node
    value = replacements[text]
    if value is None:
        return None
    # Named by its text's position among the replacements: unique, stable.
    name = f"__dpsim_decorator_{list(replacements).index(text)}__"
    namespace[name] = value
    return ast.copy_location(ast.Name(name, ast.Load()), node)


def _unsupplied(name: str) -> Unsupplied:
    def refusal() -> ModelGap:
        at = where.vllm_location(sys._getframe(1)) or "(no vLLM frame)"
        return gap(f"name {name} read at {at} is not supplied")

    return Unsupplied(name, refusal)


def _nested_codes(code: CodeType) -> Iterator[CodeType]:
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            if constant.co_flags & 0x2:  # CO_NEWLOCALS: a function, not a class body
                yield constant
            yield from _nested_codes(constant)
