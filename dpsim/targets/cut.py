"""What running code cut out of a vLLM file needs, whoever cuts it.

The V1 caller (:mod:`dpsim.targets.v1.caller`) and the runner lane's real
classes (:mod:`dpsim.lanes.runner.extract`) both take methods out of a parsed
vLLM file and compile them with the file's real name and line numbers. Both
strip annotations (they name types dpsim does not load, and Python evaluates
them when a function is defined), both find the global names the methods use,
both give loops the shim's tick, and both put a refusing object behind a
global name dpsim does not supply. Those pieces live here, once.
"""

from __future__ import annotations

import ast
import builtins
import types
from collections.abc import Callable
from typing import Any, NoReturn


def free_names(node: ast.AST) -> set[str]:
    """Global names ``node`` loads: loaded, never bound inside, not builtins."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for part in ast.walk(node):
        if isinstance(part, ast.Name):
            (loaded if isinstance(part.ctx, ast.Load) else bound).add(part.id)
        elif isinstance(part, ast.arg):
            bound.add(part.arg)
        elif isinstance(part, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if part is not node:
                bound.add(part.name)
        elif isinstance(part, ast.alias):
            bound.add((part.asname or part.name).split(".")[0])
    return loaded - bound - set(dir(builtins))


def loaded_names(node: ast.AST) -> set[str]:
    """Every non-builtin name ``node`` loads anywhere, local or not.

    A superset of :func:`free_names`: a name bound in one nested scope and
    read as a global in another is in it. Giving each a global costs nothing
    where a local shadows it, and leaves no global read to fail as a bare
    ``NameError`` (which ``except Exception`` would hide).
    """
    return {
        part.id
        for part in ast.walk(node)
        if isinstance(part, ast.Name) and isinstance(part.ctx, ast.Load)
    } - set(dir(builtins))


class StripAnnotations(ast.NodeTransformer):
    """Drop annotations: they name types dpsim does not load, and change nothing."""

    def _strip(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)
        node.returns = None
        for argument in (
            *node.args.posonlyargs,
            *node.args.args,
            *node.args.kwonlyargs,
            *(a for a in (node.args.vararg, node.args.kwarg) if a is not None),
        ):
            argument.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return self._strip(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self._strip(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        assign = ast.Assign(targets=[node.target], value=node.value)
        return ast.copy_location(assign, node)


def tick() -> types.ModuleType:
    """What loaded code's loops tick, bound as ``TICK_NAME`` (imported late:
    the runtime imports torch)."""
    from dpsim.targets import runtime

    return runtime.TICKS


class Unsupplied:
    """A global name cut-out code uses that dpsim does not supply: any use of
    it raises ``refusal()`` instead of computing with a made-up value.

    Every way code can use a name goes through a dunder of the type (calls,
    attributes, truth, iteration, indexing, ``isinstance``, comparison,
    arithmetic, context managers), and each refuses; ``repr`` alone answers,
    so debuggers and error messages can show it.
    """

    def __init__(self, name: str, refusal: Callable[[], BaseException]) -> None:
        object.__setattr__(self, "_dpsim_name", name)
        object.__setattr__(self, "_dpsim_refusal", refusal)

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise object.__getattribute__(self, "_dpsim_refusal")()

    def __repr__(self) -> str:
        return f"<name {object.__getattribute__(self, '_dpsim_name')!r} dpsim does not supply>"

    __call__ = __getattr__ = __setattr__ = __bool__ = __iter__ = __len__ = _refuse
    __getitem__ = __setitem__ = __contains__ = __enter__ = __exit__ = _refuse
    __instancecheck__ = __subclasscheck__ = __mro_entries__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __or__ = __ror__ = __and__ = __rand__ = __index__ = __int__ = __float__ = _refuse
