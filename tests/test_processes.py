"""dpsim.processes: every child is waited for, then terminated, then killed,
and reaped, whichever kind it is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import pytest

from dpsim.processes import EXITED, KILLED, SPAWN, TERMINATED, Child, reap, start

FINISHES = "pass"
SLEEPS = "import time; print('ready', flush=True); time.sleep(600)"
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(600)"
)


def _command(code: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    if code != FINISHES:
        # Signalled only once it is where the test says it is.
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
    return child


def _sleep(ready: Connection, ignore_sigterm: bool) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.send("ready")
    time.sleep(600)


def _function(kind: str) -> Child:
    if kind == "finishes":
        return start(int)
    parent, child = SPAWN.Pipe()
    process = start(_sleep, child, kind == "ignores")
    assert parent.recv() == "ready"
    return process


def _wait_for(child: Child) -> None:
    if isinstance(child, subprocess.Popen):
        child.wait()
    else:
        child.join()


def _assert_reaped(pid: int | None) -> None:
    assert pid is not None
    # Reaped children are no longer ours to wait for: no zombie is left.
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("kind", ["command", "function"])
def test_children_exit_are_terminated_or_killed_and_all_reaped(kind: str) -> None:
    if kind == "command":
        children = [_command(FINISHES), _command(SLEEPS), _command(IGNORES_SIGTERM)]
    else:
        children = [_function("finishes"), _function("sleeps"), _function("ignores")]
    _wait_for(children[0])
    ended = reap(children, patience=0.0, grace=0.5)
    assert [(end.how, end.exitcode) for end in ended] == [
        (EXITED, 0),
        (TERMINATED, -signal.SIGTERM),
        (KILLED, -signal.SIGKILL),
    ]
    assert [end.pid for end in ended] == [child.pid for child in children]
    for end in ended:
        _assert_reaped(end.pid)


def test_a_child_that_ends_within_the_patience_is_not_signalled() -> None:
    ended = reap([start(int)], patience=600.0)
    assert [(end.how, end.exitcode) for end in ended] == [(EXITED, 0)]
    _assert_reaped(ended[0].pid)


def test_nothing_to_reap_is_nothing_to_do() -> None:
    assert reap([]) == []
