"""The line between dpsim and the vLLM it drives, and whose side an error is on.

dpsim calls into vLLM (it builds a manager from a config it made, calls the
sync through an adapter, runs a real method on a stand-in) and vLLM calls back
into dpsim (the stand-ins, the simulated collectives). When the release's code
changes, its side of that line moves: a constructor takes a new argument, a
keyword is renamed, a stand-in is asked an attribute it was not written for, a
module moves. An exception that comes from dpsim's side of the line is dpsim
not fitting the release, never a verdict on vLLM: commands refuse the run in
one line (:class:`~dpsim.errors.BoundaryError`, exit status 2), and only an
exception raised by vLLM's own code inside a rank is a ``no-error`` finding.

Three pieces live here, for every lane:

* vLLM's files: the file names dpsim compiled target code under
  (:func:`register_file`), so a frame can be told to be vLLM's, and where it
  stands shown as ``v1/worker/gpu/dp_utils.py:88 in dispatch_cg_and_sync_dp``;
* the gap log (:func:`collect_gaps`, :func:`gap`, :class:`ModelGap`): a stand-in
  asked what it does not know logs the question, which vLLM's ``except
  Exception`` cannot make it forget, and the run is refused;
* :func:`fault_of`, which says whether an exception is dpsim's, from its
  type and its traceback (see its docstring), and :func:`stops_the_search`,
  which carries a dpsim error out of a Hypothesis search at once, neither
  shrunk nor saved.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, ParamSpec, TypeVar

from dpsim.errors import DEBUG_ENV, BoundaryError, TargetError

P = ParamSpec("P")
R = TypeVar("R")
E = TypeVar("E", bound=BaseException)

# -- vLLM's files ---------------------------------------------------------------

#: File name (as compiled) -> how locations show it ("v1/worker/gpu/model_runner.py").
_FILES: dict[str, str] = {}


def register_file(path: Path | str) -> str:
    """Count code compiled from ``path`` as vLLM's; returns its display name
    (the path below the ``vllm`` package, or the file name)."""
    name = str(path)
    shown = _FILES.get(name)
    if shown is None:
        shown = display_name(Path(name))
        _FILES[name] = shown
    return shown


def display_name(path: Path) -> str:
    """``path`` below its innermost ``vllm`` folder (``v1/worker/gpu_worker.py``);
    the file name alone when it is not inside one."""
    parts = path.parts
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "vllm":
            return "/".join(parts[index + 1 :])
    return path.name


def is_vllm_file(filename: str) -> bool:
    return filename in _FILES


def shown_name(filename: str) -> str | None:
    """How locations show a registered vLLM file; None for any other file."""
    return _FILES.get(filename)


def frame_location(frame: FrameType) -> str:
    """``model_runner.py:1832 in execute_model`` for one vLLM frame."""
    code = frame.f_code
    return f"{_FILES[code.co_filename]}:{frame.f_lineno} in {code.co_name}"


def vllm_location(frame: FrameType | None) -> str | None:
    """The innermost vLLM frame from ``frame`` outward, as a location; None
    when no frame on the stack is vLLM's."""
    while frame is not None:
        if frame.f_code.co_filename in _FILES:
            return frame_location(frame)
        frame = frame.f_back
    return None


def vllm_stack(frame: FrameType | None) -> tuple[str, ...]:
    """Every vLLM frame from ``frame`` outward, innermost first."""
    found: list[str] = []
    while frame is not None:
        if frame.f_code.co_filename in _FILES:
            found.append(frame_location(frame))
        frame = frame.f_back
    return tuple(found)


# -- the gap log ------------------------------------------------------------------


class ModelGap(Exception):
    """vLLM asked dpsim something its stand-ins were not written to answer."""


#: The active gap logs, outermost first; a gap goes into each.
_logs: list[list[str]] = []


@contextmanager
def collect_gaps() -> Iterator[list[str]]:
    """The gaps met inside the block, in order, each once.

    Nested blocks each get every gap met while they are active (an outer run
    refuses whatever an inner one saw).
    """
    gaps: list[str] = []
    _logs.append(gaps)
    try:
        yield gaps
    finally:
        # By identity: a list equal to another must not remove the other.
        index = next(i for i, log in enumerate(_logs) if log is gaps)
        del _logs[index]


def gap(text: str) -> ModelGap:
    """Log ``text`` as a gap in every active log; the exception to raise."""
    for log in _logs:
        if text not in log:
            log.append(text)
    return ModelGap(text)


def asked_at(depth: int = 1) -> str:
    """Where the vLLM code asking is: the innermost vLLM frame from the
    caller's caller (``depth`` frames up) outward, or a plain note."""
    return vllm_location(sys._getframe(depth + 1)) or "(no vLLM frame on the stack)"


# -- whose error ------------------------------------------------------------------

#: Set on an exception dpsim raises on purpose because the real thing raises
#: it too (a collective vLLM misuses, an attribute the real object lacks).
_MODELLED = "_dpsim_modelled"


def modelled(error: E) -> E:
    """Mark ``error``, raised by dpsim's code, as what the real object or
    library raises for the same use: vLLM's doing, judged like vLLM's own."""
    setattr(error, _MODELLED, True)
    return error


_DPSIM_DIRS = tuple(
    dict.fromkeys(
        os.path.join(directory, "")
        for directory in (
            os.path.dirname(os.path.abspath(__file__)),
            os.path.dirname(os.path.realpath(__file__)),
        )
    )
)
_LIBRARY_DIRS = tuple(
    dict.fromkeys(
        os.path.join(os.path.realpath(directory), "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (directory := sysconfig.get_paths().get(key))
    )
)
#: The package's own files below its directory (``dpsim/targets/manager.py``).
_DPSIM_PARENT = os.path.dirname(_DPSIM_DIRS[0].rstrip(os.sep))
VLLM, DPSIM, LIBRARY = "vllm", "dpsim", "library"


@functools.lru_cache(maxsize=4096)
def _side(filename: str) -> str:
    """Whose code a file holds: vLLM's (the target's: any file dpsim compiled
    as vLLM's, and any other file that is neither dpsim's nor a library's, a
    test's programs say), dpsim's, or a library's (the standard library,
    installed packages, frozen and generated code)."""
    if filename in _FILES:
        return VLLM
    if filename.startswith("<dpsim"):
        return DPSIM  # dpsim's generated call wrappers (targets.adapters)
    if filename.startswith("<"):
        return LIBRARY
    if filename.startswith(_DPSIM_DIRS):
        return DPSIM
    if os.path.realpath(filename).startswith(_LIBRARY_DIRS):
        return LIBRARY
    return VLLM


def _side_of(filename: str) -> str:
    # Registered after a first look (a tree loaded later): asked first.
    return VLLM if filename in _FILES else _side(filename)


#: CPython's messages for a call whose arguments do not bind to the callee.
_BINDING = re.compile(
    r"^(?P<callee>[\w.<>]+)\(\) (?:missing \d+ required|got an unexpected keyword"
    r"|takes (?:from \d+ to )?\d+ positional|takes no (?:keyword )?arguments"
    r"|takes exactly|got multiple values for|got some positional-only)"
)


@dataclass(frozen=True)
class Fault:
    """An exception from dpsim's side of the line, and where it stood."""

    #: ``TypeError: f() missing 1 required positional argument: 'x'``
    error: str
    #: Why it is dpsim's, and where it stood on either side.
    how: str

    def __str__(self) -> str:
        return f"{self.error} ({self.how})"


def fault_of(error: BaseException) -> Fault | None:
    """The exception as dpsim's fault, or None when it is vLLM's own.

    dpsim's: a gap, a refusal dpsim raised (:class:`TargetError`), a module
    that could not be imported, and anything raised in dpsim's own code that
    is not marked :func:`modelled`; from vLLM's code, a call that does not
    bind to a callee vLLM's files do not define (a stand-in's method whose
    signature the release outgrew) and an attribute read off one of dpsim's
    objects that it does not have. Which code raised is the innermost frame
    of the traceback that is dpsim's or vLLM's (library frames, torch's
    among them, are passed over: what they raise is their caller's doing).
    Everything else vLLM's code raised, an assertion above all, is vLLM's.
    """
    if getattr(error, _MODELLED, False):
        return None
    text = _one_line(error)
    for link in _chain(error):
        if isinstance(link, ModelGap):
            return Fault(text, f"a gap: {link}")
        if isinstance(link, TargetError):
            return Fault(text, "dpsim refused it")
    vllm_at, dpsim_at = _innermost(error.__traceback__)
    if isinstance(error, ImportError):
        return Fault(
            text, _places("a module dpsim could not import", vllm_at, dpsim_at)
        )
    innermost = _innermost_side(error.__traceback__)
    if innermost == DPSIM:
        binding = isinstance(error, TypeError) and _BINDING.match(str(error))
        if binding:
            callee = _vllm_definition(binding.group("callee"), error.__traceback__)
            into = f" into vLLM's {callee}" if callee else ""
            return Fault(
                text, f"dpsim's call at {dpsim_at}{into} does not fit this release"
            )
        return Fault(text, _places("raised in dpsim's own code", vllm_at, dpsim_at))
    if innermost != VLLM:
        return None
    if isinstance(error, TypeError):
        binding = _BINDING.match(str(error))
        if binding and not _vllm_definition(
            binding.group("callee"), error.__traceback__
        ):
            return Fault(
                text,
                f"vLLM's call at {vllm_at} does not fit dpsim's stand-in for it",
            )
    if isinstance(error, AttributeError) and _is_dpsims(getattr(error, "obj", None)):
        return Fault(
            text, f"vLLM reads it at {vllm_at}; dpsim's stand-in does not have it"
        )
    if isinstance(error, TypeError) and _names_dpsim_type(str(error)):
        # Computing with a stand-in (an inert stub for a module dpsim did
        # not find, say) as with the real value: dpsim handed it over.
        return Fault(
            text, f"vLLM used one of dpsim's stand-ins at {vllm_at} as the real thing"
        )
    return None


def _one_line(error: BaseException) -> str:
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _frames(trace: TracebackType | None) -> list[tuple[str, int, str]]:
    """(file, line, function) of each frame, outermost first."""
    found = []
    while trace is not None:
        code = trace.tb_frame.f_code
        found.append((code.co_filename, trace.tb_lineno, code.co_name))
        trace = trace.tb_next
    return found


def _innermost_side(trace: TracebackType | None) -> str:
    for filename, _, _ in reversed(_frames(trace)):
        side = _side_of(filename)
        if side != LIBRARY:
            return side
    return LIBRARY


def _innermost(trace: TracebackType | None) -> tuple[str | None, str | None]:
    """The innermost vLLM frame and the innermost dpsim frame, as locations."""
    vllm_at = dpsim_at = None
    for filename, line, function in reversed(_frames(trace)):
        side = _side_of(filename)
        if side == VLLM and vllm_at is None:
            vllm_at = f"{_vllm_name(filename)}:{line} in {function}"
        elif side == DPSIM and dpsim_at is None:
            dpsim_at = f"{_dpsim_name(filename)}:{line} in {function}"
    return vllm_at, dpsim_at


def _places(what: str, vllm_at: str | None, dpsim_at: str | None) -> str:
    parts = [what]
    if dpsim_at is not None:
        parts.append(f"dpsim at {dpsim_at}")
    if vllm_at is not None:
        parts.append(f"vLLM at {vllm_at}")
    return "; ".join(parts)


def _vllm_name(filename: str) -> str:
    return _FILES.get(filename) or display_name(Path(filename))


def _dpsim_name(filename: str) -> str:
    if filename.startswith("<"):
        return filename
    return os.path.relpath(filename, _DPSIM_PARENT)


def _vllm_definition(callee: str, trace: TracebackType | None) -> str | None:
    """Where vLLM's code defines ``callee`` (a qualified name as CPython's
    message gives it; a class for its generated or inherited ``__init__``),
    as ``file.py:LINE Name``; None when no vLLM file dpsim knows defines it."""
    owner = callee.rpartition(".")[0]
    # The traceback's own vLLM files first, then the most recently loaded:
    # with several releases loaded, the one being driven is usually the last
    # (a name alone cannot tell two releases' classes apart).
    files = dict.fromkeys(
        [
            *(name for name, _, _ in _frames(trace) if _side_of(name) == VLLM),
            *reversed(tuple(_FILES)),
        ]
    )
    for filename in files:
        defined = _definitions(filename)
        for name in (callee, owner):
            if name and name in defined:
                return f"{_vllm_name(filename)}:{defined[name]} {callee}"
    return None


@functools.lru_cache(maxsize=256)
def _definitions(filename: str) -> dict[str, int]:
    """Every class and function ``filename`` defines, by qualified name, and
    its line; empty when the file cannot be read or parsed."""
    try:
        tree = ast.parse(Path(filename).read_bytes(), filename=filename)
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, int] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(prefix + node.name, node.lineno)
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(prefix + node.name, node.lineno)
                visit(node.body, f"{prefix}{node.name}.<locals>.")
            else:
                # Definitions under if/try/with/for at any depth.
                inner: list[ast.stmt] = []
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        inner.append(child)
                    elif isinstance(child, ast.ExceptHandler):
                        inner.extend(child.body)
                visit(inner, prefix)

    visit(tree.body, "")
    return found


_QUOTED = re.compile(r"'([^']+)'")


def _names_dpsim_type(message: str) -> bool:
    """Whether a TypeError's message names a type of dpsim's own (one no
    vLLM file dpsim knows defines too), as CPython's operand and call
    messages quote them."""
    quoted = set(_QUOTED.findall(message))
    if not quoted:
        return False
    if any(name.startswith("StandIn[") for name in quoted):
        return True
    found = quoted & _dpsim_type_names()
    if not found:
        return False
    vllm_names = {
        name.rpartition(".")[2]
        for filename in _FILES
        for name in _definitions(filename)
    }
    return bool(found - vllm_names)


def _dpsim_type_names() -> frozenset[str]:
    """The names of the classes dpsim's loaded modules define (their stubs'
    metaclass among them)."""
    return _type_names_of(len(sys.modules))


@functools.lru_cache(maxsize=1)
def _type_names_of(modules: int) -> frozenset[str]:
    # Worked out again only when modules were loaded since (``modules``).
    names: set[str] = set()
    for module_name, module in list(sys.modules.items()):
        if module_name != "dpsim" and not module_name.startswith("dpsim."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and _is_dpsims(value):
                names.add(value.__name__)
    return frozenset(names)


def _is_dpsims(value: Any) -> bool:
    """Whether ``value`` (or, for a class, itself) is an object of dpsim's."""
    if value is None:
        return False
    cls = value if isinstance(value, type) else type(value)
    module = getattr(cls, "__module__", "") or ""
    return module == "dpsim" or module.startswith("dpsim.")


# -- refusing a run ---------------------------------------------------------------


def refusal(label: str, error: BaseException, doing: str = "") -> BoundaryError:
    """The one-line refusal of a run of ``label`` that ``error`` ended while
    dpsim was ``doing`` something (e.g. "building its CudaGraphManager"): the
    error and where it stood, dpsim's fault when :func:`fault_of` finds it.
    A :class:`~dpsim.errors.BoundaryError` is itself."""
    if isinstance(error, BoundaryError):
        return error
    fault = fault_of(error)
    if fault is None:
        vllm_at, dpsim_at = _innermost(error.__traceback__)
        fault = Fault(
            _one_line(error), _places("raised by vLLM's code", vllm_at, dpsim_at)
        )
    return refused(label, f"{doing}: {fault}" if doing else str(fault))


def refused(label: str, what: str) -> BoundaryError:
    """The one-line refusal of a run of ``label``, ``what`` saying why."""
    return BoundaryError(
        f"dpsim cannot drive {label}: {what}; no verdict on it (--debug or "
        f"{DEBUG_ENV}=1 shows the traceback)"
    )


class SearchStopped(KeyboardInterrupt):
    """A dpsim error on its way out of a Hypothesis search.

    Hypothesis takes any ``Exception`` its test raises for a failure: it
    shrinks it, saves it to the example database, and raises it at the end.
    A ``KeyboardInterrupt`` it lets through at once, saving nothing, so a
    dpsim error travels as one from the test (:func:`stops_the_search`) to
    the caller of the search (:func:`searching`), which raises it again.
    """

    def __init__(self, error: BoundaryError) -> None:
        super().__init__(str(error))
        self.error = error


def stops_the_search(test: Callable[P, R]) -> Callable[P, R]:
    """``test``, with a :class:`~dpsim.errors.BoundaryError` it raises
    carried out of the search as :class:`SearchStopped`."""

    @functools.wraps(test)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return test(*args, **kwargs)
        except BoundaryError as error:
            raise SearchStopped(error) from None

    return wrapped


@contextmanager
def searching() -> Iterator[None]:
    """Around a Hypothesis search: a dpsim error that stopped it (see
    :class:`SearchStopped`) is raised again, as itself."""
    try:
        yield
    except SearchStopped as stopped:
        error = stopped.error
        # As it was raised in the test, cause and traceback kept (--debug).
        error.__suppress_context__ = True
        raise error  # noqa: B904
