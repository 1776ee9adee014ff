"""Which lines and branches of a target file count: its chosen functions' bodies.

A :class:`Scope` names one source file and the functions in it whose code is
the target's (every function of ``dp_utils.py``; a manager's ``dispatch`` and
the methods it calls on ``self``). :func:`analyse` reads the file as it is on
disk and asks coverage.py's parser (the same static analysis its own reports
use) which lines are statements and which arcs between them are possible;
both are kept only inside the chosen bodies, so module-level code (run once
when the file loads, or never, when dpsim cuts a method out of a file) does
not count. A branch is an arc leaving a line that has more than one way out;
an arc into a function's exit is written with destination :data:`EXIT`,
whatever code object it leaves, because a method cut out and compiled without
its decorators starts on another line than the file's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from coverage.parser import PythonParser

from dpsim.errors import TargetError

#: Destination of an arc that leaves the function.
EXIT = -1

Arc = tuple[int, int]


@dataclass(frozen=True)
class Scope:
    """One file's chosen functions (qualified names, ``Class.method``); every
    function and method in the file when ``functions`` is None."""

    path: str
    #: How reports name the file: its path below ``vllm/`` ("v1/worker/gpu/dp_utils.py").
    display: str
    functions: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Function:
    """One chosen function: its qualified name and the lines of its body."""

    name: str
    def_line: int
    first: int
    last: int


@dataclass(frozen=True)
class ScopeAnalysis:
    """What can run in a scope, from the source alone."""

    scope: Scope
    functions: tuple[Function, ...]
    #: Statement lines (a statement spanning lines counts as its first).
    statements: frozenset[int]
    #: Every possible arc leaving a line with more than one way out.
    branches: frozenset[Arc]
    #: The file's source lines (1-based: ``source[line - 1]``).
    source: tuple[str, ...]
    parser: PythonParser

    def function_at(self, line: int) -> str | None:
        """The innermost chosen function whose body holds ``line``."""
        found = None
        for function in self.functions:
            if function.first <= line <= function.last and (
                found is None or function.first >= found.first
            ):
                found = function
        return found.name if found else None

    def text(self, line: int) -> str:
        """Line ``line`` stripped; "exit" for :data:`EXIT`."""
        if line == EXIT:
            return "exit"
        return self.source[line - 1].strip() if 0 < line <= len(self.source) else ""

    def executed(
        self, lines: Iterable[int], arcs: Iterable[Arc]
    ) -> tuple[frozenset[int], frozenset[Arc]]:
        """Raw traced lines and arcs as this scope counts them: mapped to
        their statements' first lines, exits normalised, kept in scope."""
        ran = self.parser.translate_lines(lines) & self.statements
        taken = {
            (start, EXIT if end < 0 else end)
            for start, end in self.parser.translate_arcs(arcs)
        }
        return frozenset(ran), frozenset(taken & self.branches)


def combined(scopes: Iterable[Scope]) -> tuple[Scope, ...]:
    """``scopes`` with one scope per file (the first one's display name, the
    functions of all in the order first given; every function if any says so)."""
    by_path: dict[str, list[Scope]] = {}
    for scope in scopes:
        by_path.setdefault(scope.path, []).append(scope)
    merged = []
    for path, group in by_path.items():
        functions: tuple[str, ...] | None = None
        if all(scope.functions is not None for scope in group):
            functions = tuple(
                dict.fromkeys(name for scope in group for name in scope.functions or ())
            )
        merged.append(Scope(path, group[0].display, functions))
    return tuple(merged)


def analyse(scope: Scope) -> ScopeAnalysis:
    """The static analysis of ``scope``; a one-line TargetError when the file
    cannot be read or a chosen function is not in it."""
    return _analyse(scope)


@lru_cache(maxsize=64)
def _analyse(scope: Scope) -> ScopeAnalysis:
    try:
        text = Path(scope.path).read_text(encoding="utf-8")
        tree = ast.parse(text, filename=scope.path)
    except (OSError, SyntaxError, ValueError) as error:
        raise TargetError(
            f"target coverage cannot read {scope.path}: {error}"
        ) from error
    found = {function.name: function for function in _functions(tree.body, "")}
    if scope.functions is None:
        chosen = tuple(found.values())
    else:
        unknown = [name for name in scope.functions if name not in found]
        if unknown:
            raise TargetError(
                f"target coverage: {scope.display} has no function {unknown[0]}"
            )
        chosen = tuple(found[name] for name in scope.functions)
    parser = PythonParser(text=text, filename=scope.path)
    parser.parse_source()

    def inside(line: int) -> bool:
        return any(function.first <= line <= function.last for function in chosen)

    statements = frozenset(line for line in parser.statements if inside(line))
    exits = parser.exit_counts()
    branching = {line for line in statements if exits.get(line, 0) > 1}
    branches = frozenset(
        (start, EXIT if end < 0 else end)
        for start, end in parser.arcs()
        if start in branching
    )
    return ScopeAnalysis(
        scope, chosen, statements, branches, tuple(text.splitlines()), parser
    )


def _functions(body: list[ast.stmt], prefix: str) -> Iterator[Function]:
    """Every function and method of a module or class body, nested classes
    included (functions nested in functions belong to their outer one)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            yield Function(
                prefix + node.name, node.lineno, node.body[0].lineno, node.end_lineno
            )
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node.body, f"{prefix}{node.name}.")


def self_calls(path: str, qualname: str) -> tuple[str, ...]:
    """``qualname`` (``Class.method``) and what one call of it can run in its
    own file: the methods of its class it calls on ``self`` and the file's
    module-level functions it calls by name, transitively, in the order first
    reached."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    class_name = qualname.rpartition(".")[0]
    Def = ast.FunctionDef | ast.AsyncFunctionDef
    #: Qualified name -> definition, for the class's methods and the module's functions.
    known: dict[str, Def] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            known[node.name] = node
        elif isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    known[f"{class_name}.{item.name}"] = item
    if qualname not in known:
        raise TargetError(f"target coverage: {Path(path).name} has no {qualname}")
    order = [qualname]
    for name in order:  # grows while walked
        for inner in ast.walk(known[name]):
            called = None
            if (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.value, ast.Name)
                and inner.value.id == "self"
            ):
                called = f"{class_name}.{inner.attr}"
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                called = inner.func.id
            if called in known and called not in order:
                order.append(called)
    return tuple(order)
