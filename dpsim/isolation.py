"""Run a command's target-executing part in a child process, and always report.

A target is arbitrary code: it may ``sys.exit(0)`` or ``os._exit(0)`` in its
sync, raise ``SystemExit`` at import, crash in C, allocate until the kernel
kills it, or spin in C where no loop tick reaches. Run in the command's own
process, any of these ends ``dpsim check`` with no verdict at all, and an exit
status 0 would read as a pass. So :func:`run_isolated` forks after the
arguments are checked and before the target is loaded; the child runs the
work under the :mod:`dpsim.allowances` and sends back its exit status and its
output through a pipe when it reaches a verdict (or an error). The parent
prints what it received, so a report on stdout only ever comes from a child
that finished; a child that ends without sending is reported by the parent
in one line (and, under ``--json``, as ``"verdict": "error"``) with exit
status :data:`EXIT_NO_VERDICT`.

Forked, not spawned: the child starts with everything the parent imported
(torch included) in microseconds, and tests calling the CLI's ``main``
in-process work unchanged. The fork happens before any target code ran in
the parent, and the child always ends with ``os._exit``: it never returns
into the caller (a test runner, say) or runs its teardown.

Output channels: stdout carries dpsim's report and nothing else. In the
child, file descriptor 1 points at stderr, so whatever target code writes
there (C ``printf``, ``os.write(1, ...)``) lands on stderr; Python-level
prints from target code land there too inside :func:`prints_to_stderr`, which
a command wraps around the part that runs the target. The report itself is
collected in memory and relayed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from dpsim import allowances
from dpsim.allowances import Allowance
from dpsim.boundary import refusal
from dpsim.errors import UsageError, debugging

#: The exit status when no verdict was reached because of the target: it
#: ended or crashed the process, or outgrew an allowance. The status of a
#: target error (2), since that is what it is: a check that did not finish is
#: not a pass (0), and found no counterexample to call a failure (1).
EXIT_NO_VERDICT = 2
EXIT_INTERRUPTED = 130
#: Any other exception that escapes is dpsim failing, reported as an error
#: (not 1, which says a property failed).
EXIT_INTERNAL = 2
#: The status of a child that ended before it could say anything else.
_EXIT_UNCAUGHT = 1

_READ_SIZE = 1 << 16


@dataclass(frozen=True)
class ChildResult:
    """How a child that ran ``work`` ended, and what it had to say."""

    code: int
    #: The one-line error it ended with (None for a verdict).
    error: str | None
    stdout: str
    stderr: str


def run_in_child(work: Callable[[], int], *, allowance: Allowance) -> ChildResult:
    """Run ``work`` in a forked child under ``allowance``; what came back.

    A child that ends without reporting (it exited, crashed or was killed)
    comes back with :data:`EXIT_NO_VERDICT` and :func:`died`'s reason, never
    with a status of its own choosing. Ctrl-C reaches the child too (the
    terminal signals the whole process group): the parent keeps waiting for
    what the child reports. A second Ctrl-C while it waits kills the child.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    reading, writing = os.pipe()
    # The counting handler goes in before the fork: a Ctrl-C between the fork
    # and its installation would raise in the parent and lose the report.
    with _counting_interrupts() as interrupts:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            interrupts.restore()
            os.close(reading)
            _child(writing, work, allowance)
        interrupts.pid = pid
        os.close(writing)
        try:
            data = _read_all(reading)
        finally:
            os.close(reading)
        status = _wait(pid)
    sent = _decode(data)
    if sent is None and (interrupts.killed or _signal(status) == signal.SIGINT):
        # The second Ctrl-C (the first lets the child report): no error.
        return ChildResult(EXIT_INTERRUPTED, "interrupted", "", "dpsim: interrupted\n")
    if sent is None:
        error = died(status, allowance)
        return ChildResult(EXIT_NO_VERDICT, error, "", f"dpsim: error: {error}\n")
    return ChildResult(sent["code"], sent["error"], sent["stdout"], sent["stderr"])


def run_isolated(
    work: Callable[[], int], *, allowance: Allowance, json_errors: bool = False
) -> int:
    """Run ``work`` in a child (:func:`run_in_child`); relay its output and status.

    With ``json_errors``, a run that ends in an error with nothing on stdout
    prints ``{"verdict": "error", "message": ...}`` there, so a ``--json``
    reader always gets a verdict.
    """
    result = run_in_child(work, allowance=allowance)
    sys.stderr.write(result.stderr)
    sys.stderr.flush()
    stdout = result.stdout
    if json_errors and result.code != 0 and not stdout.strip():
        stdout = json.dumps({"verdict": "error", "message": result.error}) + "\n"
    sys.stdout.write(stdout)
    sys.stdout.flush()
    return result.code


@contextlib.contextmanager
def prints_to_stderr() -> Iterator[None]:
    """Send Python-level prints to stderr for the block: stdout is the report's."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _signal(status: int) -> int | None:
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def died(status: int, allowance: Allowance) -> str:
    """Why a child that sent nothing ended, from its wait status, in one line."""
    number = _signal(status)
    if number is not None:
        if number == signal.SIGXCPU:
            return (
                f"the target used more than its CPU allowance ({allowance.cpu_seconds} s "
                "to load, and per case; --cpu-limit) and was stopped by SIGXCPU: "
                "does it spin in C?"
            )
        if number == signal.SIGKILL:
            return (
                "the process running the target was killed by SIGKILL "
                "(out of memory? the kernel's OOM killer sends it; the memory "
                f"allowance was {allowance.describe_memory()}, see --memory-limit)"
            )
        return (
            f"the process running the target died of {signal.Signals(number).name} "
            "(a crash in the target or in C code it calls)"
        )
    code = os.waitstatus_to_exitcode(status)
    return (
        f"the target ended the process (os._exit/exit status {code}) "
        "before dpsim reached a verdict"
    )


# -- the child ---------------------------------------------------------------


def _child(writing: int, work: Callable[[], int], allowance: Allowance) -> None:
    code = _EXIT_UNCAUGHT
    try:
        _one_torch_thread()
        report = io.StringIO()
        # Live when stderr is the process's own (a terminal: progress shows
        # as it happens); collected and relayed when someone swapped it for
        # an object of its own (a test's capture), which dies with the child.
        live = sys.stderr is sys.__stderr__ and sys.stderr is not None
        errors: Any = sys.stderr if live else io.StringIO()
        sys.stdout, sys.stderr = report, errors
        with contextlib.suppress(OSError):
            os.dup2(2, 1)
        # The allowance's stop, whatever the caller made of the signal.
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)
        code, error = _run(work, allowance)
        sys.stderr.flush()
        payload = {
            "code": code,
            "error": error,
            "stdout": report.getvalue(),
            "stderr": "" if live else errors.getvalue(),
        }
        _send(writing, json.dumps(payload).encode())
    finally:
        os._exit(code)


def _one_torch_thread() -> None:
    """Keep the child's torch ops on its one thread.

    OpenMP's thread pool does not survive ``fork``: when the parent (a test
    runner, say) already ran a parallel torch op, the child's next parallel
    region waits forever at a barrier for pool threads that no longer exist.
    The virtual ranks all run on one thread anyway, and their tensors are a
    few elements, so one intra-op thread costs nothing.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _run(work: Callable[[], int], allowance: Allowance) -> tuple[int, str | None]:
    """``work()``'s status, and the error it ended with (None for a verdict)."""
    error: str | None
    try:
        allowances.apply(allowance)
        return int(work()), None
    except UsageError as raised:
        if debugging():
            traceback.print_exc(file=sys.stderr)
        code, error = 2, str(raised)
    except SystemExit as raised:
        code = EXIT_NO_VERDICT
        error = (
            f"the target raised SystemExit({raised.code!r}) before dpsim "
            "reached a verdict"
        )
    except MemoryError:
        code = EXIT_NO_VERDICT
        error = (
            "the target's process ran out of its memory allowance "
            f"({allowance.describe_memory()}; --memory-limit or {allowances.MEMORY_ENV})"
        )
    except KeyboardInterrupt:
        print("dpsim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED, "interrupted"
    except BaseException as raised:
        # dpsim's own failure, not a verdict: one line (the traceback under
        # --debug), the status of an error.
        if debugging():
            traceback.print_exc(file=sys.stderr)
        code, error = EXIT_INTERNAL, internal_error(raised)
    print(f"dpsim: error: {error}", file=sys.stderr)
    return code, error


def internal_error(raised: BaseException) -> str:
    """One line for an exception that escaped dpsim's own handling: what it
    is and where it stood, on whose side (:func:`dpsim.boundary.refusal`)."""
    return str(refusal("the target", raised))


def _send(writing: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(writing, view) :]


# -- the parent --------------------------------------------------------------


class _Interrupts:
    """The parent's SIGINT handler while a child runs: count, never raise.

    Raising ``KeyboardInterrupt`` in the parent could land between a read
    returning the child's report and its being kept, losing the report; so
    the first Ctrl-C only counts (the child got it too, and reports), and the
    second kills the child.
    """

    def __init__(self) -> None:
        #: The child's, once forked; until then a Ctrl-C only counts.
        self.pid: int | None = None
        self.count = 0
        self.killed = False
        #: The handler this one replaced (None where none was replaced).
        self.previous: Any = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count >= 2 and not self.killed and self.pid is not None:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def restore(self) -> None:
        """In the forked child: Ctrl-C is handled as before the fork."""
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


@contextlib.contextmanager
def _counting_interrupts() -> Iterator[_Interrupts]:
    interrupts = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield interrupts  # signals reach only the main thread: nothing to catch
        return
    interrupts.previous = signal.signal(signal.SIGINT, interrupts)
    try:
        yield interrupts
    finally:
        signal.signal(signal.SIGINT, interrupts.previous)


def _read_all(reading: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.read(reading, _READ_SIZE):
        chunks.append(chunk)
    return b"".join(chunks)


def _wait(pid: int) -> int:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _decode(data: bytes) -> dict[str, Any] | None:
    """What the child sent, or None if it ended before sending all of it."""
    try:
        sent = json.loads(data)
    except ValueError:
        return None
    if not isinstance(sent, dict) or not isinstance(sent.get("code"), int):
        return None
    return sent
