"""Whether an edited text is a mutant: valid Python whose AST differs from the
original's, answered by reparsing the edited function alone where that gives
the same answer as reparsing the file.

Why: parsing and dumping a whole file per mutant was most of the cost of
generating mutants (0.1–0.3 s each for the runner lane's 3,000–7,000-line
files, hundreds of mutants a file). Every edit of a mutant lies inside one
function. When that function is a module-level def or a method of a
module-level class, its lines are a unit the tokenizer enters and leaves in
the same state as it would in the file: at the start of a line, outside any
bracket or string, at the unit's own indentation. So when the edited unit
parses on its own as one def (a method inside an ``if 1:`` block, which puts
the indentation stack where the class body does), the edited file parses too,
the rest of it into the same statements as before, and its AST equals the
original's exactly when the def's does (an AST dump leaves positions out).
Anything else (an edit outside such a def, a unit that does not parse alone,
one that parses as something other than one def) is answered by parsing the
whole file, as before.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from dpsim.mutate.source import Edit, SourceMap, within

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# A method's lines parsed alone: a block at the class body's indentation.
_METHOD_WRAPPER = "if 1:\n"


@dataclass(frozen=True)
class _Unit:
    """One def's whole lines: ``text[start:end]``, decorators included."""

    start: int
    end: int
    #: The def's own span (decorators to its last character): edits inside
    #: it, and only those, are judged on the unit.
    first: int
    last: int
    wrapper: str
    #: The original def's AST dump, parsed alone the same way.
    dump: str


class MutantJudge:
    """Answers, for edits of one original text, whether the edited text is a
    mutant (see the module docstring for why a def may be reparsed alone)."""

    def __init__(self, text: str) -> None:
        self.text = text
        tree = ast.parse(text)
        self._dump = ast.dump(tree)
        self._source = SourceMap(text)
        self._units = _units(text, tree, self._source)

    def is_mutant(self, mutated: str, edits: tuple[Edit, ...]) -> bool:
        """``mutated`` (the original with ``edits`` applied) parses, and its
        AST differs from the original's."""
        unit = self._unit_holding(edits)
        if unit is not None:
            answer = _judge_unit(self.text, unit, edits)
            if answer is not None:
                return answer
        try:
            tree = ast.parse(mutated)
        except SyntaxError:
            return False
        return ast.dump(tree) != self._dump

    def _unit_holding(self, edits: tuple[Edit, ...]) -> _Unit | None:
        if not edits:
            return None
        low = min(edit.start for edit in edits)
        high = max(edit.end for edit in edits)
        for unit in self._units:
            if unit.first <= low and high <= unit.last:
                return unit
        return None


def _judge_unit(text: str, unit: _Unit, edits: tuple[Edit, ...]) -> bool | None:
    """The answer from the unit alone, or None when the unit cannot give it."""
    edited = within(text[unit.start : unit.end], unit.start, edits)
    dump = _lone_def_dump(unit.wrapper + edited, unit.wrapper)
    return None if dump is None else dump != unit.dump


def _lone_def_dump(source: str, wrapper: str) -> str | None:
    """The dump of the one def ``source`` holds (inside ``wrapper``'s block
    when there is one), or None when it does not parse as exactly that."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    body = tree.body
    if wrapper:
        if len(body) != 1 or not isinstance(body[0], ast.If) or body[0].orelse:
            return None
        body = body[0].body
    if len(body) != 1 or not isinstance(body[0], _FUNCTIONS):
        return None
    return ast.dump(body[0])


def _units(text: str, tree: ast.Module, source: SourceMap) -> list[_Unit]:
    if len(text.splitlines()) != len(text.split("\n")) - text.endswith("\n"):
        # A line break Python and str.splitlines count differently (a form
        # feed, a lone carriage return): offsets by line would be off.
        return []
    found: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]] = []
    for node in tree.body:
        if isinstance(node, _FUNCTIONS):
            found.append((node, ""))
        elif isinstance(node, ast.ClassDef):
            found.extend(
                (member, _METHOD_WRAPPER)
                for member in node.body
                if isinstance(member, _FUNCTIONS)
            )
    units = (_unit(text, node, source, wrapper) for node, wrapper in found)
    return [unit for unit in units if unit is not None]


def _unit(
    text: str,
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    source: SourceMap,
    wrapper: str,
) -> _Unit | None:
    """The def's lines as a unit, or None when they hold anything but the def
    or sit at an indentation the wrapper does not reproduce."""
    first_line = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    start = source.offset(first_line, 0)
    line_end = text.find("\n", start)
    line = text[start:] if line_end < 0 else text[start:line_end]
    indent = line[: len(line) - len(line.lstrip())]
    if bool(indent) != bool(wrapper):
        return None
    first = start + len(indent)
    last = source.end(node)
    line_end = text.find("\n", last)
    end = len(text) if line_end < 0 else line_end + 1
    tail = text[last:end].strip()
    if tail and not tail.startswith("#"):
        return None
    # The unit parsed alone must be the def itself: this also catches a unit
    # whose lines hold anything else.
    dump = _lone_def_dump(wrapper + text[start:end], wrapper)
    if dump is None or dump != ast.dump(node):
        return None
    return _Unit(start, end, first, last, wrapper, dump)
