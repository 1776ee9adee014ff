"""Imports run down the layers: nothing below the commands imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import dpsim

PACKAGE = Path(dpsim.__file__).parent


def _imported(tree: ast.AST) -> set[str]:
    """Every module an import statement in ``tree`` names, at any depth."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_imports_below_the_cli_reach_a_cli_import() -> None:
    # The probe must see an import written inside a function, as the suite's
    # configuration once had.
    tree = ast.parse("def f():\n    from dpsim.cli.check import parse_ranks\n")
    assert "dpsim.cli.check" in _imported(tree)
    tree = ast.parse("from dpsim import cli\n")
    assert "dpsim.cli" in _imported(tree)


def test_nothing_outside_the_cli_imports_it() -> None:
    cli = PACKAGE / "cli"
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if cli not in path.parents
        for name in sorted(_imported(ast.parse(path.read_text(), str(path))))
        if name == "dpsim.cli" or name.startswith("dpsim.cli.")
    ]
    assert offenders == []
