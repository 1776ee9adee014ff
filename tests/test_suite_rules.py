"""The suite's own rules, checked on its source: no test that passes here and
flakes, skips or breaks elsewhere.

* Every Hypothesis ``find()`` is seeded (``random=``, or ``derandomize``) and
  has no example database: unseeded, a shrunk example differs from run to
  run, and a database replays one bad run's example in every later run of
  that checkout.
* No skip on ``geteuid()``: CI runs as root, so a test skipped for root never
  runs there (``plain_user.as_plain_user`` runs one as a plain user instead).
* No path outside the repository (the shared folder beside it, absolute
  ``/work`` paths, ``__file__``'s parents above the root): a clone has none.

The module's own examples of what breaks the rules are the patterns it looks
for, so it does not scan itself.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "properties")
#: Spelled in pieces so that this file's own text holds none of them whole.
SHARED = "../" + "shared"
WORK = "/" + "work"


def _suite() -> list[Path]:
    itself = Path(__file__).resolve()
    return [
        path
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.resolve() != itself
    ]


# -- find() -------------------------------------------------------------------


def _imports_hypothesis_find(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "hypothesis"
        and any(alias.name == "find" and alias.asname is None for alias in node.names)
        for node in ast.walk(tree)
    )


class _Settings:
    """What a ``settings=`` expression sets, followed through the module's
    own names: assignments, helper functions returning settings, a settings
    object a ``settings(...)`` call starts from, parameters' defaults."""

    def __init__(self, tree: ast.Module) -> None:
        self.assigned: dict[str, ast.expr] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.assigned.setdefault(target.id, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                if isinstance(node.target, ast.Name):
                    self.assigned.setdefault(node.target.id, node.value)
            elif isinstance(node, ast.FunctionDef):
                self.functions.setdefault(node.name, node)

    def keywords(
        self, node: ast.expr, bound: dict[str, ast.expr] | None = None, depth: int = 0
    ) -> dict[str, ast.expr]:
        bound = bound or {}
        if depth > 8:
            return {}
        if isinstance(node, ast.Name):
            value = bound.get(node.id, self.assigned.get(node.id))
            return {} if value is None else self.keywords(value, bound, depth + 1)
        if not isinstance(node, ast.Call):
            return {}
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        if name == "settings":
            found = self.keywords(node.args[0], bound, depth + 1) if node.args else {}
            for keyword in node.keywords:
                if keyword.arg is not None:
                    value = keyword.value
                    if isinstance(value, ast.Name) and value.id in bound:
                        value = bound[value.id]
                    found[keyword.arg] = value
            return found
        function = self.functions.get(name or "")
        if function is None:
            return {}
        returned = [n.value for n in ast.walk(function) if isinstance(n, ast.Return)]
        if len(returned) != 1 or returned[0] is None:
            return {}
        return self.keywords(returned[0], self._bind(function, node), depth + 1)

    @staticmethod
    def _bind(function: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr]:
        parameters = function.args.args
        defaults = function.args.defaults
        bound: dict[str, ast.expr] = {
            parameter.arg: default
            for parameter, default in zip(
                parameters[len(parameters) - len(defaults) :], defaults, strict=True
            )
        }
        for parameter, argument in zip(parameters, call.args, strict=False):
            bound[parameter.arg] = argument
        for keyword in call.keywords:
            if keyword.arg is not None:
                bound[keyword.arg] = keyword.value
        return bound


def _is(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _in_memory(node: ast.expr | None, resolver: _Settings) -> bool:
    """Whether ``node`` is an ``InMemoryExampleDatabase()`` (or a name bound to
    one): it lives as long as the test, so no run replays another's example."""
    if isinstance(node, ast.Name):
        node = resolver.assigned.get(node.id)
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None))
        == "InMemoryExampleDatabase"
    )


def unseeded_finds(source: str) -> list[str]:
    """Each ``find()`` call that is unseeded or may use an example database."""
    tree = ast.parse(source)
    if not _imports_hypothesis_find(tree):
        return []
    resolver = _Settings(tree)
    problems = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "find"
        ):
            continue
        given = {keyword.arg: keyword.value for keyword in node.keywords}
        settings = given.get("settings")
        set_ = {} if settings is None else resolver.keywords(settings)
        wrong = []
        if "random" not in given and not _is(set_.get("derandomize"), True):
            wrong.append("unseeded")
        database = set_.get("database")
        if not _is(database, None) and not _in_memory(database, resolver):
            wrong.append("with an example database")
        if wrong:
            problems.append(f"line {node.lineno}: find() {' and '.join(wrong)}")
    return problems


# -- skips for root -----------------------------------------------------------


def _mentions_geteuid(node: ast.AST) -> bool:
    return any(
        isinstance(inner, ast.Attribute | ast.Name)
        and getattr(inner, "attr", getattr(inner, "id", None)) == "geteuid"
        for inner in ast.walk(node)
    )


def _is_skip(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "skip"
    )


def root_skips(source: str) -> list[str]:
    """Each ``skipif`` on ``geteuid()``, and each ``pytest.skip`` an ``if`` on
    it leads to directly."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "skipif"
            and any(_mentions_geteuid(arg) for arg in node.args)
        ):
            problems.append(f"line {node.lineno}: skipif on geteuid()")
        if isinstance(node, ast.If) and _mentions_geteuid(node.test):
            for statement in node.body:
                if any(_is_skip(inner) for inner in ast.walk(statement)):
                    problems.append(f"line {node.lineno}: a skip when geteuid()")
                    break
    return problems


# -- paths outside the repository ---------------------------------------------


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, kinds) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


_FILE = r"__file__\)(?:\.resolve\(\)|\.absolute\(\))?"


def outside_paths(source: str, depth: int) -> list[str]:
    """Each path that leaves the repository from a file ``depth`` folders
    below its root: a string naming the shared folder beside it or ``/work``,
    or ``__file__``'s parents above the root. Docstrings are prose."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if id(node) not in prose and (
                SHARED in text or text == WORK or text.startswith(WORK + "/")
            ):
                problems.append(f"line {node.lineno}: {text[:60]!r}")
        elif isinstance(node, ast.Attribute | ast.Subscript):
            code = ast.unparse(node)
            up = re.fullmatch(rf".*{_FILE}((?:\.parent)+)", code)
            index = re.fullmatch(rf".*{_FILE}\.parents\[(\d+)\]", code)
            levels = up[1].count(".parent") if up else int(index[1]) + 1 if index else 0
            if levels > depth + 1:
                problems.append(f"line {node.lineno}: {code[:60]}")
    return problems


# -- the suite ----------------------------------------------------------------


def _broken(path: Path) -> Iterator[str]:
    source = path.read_text()
    depth = len(path.relative_to(ROOT).parts) - 1
    for problem in (
        *unseeded_finds(source),
        *root_skips(source),
        *outside_paths(source, depth),
    ):
        yield f"{path.relative_to(ROOT)} {problem}"


def test_the_suite_keeps_its_rules() -> None:
    suite = _suite()
    assert len(suite) > 50  # the scan found the suite
    assert [problem for path in suite for problem in _broken(path)] == []


# -- the checks catch what they are for --------------------------------------

FIND_HEADER = "from random import Random\nfrom hypothesis import find, settings\n"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("find(s, c)", ["line 4: find() unseeded and with an example database"]),
        ("find(s, c, random=Random(0))", ["line 4: find() with an example database"]),
        ("find(s, c, settings=settings(database=None))", ["line 4: find() unseeded"]),
        ("find(s, c, settings=settings(database=None), random=Random(0))", []),
        ("find(s, c, settings=settings(database=None, derandomize=True))", []),
        ("find(s, c, settings=NO_DB, random=Random(1))", []),
        ("find(s, c, settings=settings(NO_DB, max_examples=9), random=Random(1))", []),
        ("find(s, c, settings=config(), random=Random(0))", []),
        (
            "find(s, c, settings=settings(database=InMemoryExampleDatabase()),"
            " random=Random(0))",
            [],
        ),
        (
            "find(s, c, settings=config(database=DB), random=Random(0))",
            ["line 4: find() with an example database"],
        ),
    ],
)
def test_an_unseeded_find_or_one_with_a_database_is_found(
    call: str, expected: list[str]
) -> None:
    source = (
        FIND_HEADER
        + f"def test():\n    {call}\n"
        + "NO_DB = settings(database=None)\n"
        + "def config(database=None):\n    return settings(database=database)\n"
    )
    assert unseeded_finds(source) == expected


def test_a_find_that_is_not_hypothesis_is_left_alone() -> None:
    assert unseeded_finds("def test():\n    fast.find(s, c, seed=0)\n") == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "@pytest.mark.skipif(os.geteuid() == 0, reason='root')\ndef t(): ...\n",
            ["line 1: skipif on geteuid()"],
        ),
        (
            "def t():\n    if os.geteuid() == 0:\n        pytest.skip('root')\n",
            ["line 2: a skip when geteuid()"],
        ),
        # Failing where a root could install what is missing is no skip.
        ("def t():\n    if os.geteuid() == 0:\n        pytest.fail('x')\n", []),
    ],
)
def test_a_skip_for_root_is_found(source: str, expected: list[str]) -> None:
    assert root_skips(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (f"SEED = Path('{SHARED}/seeds/x.py')\n", 1),
        (f"SEED = Path('{WORK}/shared/seeds/x.py')\n", 1),
        ("SEED = Path(__file__).resolve().parents[2] / 'shared'\n", 1),
        ("SEED = Path(__file__).parent.parent.parent / 'shared'\n", 1),
        ("ROOT = Path(__file__).resolve().parents[1]\n", 0),
        ("ROOT = Path(__file__).parent.parent\n", 0),
        (f'"""Read beside it: {SHARED}/NOTES.md."""\n', 0),
    ],
)
def test_a_path_outside_the_repository_is_found(source: str, expected: int) -> None:
    assert len(outside_paths(source, depth=1)) == expected
