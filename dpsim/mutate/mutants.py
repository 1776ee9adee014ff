"""Mutants of one ``dp_utils.py``: every operator over every sync function.

Only the module's functions are mutated (the sync and its helpers), never the
``DPSyncState`` class or imports, and never the manager: dpsim runs vLLM's own
``CudaGraphManager``, and mutation testing asks whether the properties notice a
wrong *sync*. A file of which dpsim runs one method only (V1's caller in
``gpu_model_runner.py``) names it, and only that method is mutated. Mutants are
produced from the text at run time and written only to a temporary directory,
so no vLLM code lands in this repository.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dpsim.errors import UsageError
from dpsim.mutate.operators import OPERATOR_NAMES, OPERATORS, Scope, Site
from dpsim.mutate.reparse import MutantJudge
from dpsim.mutate.source import SourceMap, apply, unified_diff


@dataclass(frozen=True)
class Mutant:
    """The original text with one mutation applied."""

    id: str
    operator: str
    function: str
    line: int
    description: str
    text: str = ""

    def diff(self, original: str, name: str = "dp_utils.py") -> str:
        return unified_diff(original, self.text, name, self.id)


def select_operators(names: Iterable[str] | None) -> tuple[str, ...]:
    """The operators named (all when none), refusing unknown names clearly."""
    chosen = tuple(dict.fromkeys(names or ()))
    for name in chosen:
        if name not in OPERATORS:
            raise UsageError(
                f"unknown operator {name!r}; known: {', '.join(OPERATOR_NAMES)}"
            )
    return chosen or OPERATOR_NAMES


def sites(
    text: str,
    operators: Iterable[str] | None = None,
    functions: tuple[str, ...] | None = None,
) -> list[Site]:
    """Every mutation the chosen operators propose for ``text``'s functions:
    every module-level one, or only those ``functions`` names (qualified,
    ``Class.method``) and the closures they define."""
    chosen = select_operators(operators)
    tree = ast.parse(text)
    source = SourceMap(text)
    found: list[Site] = []
    for function in _mutable_functions(tree, functions):
        scope = Scope(source, function)
        for node in _live_nodes(function):
            for name in chosen:
                found.extend(OPERATORS[name](scope, node))
    order = {name: index for index, name in enumerate(OPERATOR_NAMES)}
    found.sort(key=lambda site: (site.line, site.column, order[site.operator]))
    return found


def generate(
    text: str,
    operators: Iterable[str] | None = None,
    functions: tuple[str, ...] | None = None,
) -> tuple[Mutant, ...]:
    """The mutants of ``text`` (of ``functions`` only, when named, as
    :func:`sites`): each valid Python, each different from the original and
    from every other (a site that yields a text already seen is the same
    mutant under another name, and is dropped)."""
    judge = MutantJudge(text)
    seen = {text}
    ids: set[str] = set()
    mutants = []
    for site in sites(text, operators, functions):
        mutated = apply(text, site.edits)
        # Invalid Python is an operator bug, not a mutant: never hand it to
        # the checker.
        if mutated in seen or not judge.is_mutant(mutated, site.edits):
            continue
        seen.add(mutated)
        mutant_id = site.id
        suffix = 2
        while mutant_id in ids:
            mutant_id = f"{site.id}#{suffix}"
            suffix += 1
        ids.add(mutant_id)
        mutants.append(
            Mutant(
                id=mutant_id,
                operator=site.operator,
                function=site.function,
                line=site.line,
                description=site.description,
                text=mutated,
            )
        )
    return tuple(mutants)


def defined_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Module-level functions and class methods by qualified name."""
    found: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef):
                    found[f"{node.name}.{member.name}"] = member
    return found


def _mutable_functions(
    tree: ast.Module, functions: tuple[str, ...] | None
) -> Iterator[ast.FunctionDef]:
    if functions is None:
        yield from (node for node in tree.body if isinstance(node, ast.FunctionDef))
        return
    defined = defined_functions(tree)
    for name in functions:
        if name not in defined:
            raise UsageError(f"no function {name!r} to mutate")
        # A named method's closures are its logic too (V1's caller dispatches
        # through one), each mutated in a scope of its own.
        yield from (
            node
            for node in ast.walk(defined[name])
            if isinstance(node, ast.FunctionDef)
        )


def _live_nodes(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``function``'s body that change what a rank computes, in
    source order (see the operators module for what is left out and why)."""
    body = function.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    for statement in body:
        yield from _visit(statement)


def _visit(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(
        node,
        ast.Assert
        | ast.JoinedStr
        | ast.FunctionDef
        | ast.AsyncFunctionDef
        | ast.Lambda,
    ):
        return
    if isinstance(node, ast.Expr) and _is_logging(node.value):
        return
    yield node
    if isinstance(node, ast.AnnAssign):
        children: list[ast.AST] = [node.target]
        if node.value is not None:
            children.append(node.value)
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _visit(child)


def _is_logging(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in {"logger", "logging", "log"}
    )
