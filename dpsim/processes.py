"""Child processes: started one way, stopped one way, never left behind.

The replay lane, fuzzing campaigns, mutation workers and the cross-version
report each run work in other processes, and each must end them however the
parent leaves (an answer, an exception, Ctrl-C): wait until a deadline, then
SIGTERM, then SIGKILL what ignores it, and reap every one so none lingers as
a zombie or an orphan holding a core. That sequence lives here once, for both
kinds of child dpsim starts: :class:`subprocess.Popen` (a command line, as the
replay lane's ranks) and :class:`multiprocessing.Process` (a Python function).

Python functions run in *spawned* children, never forked ones: the parent has
usually imported torch, and forking a process whose thread pools have started
can deadlock the child.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

#: The start method of every Python-function child (and its pipes and queues).
SPAWN = multiprocessing.get_context("spawn")

#: A child either kind: a command line or a Python function.
Child = subprocess.Popen[bytes] | BaseProcess

#: Seconds a child has between SIGTERM and SIGKILL, unless the caller says.
DEFAULT_TERM_GRACE = 1.0

EXITED = "exited"
TERMINATED = "terminated"
KILLED = "killed"


@dataclass(frozen=True)
class Ended:
    """How one child ended."""

    pid: int | None
    #: Negative: ended by that signal.
    exitcode: int | None
    #: EXITED on its own, TERMINATED (SIGTERM) or KILLED (SIGKILL) by us.
    how: str


def start(
    target: Callable[..., Any], *args: Any, name: str | None = None
) -> BaseProcess:
    """``target(*args)`` in a spawned daemon child, so it dies with the parent."""
    process = SPAWN.Process(target=target, args=args, name=name, daemon=True)
    process.start()
    return process


def reap(
    children: Sequence[Child],
    *,
    patience: float = 0.0,
    grace: float = DEFAULT_TERM_GRACE,
) -> list[Ended]:
    """Wait for every child; stop the ones that will not go.

    All children share one deadline, ``patience`` seconds from now, to exit
    on their own; those still running then get SIGTERM and ``grace`` more
    seconds; any left get SIGKILL. Returns once every child is reaped.
    """
    how = [EXITED] * len(children)
    for wait_s, stopped in ((patience, TERMINATED), (grace, KILLED)):
        deadline = time.monotonic() + wait_s
        for child in children:
            _wait(child, max(0.0, deadline - time.monotonic()))
        for index, child in enumerate(children):
            if _running(child):
                if stopped == TERMINATED:
                    child.terminate()
                else:
                    child.kill()
                how[index] = stopped
    for child in children:
        _wait(child, None)
    return [
        Ended(child.pid, _exitcode(child), how[index])
        for index, child in enumerate(children)
    ]


def _running(child: Child) -> bool:
    if isinstance(child, subprocess.Popen):
        return child.poll() is None
    return child.is_alive()


def _wait(child: Child, timeout: float | None) -> None:
    if isinstance(child, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout)
    else:
        child.join(timeout)


def _exitcode(child: Child) -> int | None:
    if isinstance(child, subprocess.Popen):
        return child.returncode
    return child.exitcode
