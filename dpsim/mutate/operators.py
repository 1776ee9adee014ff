"""Mutation operators: where a DP-sync function could plausibly be wrong.

Each operator looks at one AST node of a sync function and proposes sites (one
small text edit each). The generic ones (comparisons, booleans, dropped
statements, off-by-one) are the textbook set; ``min-max``, ``all-any`` and
``agreed-value`` are specific to DP code, where the bugs vLLM shipped were
reductions taken the wrong way (max for min, any for all) and a rank's own
value used where the value agreed across ranks was needed, or the reverse.

What is never mutated, and why:
- ``assert`` statements: they guard caller errors; a correct caller never
  trips them, so weakening one cannot be observed and strengthening one only
  tests the assert.
- docstrings, annotations, decorators, default argument values and logging
  calls: they do not change what a rank computes when called as vLLM calls it.
- the final ``return`` of a function: dropping it returns None, which every
  caller trips over at once; it would only inflate the score.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dpsim.mutate.source import Edit, SourceMap, within


@dataclass(frozen=True)
class Site:
    """One mutation, before it is applied: what, where, and the edits."""

    operator: str
    function: str
    line: int
    #: 1-based character column of the mutated node.
    column: int
    #: Tells apart mutations of the same node (``+1``/``-1``, a target name).
    variant: str
    description: str
    edits: tuple[Edit, ...]

    @property
    def id(self) -> str:
        suffix = f"/{self.variant}" if self.variant else ""
        return f"{self.operator}@{self.line}:{self.column}{suffix}"


_MIN_MAX = {"min": "max", "max": "min", "amin": "amax", "amax": "amin"}
_MIN_MAX |= {"minimum": "maximum", "maximum": "minimum"}
_ALL_ANY = {"all": "any", "any": "all"}
_REDUCTIONS = frozenset({"max", "min", "amax", "amin", "sum"})
# Operator token pattern in the gap between operands, and its flip.
_COMPARE_FLIPS: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Eq: (r"==", "!="),
    ast.NotEq: (r"!=", "=="),
    ast.Lt: (r"<(?![<=])", "<="),
    ast.LtE: (r"<=", "<"),
    ast.Gt: (r">(?![>=])", ">="),
    ast.GtE: (r">=", ">"),
    ast.Is: (r"\bis\b", "is not"),
    ast.IsNot: (r"\bis\s+not\b", "is"),
    ast.In: (r"\bin\b", "not in"),
    ast.NotIn: (r"\bnot\s+in\b", "in"),
}
_ARITH_FLIPS: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: (r"\+", "-"),
    ast.Sub: (r"-", "+"),
    ast.Mult: (r"\*(?!\*)", "//"),
    ast.FloorDiv: (r"//", "*"),
}
# Counts, sizes and ranks: the ints an off-by-one bites.
_COUNT_NAME = re.compile(
    r"^(num_\w+|\w+_(count|len|size|tokens|reqs|rank|loras|ubatches))$"
)
_AGREED_PREFIX = "synced_"
_ACROSS_SUFFIX = "_across_dp"


class Scope:
    """What the operators need to know about one function: its names, which
    of them are ints, and which per-rank value each ``*_across_dp`` row holds."""

    def __init__(self, source: SourceMap, function: ast.FunctionDef) -> None:
        self.source = source
        self.function = function
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(function):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        arguments = function.args
        params = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        self.names: set[str] = {param.arg for param in params}
        #: Offset from which a name is bound (parameters: the whole body).
        self.bound_from: dict[str, int] = {
            param.arg: source.start(function) for param in params
        }
        self.ints: set[str] = {
            param.arg
            for param in params
            if isinstance(param.annotation, ast.Name) and param.annotation.id == "int"
        }
        assigned: dict[str, list[ast.expr]] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Name):
                self.names.add(node.id)
                if isinstance(node.ctx, ast.Store):
                    statement = self.statement_of(node)
                    self.bound_from.setdefault(node.id, source.end(statement))
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                # `x: int | None = None` makes x no int, whatever comes later.
                annotation = node.annotation
                is_int = isinstance(annotation, ast.Name) and annotation.id == "int"
                assigned.setdefault(node.target.id, []).append(
                    node.value if is_int and node.value else ast.Constant(None)
                )
        self.ints |= {
            name
            for name, values in assigned.items()
            if all(_is_int_expr(value) for value in values)
        }
        #: ``num_tokens_across_dp`` -> the source of the per-rank value its row
        #: holds (``num_tokens``), from ``tensor[i][dp_rank] = value`` and
        #: ``x_across_dp = tensor[i]``, or failing that from the name.
        self.own_value: dict[str, str] = {}
        rows: dict[tuple[str, int], str] = {}
        for node in ast.walk(function):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target = node.targets[0]
            row = _row_of(target.value) if isinstance(target, ast.Subscript) else None
            if row is not None:
                rows[row] = source.segment(node.value)
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.endswith(_ACROSS_SUFFIX)
            ):
                row = _row_of(node.value)
                if row is not None and row in rows:
                    self.own_value[node.targets[0].id] = rows[row]
        for name in self.names:
            if name.endswith(_ACROSS_SUFFIX) and name not in self.own_value:
                stem = name[: -len(_ACROSS_SUFFIX)]
                for own in (stem, stem.removesuffix("s")):
                    if own in self.names and own != name:
                        self.own_value[name] = own
                        break

    def statement_of(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parents[node]
        return node

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(node)

    def site(
        self,
        operator: str,
        node: ast.AST,
        description: str,
        edits: tuple[Edit, ...] | Edit,
        variant: str = "",
    ) -> Site:
        start = self.source.start(node)
        line = self.source.line_of(start)
        line_start = self.source.offset(line, 0)
        return Site(
            operator=operator,
            function=self.function.name,
            line=line,
            column=start - line_start + 1,
            variant=variant,
            description=description,
            edits=edits if isinstance(edits, tuple) else (edits,),
        )

    def is_bound(self, name: str, node: ast.AST) -> bool:
        bound = self.bound_from.get(name)
        return bound is not None and bound <= self.source.start(node)


def _row_of(node: ast.expr) -> tuple[str, int] | None:
    """``tensor[i]`` -> ("tensor", i); ``tensor[i][rank]`` is passed as its value."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
        and type(node.slice.value) is int
    ):
        return node.value.id, node.slice.value
    return None


def _is_int_expr(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "int"
    )


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _name_token(scope: Scope, call: ast.Call, replacement: str) -> Edit:
    """The edit renaming what ``call`` calls: ``min(`` or the ``.min`` of ``x.min(``."""
    func = call.func
    end = scope.source.end(func)
    if isinstance(func, ast.Attribute):
        return Edit(end - len(func.attr), end, replacement)
    return scope.source.replace(func, replacement)


def _swap_call(operator: str, table: dict[str, str]) -> Operator:
    def mutate(scope: Scope, node: ast.AST) -> Iterator[Site]:
        if not isinstance(node, ast.Call):
            return
        name = _called_name(node)
        if name in table:
            swapped = table[name]
            yield scope.site(
                operator,
                node,
                f"{name}(...) -> {swapped}(...)",
                _name_token(scope, node, swapped),
            )

    return mutate


def compare(scope: Scope, node: ast.AST) -> Iterator[Site]:
    if not isinstance(node, ast.Compare):
        return
    operands = [node.left, *node.comparators]
    for index, op in enumerate(node.ops):
        flip = _COMPARE_FLIPS.get(type(op))
        if flip is None:
            continue
        pattern, replacement = flip
        edit = scope.source.token_between(
            scope.source.end(operands[index]),
            scope.source.start(operands[index + 1]),
            pattern,
            replacement,
        )
        if edit is None:
            continue
        token = scope.source.text[edit.start : edit.end]
        yield scope.site(
            "compare",
            node,
            f"{token} -> {replacement}",
            edit,
            variant=str(index) if len(node.ops) > 1 else "",
        )


def boolean(scope: Scope, node: ast.AST) -> Iterator[Site]:
    source = scope.source
    if isinstance(node, ast.BoolOp):
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits = []
        for left, right in zip(node.values, node.values[1:], strict=False):
            edit = source.token_between(
                source.end(left), source.start(right), rf"\b{old}\b", new
            )
            if edit is not None:
                edits.append(edit)
        if edits:
            yield scope.site("boolean", node, f"{old} -> {new}", tuple(edits))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        edit = source.token_between(
            source.start(node), source.start(node.operand), r"\bnot\b\s*", ""
        )
        if edit is not None:
            yield scope.site("boolean", node, "not x -> x", edit, variant="not")
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        flipped = str(not node.value)
        yield scope.site(
            "boolean", node, f"{node.value} -> {flipped}", source.replace(node, flipped)
        )


def arith(scope: Scope, node: ast.AST) -> Iterator[Site]:
    if not isinstance(node, ast.BinOp):
        return
    flip = _ARITH_FLIPS.get(type(node.op))
    if flip is None:
        return
    pattern, replacement = flip
    source = scope.source
    edit = source.token_between(
        source.end(node.left), source.start(node.right), pattern, replacement
    )
    if edit is not None:
        token = source.text[edit.start : edit.end]
        yield scope.site("arith", node, f"{token} -> {replacement}", edit)


def drop(scope: Scope, node: ast.AST) -> Iterator[Site]:
    if not isinstance(node, ast.stmt) or isinstance(
        node, ast.Pass | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    ):
        return
    if node is scope.function.body[-1] and isinstance(node, ast.Return):
        return
    first_line = scope.source.segment(node).splitlines()[0].strip()
    if len(first_line) > 60:
        first_line = first_line[:57] + "..."
    label = "early return" if isinstance(node, ast.Return) else "statement"
    yield scope.site(
        "drop",
        node,
        f"drop {label}: {first_line}",
        scope.source.replace(node, "pass"),
    )


def agreed_value(scope: Scope, node: ast.AST) -> Iterator[Site]:
    """A rank's own value where the agreed one belongs, and the reverse."""
    source = scope.source
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        # synced_X <-> X, each where the other is bound.
        swaps = [(_AGREED_PREFIX + node.id, "the agreed value", "agreed")]
        own = node.id.removeprefix(_AGREED_PREFIX)
        if own != node.id:
            swaps.append((own, "this rank's own", ""))
        for name, label, variant in swaps:
            if name in scope.names and scope.is_bound(name, node):
                yield scope.site(
                    "agreed-value",
                    node,
                    f"{node.id} -> {name} ({label})",
                    source.replace(node, name),
                    variant=variant,
                )
        # X -> its reduction across ranks, once the all-reduced row is bound.
        for row, own_text in sorted(scope.own_value.items()):
            if own_text == node.id and scope.is_bound(row, node):
                replacement = f"int({row}.max())"
                yield scope.site(
                    "agreed-value",
                    node,
                    f"{node.id} -> {replacement} (the largest across ranks)",
                    source.replace(node, replacement),
                    variant=row,
                )
    reduced = _across_read(scope, node)
    if reduced is not None:
        across, inner = reduced
        own = scope.own_value[across.id]
        if inner is None:
            replacement = f"({own})"
        else:
            # all(x_across_dp == v) -> (own == v): this rank decides alone.
            replacement = "bool({})".format(
                within(
                    source.segment(inner),
                    source.start(inner),
                    (source.replace(across, f"({own})"),),
                )
            )
        yield scope.site(
            "agreed-value",
            node,
            f"{source.segment(node)} -> {replacement} (this rank's own)",
            source.replace(node, replacement),
            variant="own",
        )
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.value, ast.Name)
        and "sync" in node.value.id
        and node.attr in scope.names
        and not isinstance(scope.parent(node), ast.Attribute | ast.Subscript)
    ):
        yield scope.site(
            "agreed-value",
            node,
            f"{source.segment(node)} -> {node.attr} (this rank's own)",
            source.replace(node, node.attr),
            variant="own",
        )


def _across_read(
    scope: Scope, node: ast.AST
) -> tuple[ast.Name, ast.expr | None] | None:
    """The outermost read of an all-reduced row that yields a value agreed by
    every rank: ``x_across_dp[i]``, ``x_across_dp.max()`` (``.item()`` or not),
    or ``torch.all(x_across_dp == v)``; with the row, and the comparison inside
    an all/any."""
    core = node
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "item"
        and not node.args
    ):
        core = node.func.value
    else:
        parent = scope.parent(node)
        if isinstance(parent, ast.Attribute) and parent.attr == "item":
            return None  # the .item() call around it is the read
    if isinstance(core, ast.Subscript) and isinstance(core.ctx, ast.Load):
        across = core.value
        inner = None
    elif isinstance(core, ast.Call):
        name = _called_name(core)
        if name in _REDUCTIONS and isinstance(core.func, ast.Attribute):
            across, inner = core.func.value, None
        elif name in _ALL_ANY:
            # torch.all(x == v), all(x == v) or (x == v).all()
            if len(core.args) == 1:
                inner_expr: ast.expr | None = core.args[0]
            elif not core.args and isinstance(core.func, ast.Attribute):
                inner_expr = core.func.value
            else:
                inner_expr = None
            if not isinstance(inner_expr, ast.Compare):
                return None
            rows = [
                operand
                for operand in (inner_expr.left, *inner_expr.comparators)
                if isinstance(operand, ast.Name) and operand.id in scope.own_value
            ]
            if len(rows) != 1:
                return None
            across, inner = rows[0], inner_expr
        else:
            return None
    else:
        return None
    if not isinstance(across, ast.Name) or across.id not in scope.own_value:
        return None
    return across, inner


def off_by_one(scope: Scope, node: ast.AST) -> Iterator[Site]:
    source = scope.source
    if isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            value = node.value + delta
            text = str(value) if value >= 0 else f"({value})"
            yield scope.site(
                "off-by-one",
                node,
                f"{node.value} -> {value}",
                source.replace(node, text),
                variant=f"{delta:+d}",
            )
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        if node.id not in scope.ints or not _COUNT_NAME.match(node.id):
            return
        parent = scope.parent(node)
        if isinstance(parent, ast.Attribute | ast.Subscript) and parent.value is node:
            return
    elif isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id == "int"):
            return
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        # A descriptor's token count; its num_reqs may be None.
        if node.attr != "num_tokens":
            return
        parent = scope.parent(node)
        if isinstance(parent, ast.Attribute | ast.Subscript | ast.Call) and (
            getattr(parent, "value", None) is node
            or getattr(parent, "func", None) is node
        ):
            return
    else:
        return
    segment = source.segment(node)
    for delta, sign in ((1, "+"), (-1, "-")):
        replacement = f"({segment} {sign} 1)"
        yield scope.site(
            "off-by-one",
            node,
            f"{segment} -> {segment} {sign} 1",
            source.replace(node, replacement),
            variant=f"{delta:+d}",
        )


Operator = Callable[[Scope, ast.AST], Iterator[Site]]

#: Every operator by name, in the order their mutants are listed.
OPERATORS: dict[str, Operator] = {
    "min-max": _swap_call("min-max", _MIN_MAX),
    "all-any": _swap_call("all-any", _ALL_ANY),
    "agreed-value": agreed_value,
    "compare": compare,
    "boolean": boolean,
    "drop": drop,
    "off-by-one": off_by_one,
    "arith": arith,
}
OPERATOR_NAMES = tuple(OPERATORS)
