"""Run a function with a plain user's file permissions, root or not.

Root may write into a read-only folder (CAP_DAC_OVERRIDE), so a test of what
an unwritable folder does would only pass where it runs unprivileged, and CI
containers run as root. The function runs in a forked child that has dropped
the capabilities that bypass file permission checks: the kernel then holds it
to each file's mode bits as it holds any user, the child still owning the
files the test made. For an unprivileged process there is nothing to drop.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_CAPABILITY_VERSION_3 = 0x20080522
#: CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH: read, write and search anything.
_PERMISSION_BYPASSES = (1, 2)


class _Header(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _Sets(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _drop_permission_bypasses() -> None:
    # Permitted as well as effective: access(2) judges a real root by its
    # permitted set.
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_CAPABILITY_VERSION_3, 0)
    sets = (_Sets * 2)()
    if libc.capget(ctypes.byref(header), sets) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    keep = ~sum(1 << capability for capability in _PERMISSION_BYPASSES)
    sets[0].effective &= keep
    sets[0].permitted &= keep
    if libc.capset(ctypes.byref(header), sets) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def as_plain_user(function: Callable[[], T]) -> T:
    """``function()``'s result (picklable), computed in a forked child held
    to file permissions; an exception there fails the caller with its
    traceback."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        # Whatever happens here, the child never returns into the test run.
        try:
            os.close(read_end)
            outcome: tuple[bool, Any]
            try:
                _drop_permission_bypasses()
                outcome = (True, function())
            except BaseException:
                outcome = (False, traceback.format_exc())
            with os.fdopen(write_end, "wb") as pipe:
                pickle.dump(outcome, pipe)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "the child died"
    succeeded, value = pickle.loads(data)
    if not succeeded:
        raise AssertionError(f"in the plain-user child:\n{value}")
    return value  # type: ignore[no-any-return]
