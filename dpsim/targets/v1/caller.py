"""The V1 caller method, taken out of ``gpu_model_runner.py`` and made runnable.

From 0.12 ``GPUModelRunner._determine_batch_execution_and_padding`` decides a
step's cudagraph mode, padding and microbatching around the DP sync. The file
around it imports half of vLLM, so it is not executed: the method (and every
method of the class it calls on ``self``) is cut out of the parsed file,
stripped of decorators and annotations (annotations name types dpsim does not
load, and Python evaluates them when a function is defined), given a tick in
every loop like any loaded code, and compiled with the file's real name and
line numbers, so tracebacks and coverage name vLLM's lines.

What the method reads off ``self`` is found by walking its syntax tree for
``self.x.y`` chains, as :mod:`dpsim.targets.adapters` reads V2's signatures;
:func:`runner_self` then builds a strict stand-in answering exactly the
chains dpsim models (:data:`MODELLED_READS`) and raising, with the line that
reads it, on any other.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, MethodType
from typing import Any

from dpsim.boundary import register_file
from dpsim.errors import TargetError
from dpsim.targets.cut import StripAnnotations, Unsupplied, free_names, tick
from dpsim.targets.shim import TICK_NAME, _TickEveryLoop, parse_source
from dpsim.targets.v1.strict import StrictView, view_of_paths

RUNNER_CLASS = "GPUModelRunner"
CALLER_METHOD = "_determine_batch_execution_and_padding"
OWNER = RUNNER_CLASS

#: The chains of ``self`` attributes dpsim answers, and what each holds (a
#: name of :class:`RunnerState`'s fields). A chain the method reads that
#: extends one of these (``self.cudagraph_dispatcher.dispatch``) is the held
#: object's own business.
MODELLED_READS: dict[tuple[str, ...], str] = {
    ("uniform_decode_query_len",): "uniform_decode_query_len",
    ("cudagraph_dispatcher",): "dispatcher",
    ("input_batch", "lora_id_to_lora_request"): "lora_requests",
    ("parallel_config",): "parallel_config",
    ("vllm_config", "parallel_config"): "parallel_config",
    ("compilation_config", "cudagraph_mode"): "cudagraph_mode",
    ("vllm_config", "compilation_config", "cudagraph_mode"): "cudagraph_mode",
    # Sequence parallelism (0.12-0.32's _pad_for_sequence_parallelism) is
    # outside what dpsim models: off, as by default.
    ("compilation_config", "pass_config", "enable_sp"): "off",
    ("vllm_config", "compilation_config", "pass_config", "enable_sp"): "off",
    ("model_config", "is_encoder_decoder"): "encoder_decoder",
    # CUDA-graph metrics change no decision; off, as by default.
    ("vllm_config", "observability_config", "cudagraph_metrics"): "off",
}


@dataclass(frozen=True)
class Method:
    """One method cut out of the runner class."""

    name: str
    node: ast.FunctionDef = field(repr=False)
    static: bool
    first_line: int
    last_line: int
    #: Each ``self`` attribute chain it reads, with the first line reading it.
    reads: dict[tuple[str, ...], int] = field(repr=False)


@dataclass(frozen=True)
class Caller:
    """The caller method of one release, ready to run on a stand-in ``self``."""

    path: Path
    version: str | None
    entry: Method
    #: Every method extracted, the entry first.
    methods: tuple[Method, ...]
    functions: dict[str, Callable[..., Any]] = field(repr=False)
    #: The entry's parameters, as vLLM declares them.
    parameters: tuple[str, ...]
    #: Those of them its body never reads (0.32's ``use_cascade_attn``,
    #: kept "for out-of-tree model runners" and ignored).
    ignored: tuple[str, ...]
    #: Chains read that dpsim answers; reading any other raises.
    answered: tuple[tuple[str, ...], ...]
    #: Chains read that dpsim does not answer (they raise if reached).
    unanswered: tuple[tuple[str, ...], ...]
    #: Global names the methods use, and whether dpsim supplies each.
    globals_used: dict[str, bool] = field(repr=False)

    @property
    def function(self) -> Callable[..., Any]:
        return self.functions[self.entry.name]

    # Read by every call of every rank (runner_self): worked out once.
    @functools.cached_property
    def modelled_reads(self) -> tuple[tuple[tuple[str, ...], str], ...]:
        """Per answered chain that is not one of the methods, in order, the
        modelled prefix that answers it and the state value it reads."""
        reads = []
        for chain in self.answered:
            if len(chain) == 1 and chain[0] in self.functions:
                continue
            prefix = _modelled_prefix(chain)
            assert prefix is not None
            reads.append((prefix, MODELLED_READS[prefix]))
        return tuple(reads)

    def invoke(self, state: RunnerState, arguments: dict[str, Any]) -> tuple[Any, ...]:
        """Run the method for one rank, on a stand-in ``self`` holding ``state``."""
        return tuple(self.function(runner_self(self, state), **arguments))

    @property
    def lines(self) -> str:
        return f"{self.path.name}:{self.entry.first_line}-{self.entry.last_line}"

    def where(self, dotted: str) -> str:
        """Where vLLM reads ``self.<dotted>`` (for a stand-in's refusal)."""
        wanted = tuple(dotted.split("."))
        for method in self.methods:
            for chain, line in sorted(method.reads.items(), key=lambda item: item[1]):
                if chain[: len(wanted)] == wanted:
                    return (
                        f"vLLM {self.version or '(this tree)'} reads it in "
                        f"{RUNNER_CLASS}.{method.name}, {self.path.name}:{line}"
                    )
        return (
            f"vLLM {self.version or '(this tree)'}'s {CALLER_METHOD} does not read it"
        )


@dataclass(frozen=True)
class RunnerState:
    """What the stand-in ``self`` of one rank holds for one call."""

    uniform_decode_query_len: int
    dispatcher: Any
    parallel_config: Any
    cudagraph_mode: Any
    num_active_loras: int
    #: The policy's ``encoder_decoder`` (as the dispatcher's config holds it).
    encoder_decoder: bool = False

    def value(self, name: str) -> Any:
        if name == "off":
            return False
        if name == "lora_requests":
            # The runner's live LoRA requests by id; only their count is read.
            return {lora_id: None for lora_id in range(1, self.num_active_loras + 1)}
        return getattr(self, name)


def extract(path: Path, version: str | None, globals_: Mapping[str, Any]) -> Caller:
    """Cut :data:`CALLER_METHOD` and the methods it calls on ``self`` out of
    ``path`` and compile them against ``globals_``; a one-line
    :class:`TargetError` when the file has no such method."""
    _, tree = parse_source(path)
    runner = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.ClassDef) and node.name == RUNNER_CLASS
        ),
        None,
    )
    if runner is None:
        raise TargetError(
            f"{path}: no class {RUNNER_CLASS} (not vLLM's V1 model runner)"
        )
    defined = {
        node.name: node for node in runner.body if isinstance(node, ast.FunctionDef)
    }
    if CALLER_METHOD not in defined:
        raise TargetError(
            f"{path}: {RUNNER_CLASS} has no {CALLER_METHOD} (the V1 caller dpsim "
            "runs, vLLM 0.12 and later)"
        )
    methods = _methods_needed(defined)
    namespace: dict[str, Any] = dict(globals_)
    namespace["__builtins__"] = builtins.__dict__
    used: dict[str, bool] = {}
    functions: dict[str, Callable[..., Any]] = {}
    for method in methods:
        prepared = _prepared(method)
        function_node = prepared.body[0]
        assert isinstance(function_node, ast.FunctionDef)
        for name in sorted(free_names(function_node) - {TICK_NAME}):
            used[name] = name in namespace
            if name not in namespace:
                namespace[name] = _unsupplied(name, path, version)
        functions[method.name] = _compile(prepared, method.name, path, namespace)
    entry = methods[0]
    reads = {chain for method in methods for chain in method.reads}
    own_methods = {(method.name,) for method in methods}
    answered = sorted(
        chain
        for chain in reads
        if chain in own_methods or _modelled_prefix(chain) is not None
    )
    parameters = tuple(inspect.signature(functions[entry.name]).parameters)[1:]
    return Caller(
        path=path,
        version=version,
        entry=entry,
        methods=methods,
        functions=functions,
        parameters=parameters,
        ignored=_unread(entry.node, parameters),
        answered=tuple(answered),
        unanswered=tuple(sorted(reads - set(answered))),
        globals_used=used,
    )


def runner_self(caller: Caller, state: RunnerState) -> StrictView:
    """The strict ``self`` of one rank: the modelled chains the methods read,
    and the methods they call on ``self``, nothing else."""
    values = {prefix: state.value(read) for prefix, read in caller.modelled_reads}
    methods: dict[str, Any] = {}
    view = view_of_paths(OWNER, values, where=caller.where)
    for method in caller.methods[1:]:
        function = caller.functions[method.name]
        methods[method.name] = function if method.static else MethodType(function, view)
    if methods:
        # Bound methods need the view itself: add them to its own values.
        object.__getattribute__(view, "_dpsim_view")[3].update(methods)
    return view


def _unread(node: ast.FunctionDef, parameters: tuple[str, ...]) -> tuple[str, ...]:
    """The ``parameters`` no expression in ``node``'s body loads."""
    loaded = {
        name.id
        for statement in node.body
        for name in ast.walk(statement)
        if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load)
    }
    return tuple(name for name in parameters if name not in loaded)


def _modelled_prefix(chain: tuple[str, ...]) -> tuple[str, ...] | None:
    for length in range(len(chain), 0, -1):
        if chain[:length] in MODELLED_READS:
            return chain[:length]
    return None


def _methods_needed(defined: Mapping[str, ast.FunctionDef]) -> tuple[Method, ...]:
    """The caller and, transitively, each method of the class it reads off ``self``."""
    order = [CALLER_METHOD]
    found: dict[str, Method] = {}
    while order:
        name = order.pop(0)
        if name in found:
            continue
        node = defined[name]
        reads = _self_reads(node)
        found[name] = Method(
            name=name,
            node=node,
            static=any(_is_name(d, "staticmethod") for d in node.decorator_list),
            first_line=node.lineno,
            last_line=node.end_lineno or node.lineno,
            reads=reads,
        )
        order.extend(
            chain[0] for chain in reads if len(chain) == 1 and chain[0] in defined
        )
    return tuple(found.values())


def _self_reads(node: ast.FunctionDef) -> dict[tuple[str, ...], int]:
    """Each longest ``self.a.b`` chain in ``node``, with the first line reading it."""
    inner: set[int] = set()
    chains: dict[tuple[str, ...], int] = {}
    for attribute in ast.walk(node):
        if isinstance(attribute, ast.Attribute):
            inner.add(id(attribute.value))
    for attribute in ast.walk(node):
        if not isinstance(attribute, ast.Attribute) or id(attribute) in inner:
            continue
        parts: list[str] = []
        current: ast.expr = attribute
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        if _is_name(current, "self"):
            chain = tuple(reversed(parts))
            chains[chain] = min(chains.get(chain, attribute.lineno), attribute.lineno)
    return chains


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _prepared(method: Method) -> ast.Module:
    """The method as dpsim runs it: undecorated, unannotated, loops ticked."""
    node = copy.deepcopy(method.node)  # the transformers below edit in place
    node.decorator_list = []
    module = ast.Module(body=[node], type_ignores=[])
    module = _TickEveryLoop().visit(StripAnnotations().visit(module))
    return ast.fix_missing_locations(module)


def _compile(
    module: ast.Module, name: str, path: Path, namespace: dict[str, Any]
) -> Callable[..., Any]:
    register_file(path)
    code: CodeType = compile(module, str(path), "exec", dont_inherit=True)
    namespace.setdefault(TICK_NAME, tick())
    exec(code, namespace)
    function = namespace.pop(name)
    assert callable(function)
    return function


def _unsupplied(name: str, path: Path, version: str | None) -> Unsupplied:
    """A global name the caller uses that dpsim does not supply: any use of it
    raises, naming it, instead of computing with a made-up value."""
    text = (
        f"dpsim supplies no {name!r} to vLLM {version or '(this tree)'}'s "
        f"{RUNNER_CLASS} methods ({path.name} uses it)"
    )
    return Unsupplied(name, lambda: NameError(text))
