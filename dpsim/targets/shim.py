"""Executing real vLLM source files without importing vLLM.

vLLM's DP-sync code sits on top of a dependency tree (CUDA kernels, pydantic
configs, the model zoo) that has nothing to do with what it decides. Each
loaded target gets its own :class:`ModuleLoader`, whose modules see a private
``__import__``:

* the modules under test are executed from their real source files
  (:data:`EXECUTED`), with a tick call inserted at the top of every loop body
  so a simulator can bound a rank that spins forever;
* support modules that only lend a definition or two (``CUDAGraphMode``,
  the microbatching thresholds) are executed statement by statement, and a
  statement that needs a missing dependency leaves its names inert
  (:data:`LENIENT`);
* a few names whose behaviour matters get faithful stand-ins
  (:mod:`dpsim.targets.standins`);
* everything else under ``vllm`` and every third-party package other than
  torch and numpy is an inert stub.

``torch.distributed`` inside a target is :data:`runtime.DIST_PROXY`. Nothing is
left in ``sys.modules``: a module is registered there only while its own body
executes (dataclasses look their module up there), and the previous entry is
put back, so several versions load side by side and the interpreter ends as
it began.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import hashlib
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpsim.boundary import register_file
from dpsim.errors import TargetError
from dpsim.targets import runtime

#: Module names executed from source exactly; an error there is a load error.
EXECUTED = frozenset(
    {
        "vllm.v1.worker.gpu.dp_utils",
        "vllm.v1.worker.gpu.cudagraph_utils",
        "vllm.utils.math_utils",
    }
)
#: Module names executed statement by statement, tolerating missing dependencies.
LENIENT = frozenset(
    {
        "vllm.config.compilation",
        # ft_tp_barrier_required, which 0.34's sync calls (FT off: False).
        "vllm.config.fault_tolerance",
        "vllm.v1.worker.ubatch_utils",
        # Read for the LoRA cases a release captures (dpsim.targets.buildable).
        "vllm.v1.worker.gpu.lora_utils",
    }
)
#: Third-party packages that are imported for real; all others are stubs.
REAL_PACKAGES = frozenset({"torch", "numpy", "typing_extensions"})
TICK_NAME = "__dpsim_tick__"
#: Packages whose ``__init__`` re-exports names from these loaded submodules.
REEXPORTS = {"vllm.config": ("vllm.config.compilation",)}


@dataclass(frozen=True)
class LoadedFile:
    """One source file a target executed: where from, and its exact content."""

    module: str
    path: str
    sha256: str

    @classmethod
    def read(cls, module: str, path: Path) -> LoadedFile:
        """The record of ``path``, a file the target reads without executing
        it as ``module`` (a caller method cut from it, say)."""
        return cls(module, str(path), hashlib.sha256(path.read_bytes()).hexdigest())


def parse_source(path: Path) -> tuple[bytes, ast.Module]:
    """A target source file's bytes and syntax tree; a one-line
    :class:`TargetError` naming the file when it cannot be read or parsed."""
    try:
        data = path.read_bytes()
        return data, ast.parse(data, filename=str(path))
    except SyntaxError as error:
        raise TargetError(
            f"{path}:{error.lineno}: cannot parse ({error.msg})"
        ) from error
    except OSError as error:
        raise TargetError(f"cannot read {path}: {error.strerror}") from error


# -- inert stubs ---------------------------------------------------------------


class _StubMeta(type):
    """Stubs are classes, so they also serve as bases, annotations and decorators."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_dpsim_stub", False):
            # A real class that happens to derive from a stub.
            return super().__call__(*args, **kwargs)
        if len(args) == 1 and not kwargs and callable(args[0]):
            # Used as a bare decorator: leave the decorated thing as it was.
            return args[0]
        return stub(f"{cls.__qualname__}()")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __bool__(cls) -> bool:
        return False

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __enter__(cls) -> Any:
        return cls

    def __exit__(cls, *exc_info: Any) -> None:
        return None

    def __repr__(cls) -> str:
        return f"<inert stub {cls.__qualname__}>"


_stubs: dict[str, type] = {}


def stub(qualname: str) -> type:
    """The inert stand-in for ``qualname``; the same object every time."""
    made = _stubs.get(qualname)
    if made is None:
        made = _StubMeta(qualname.rsplit(".", 1)[-1], (), {"_dpsim_stub": True})
        made.__qualname__ = qualname
        _stubs[qualname] = made
    return made


def is_stub(value: Any) -> bool:
    return isinstance(value, _StubMeta) and value.__dict__.get("_dpsim_stub", False)


class ShimModule(types.ModuleType):
    """A module whose missing attributes are stubs or, for packages, submodules."""

    def __init__(self, name: str, loader: ModuleLoader) -> None:
        super().__init__(name)
        self.__dict__["_dpsim_loader"] = loader
        self.__path__: list[str] = []

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        value = self._dpsim_loader.child(self.__name__, attribute)
        setattr(self, attribute, value)
        return value


class TorchView(types.ModuleType):
    """``torch`` as loaded targets see it: the real one, but for ``distributed``."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.distributed = runtime.DIST_PROXY

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(torch, attribute)
        setattr(self, attribute, value)
        return value


TORCH_VIEW = TorchView()


# -- loop instrumentation ------------------------------------------------------


class _TickEveryLoop(ast.NodeTransformer):
    """Insert ``__dpsim_tick__.tick()`` as the first statement of every loop
    body, ``__dpsim_tick__`` being :data:`runtime.TICKS`."""

    def _tick(self, loop: ast.For | ast.While | ast.AsyncFor) -> ast.AST:
        self.generic_visit(loop)
        first = loop.body[0]
        ticks = ast.Name(TICK_NAME, ast.Load())
        call = ast.Expr(
            ast.Call(ast.Attribute(ticks, "tick", ast.Load()), args=[], keywords=[])
        )
        loop.body.insert(0, ast.copy_location(call, first))
        ast.fix_missing_locations(call)
        return loop

    def visit_For(self, node: ast.For) -> ast.AST:
        return self._tick(node)

    def visit_While(self, node: ast.While) -> ast.AST:
        return self._tick(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        return self._tick(node)


def _future_flags(tree: ast.Module) -> int:
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(__future__, alias.name, None)
                if feature is not None:
                    flags |= feature.compiler_flag
    return flags


def _bound_names(statement: ast.stmt) -> list[str]:
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [statement.name]
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return [(alias.asname or alias.name).split(".")[0] for alias in statement.names]
    names: list[str] = []
    targets: list[ast.expr] = []
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
        targets = [statement.target]
    for target in targets:
        names.extend(node.id for node in ast.walk(target) if isinstance(node, ast.Name))
    return names


# -- the loader ----------------------------------------------------------------


class ModuleLoader:
    """The private module world of one loaded target.

    ``package_dir`` is the directory that plays ``vllm/``; ``overrides`` maps
    module names to files that replace the package's own (a user's
    ``dp_utils.py``); ``stand_ins`` maps module names to the attributes they
    define for real; ``executed`` and ``lenient`` name the modules run from
    source, strictly and statement by statement (a runner's own sets: the V1
    runner executes other files than V2).
    """

    def __init__(
        self,
        package_dir: Path,
        *,
        overrides: Mapping[str, Path] | None = None,
        stand_ins: Mapping[str, Mapping[str, Any]] | None = None,
        executed: frozenset[str] = EXECUTED,
        lenient: frozenset[str] = LENIENT,
    ) -> None:
        self.package_dir = package_dir
        self.overrides = dict(overrides or {})
        self.stand_ins = dict(stand_ins or {})
        self.executed = executed
        self.lenient = lenient
        self.loaded: list[LoadedFile] = []
        self._modules: dict[str, types.ModuleType] = {}
        self._builtins = dict(builtins.__dict__)
        self._builtins["__import__"] = self._import

    # Resolution --------------------------------------------------------------

    def module(self, name: str) -> types.ModuleType:
        """The module ``name`` as this target sees it, loading it on first use."""
        found = self._modules.get(name)
        if found is not None:
            return found
        source = self.source_path(name)
        if name in self.stand_ins:
            made = self._stand_in(name)
        elif source is not None and name in self.executed:
            made = self._execute(name, source, lenient=False)
        elif source is not None and name in self.lenient:
            made = self._execute(name, source, lenient=True)
        else:
            made = ShimModule(name, self)
        self._modules[name] = made
        return made

    def child(self, parent: str, attribute: str) -> Any:
        """What ``parent.attribute`` is when the parent does not define it."""
        full = f"{parent}.{attribute}"
        if self._is_module(full):
            return self.module(full)
        for source in REEXPORTS.get(parent, ()):
            value = self.module(source).__dict__.get(attribute)
            if value is not None and not is_stub(value):
                return value
        return stub(full)

    def source_path(self, name: str) -> Path | None:
        if name in self.overrides:
            return self.overrides[name]
        parts = name.split(".")
        if parts[0] != "vllm":
            return None
        candidate = self.package_dir.joinpath(*parts[1:]).with_suffix(".py")
        return candidate if candidate.is_file() else None

    def _is_module(self, name: str) -> bool:
        if name in self._modules or name in self.stand_ins or name in self.overrides:
            return True
        parts = name.split(".")
        if parts[0] != "vllm":
            return False
        base = self.package_dir.joinpath(*parts[1:])
        return base.is_dir() or base.with_suffix(".py").is_file()

    # Module kinds --------------------------------------------------------------

    def _stand_in(self, name: str) -> types.ModuleType:
        made = ShimModule(name, self)
        for attribute, value in self.stand_ins[name].items():
            setattr(made, attribute, value)
        return made

    def _execute(self, name: str, path: Path, *, lenient: bool) -> types.ModuleType:
        data, tree = parse_source(path)
        # Its frames are the target's: whose an error is goes by them.
        register_file(path)
        tree = _TickEveryLoop().visit(tree)
        module: types.ModuleType = (
            ShimModule(name, self) if lenient else (types.ModuleType(name))
        )
        module.__file__ = str(path)
        module.__package__ = name.rpartition(".")[0]
        module.__dict__["__builtins__"] = self._builtins
        module.__dict__[TICK_NAME] = runtime.TICKS
        self._modules[name] = (
            module  # a cyclic import finds it half-built, as in Python
        )
        self.loaded.append(
            LoadedFile(name, str(path), hashlib.sha256(data).hexdigest())
        )
        previous = sys.modules.get(name)
        sys.modules[name] = module
        try:
            if lenient:
                self._run_leniently(module, tree, path)
            else:
                self._run_strictly(module, tree, path)
        finally:
            if previous is None:
                del sys.modules[name]
            else:
                sys.modules[name] = previous
        return module

    def _run_strictly(
        self, module: types.ModuleType, tree: ast.Module, path: Path
    ) -> None:
        code = _compile(tree, path)
        try:
            exec(code, module.__dict__)
        except TargetError:
            raise
        except SystemExit as error:
            raise _ended_loading(error, path) from None
        except Exception as error:
            line = innermost_line(error, str(path))
            raise TargetError(
                f"{path}{line}: executing it failed: {type(error).__name__}: {error}"
            ) from error

    def _run_leniently(
        self, module: types.ModuleType, tree: ast.Module, path: Path
    ) -> None:
        flags = _future_flags(tree)
        for statement in tree.body:
            unit = ast.Module(body=[statement], type_ignores=[])
            code = _compile(unit, path, flags)
            try:
                exec(code, module.__dict__)
            except SystemExit as error:
                raise _ended_loading(error, path) from None
            except Exception:
                for bound in _bound_names(statement):
                    module.__dict__.setdefault(
                        bound, stub(f"{module.__name__}.{bound}")
                    )

    # Import ----------------------------------------------------------------------

    def _import(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: tuple[str, ...] | list[str] | None = (),
        level: int = 0,
    ) -> Any:
        if level:
            name = _absolute(name, globals or {}, level)
        top = name.partition(".")[0]
        if top == "vllm":
            module = self.module(name)
            return module if fromlist else self.module("vllm")
        if top == "torch":
            real = builtins.__import__(name, None, None, fromlist or (), 0)
            if name == "torch.distributed" or name.startswith("torch.distributed."):
                return runtime.DIST_PROXY if fromlist else TORCH_VIEW
            if name == "torch" or not fromlist:
                return TORCH_VIEW
            return real
        if top in sys.stdlib_module_names or top in REAL_PACKAGES:
            return builtins.__import__(name, None, None, fromlist or (), 0)
        module = self._foreign(name)
        return module if fromlist else self._foreign(top)

    def _foreign(self, name: str) -> types.ModuleType:
        """A third-party package the target does not need: an inert module."""
        found = self._modules.get(name)
        if found is None:
            found = ShimModule(name, self)
            self._modules[name] = found
        return found


def _compile(tree: ast.Module, path: Path, flags: int = 0) -> types.CodeType:
    """Compile a parsed module; refuse one that parses but cannot compile.

    ``ast.parse`` accepts ``return`` or ``yield`` outside a function and a
    module-level ``nonlocal``; only ``compile`` rejects them, and even a
    lenient module is then not the file it claims to be.
    """
    try:
        return compile(tree, str(path), "exec", flags=flags, dont_inherit=True)
    except SyntaxError as error:
        raise TargetError(
            f"{path}:{error.lineno}: cannot compile ({error.msg})"
        ) from error


def _absolute(name: str, globals: Mapping[str, Any], level: int) -> str:
    package = globals.get("__package__") or ""
    base = package.rsplit(".", level - 1)[0] if level > 1 else package
    return f"{base}.{name}" if name else base


def _ended_loading(error: SystemExit, path: Path) -> TargetError:
    """A file that exits while it loads cannot be run: one line saying where.

    Not left to propagate: a ``SystemExit`` at import would end dpsim itself,
    with the file's exit status and no verdict.
    """
    line = innermost_line(error, str(path))
    return TargetError(
        f"{path}{line}: raised SystemExit({error.code!r}) while loading: "
        "dpsim cannot run it"
    )


def innermost_line(error: BaseException, path: str) -> str:
    """``":N"``, the innermost line of ``path`` in ``error``'s traceback (or
    ``""``): where in a target's own file loading it failed."""
    line = ""
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == path:
            line = f":{trace.tb_lineno}"
        trace = trace.tb_next
    return line


def function(module: types.ModuleType, name: str) -> Callable[..., Any] | None:
    """A real function defined by ``module``, or None (stubs do not count)."""
    value = module.__dict__.get(name)
    if value is None or is_stub(value) or not callable(value):
        return None
    return value
