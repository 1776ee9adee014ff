"""Memory and CPU-time allowances for the process that runs a target's code.

A target that allocates in a loop, or spins in C where no loop tick can stop
it (``sum(range(10**15))``, at import or in its sync), must end in a verdict
or a one-line error, not in the kernel's OOM killer or a terminal that never
comes back. The allowances are kernel limits on the process running the
target (a child of the command, see :mod:`dpsim.isolation`), never on the
command itself or a test run:

* memory: ``RLIMIT_DATA``, the process's private writable memory (heap and
  anonymous mappings, what both Python and torch's CPU allocator use). Not
  ``RLIMIT_AS``: torch's libraries map a lot of address space they never
  write, which would eat an address-space limit for nothing. An allocation
  past the limit fails: Python raises ``MemoryError`` and torch a
  ``RuntimeError``, which inside a rank is that rank's error (a ``no-error``
  failure with a counterexample, like any other exception).
* CPU time: ``RLIMIT_CPU``, whose soft limit is moved forward at every case
  (:func:`case_started`) to the CPU used so far plus the allowance, so each
  case (and loading the target, before the first) gets the same allowance,
  whatever ran before. Past it the kernel sends ``SIGXCPU``, which ends the
  process; whoever started it reports that. CPU time, not wall-clock time:
  a loaded machine makes a case slower, never a different verdict.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import UsageError

MEMORY_ENV = "DPSIM_MEMORY_LIMIT"
#: Without --memory-limit or DPSIM_MEMORY_LIMIT: this share of the machine's
#: memory (or of the cgroup's, when one caps it), leaving the rest to the
#: system so that the allowance, not the OOM killer, ends a runaway target.
DEFAULT_MEMORY_SHARE = 0.75
#: CPU seconds for loading the target, and then for each case: a real case
#: takes milliseconds, the biggest allowed ones seconds.
DEFAULT_CPU_SECONDS = 60

_UNITS = {"": 2**20, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_CGROUP_MAX = Path("/sys/fs/cgroup/memory.max")


@dataclass(frozen=True)
class Allowance:
    """What the process running a target may use."""

    #: Bytes of private writable memory (RLIMIT_DATA); None: no limit.
    memory: int | None
    #: CPU seconds for loading the target, and then per case; None: no limit.
    cpu_seconds: int | None

    def describe_memory(self) -> str:
        return "no limit" if self.memory is None else format_size(self.memory)


#: No limits: the child process alone, so that a target ending the process is
#: reported. For commands whose child starts workers of its own (``mutate``):
#: those inherit the child's limits, and a CPU-time limit, which counts each
#: process's own time from its start, would cut a long worker short.
NO_LIMITS = Allowance(memory=None, cpu_seconds=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help=f"memory the target's process may use, e.g. 8G, 512M or none "
        f"(default: ${MEMORY_ENV}, else {DEFAULT_MEMORY_SHARE * 100:.0f}%% of this "
        "machine's)",
    )
    parser.add_argument(
        "--cpu-limit",
        type=int,
        default=DEFAULT_CPU_SECONDS,
        metavar="SECONDS",
        help="CPU seconds the target may use to load, and then per case "
        f"(default {DEFAULT_CPU_SECONDS}); past it the run stops with an error",
    )


def from_arguments(arguments: argparse.Namespace) -> Allowance:
    """The allowance ``--memory-limit`` / ``--cpu-limit`` ask for, checked."""
    if arguments.cpu_limit < 1:
        raise UsageError("--cpu-limit must be at least 1 second")
    return _allowance(arguments.memory_limit, arguments.cpu_limit)


def from_environment() -> Allowance:
    """The allowance where there are no flags (the pytest suite): the defaults,
    with the memory from ``$DPSIM_MEMORY_LIMIT`` where it is set."""
    return _allowance(None, DEFAULT_CPU_SECONDS)


def _allowance(memory_limit: str | None, cpu_seconds: int) -> Allowance:
    memory: int | None
    if memory_limit is not None:
        memory = parse_size(memory_limit, "--memory-limit")
    elif os.environ.get(MEMORY_ENV):
        memory = parse_size(os.environ[MEMORY_ENV], MEMORY_ENV)
    else:
        memory = default_memory()
    if memory is not None:
        used = data_in_use()
        if used is not None and memory <= used:
            raise UsageError(
                f"a memory limit of {format_size(memory)} is below what dpsim "
                f"itself already uses ({format_size(used)})"
            )
    return Allowance(memory=memory, cpu_seconds=cpu_seconds)


def parse_size(text: str, where: str) -> int | None:
    """Bytes for ``8G``, ``512M``, ``1.5G``, ``2048`` (MiB); None for ``none``."""
    if text.strip().lower() == "none":
        return None
    match = _SIZE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(
            f"{where} {text!r}: expected a size like 8G, 512M (a bare number is MiB) or none"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def format_size(size: int) -> str:
    if size >= 2**30:
        return f"{size / 2**30:.1f} GiB"
    return f"{size / 2**20:.0f} MiB"


def default_memory() -> int | None:
    """:data:`DEFAULT_MEMORY_SHARE` of the memory this process can have at most."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    try:
        capped = _CGROUP_MAX.read_text().strip()
    except OSError:
        capped = "max"
    if capped.isdigit():
        physical = min(physical, int(capped))
    return int(physical * DEFAULT_MEMORY_SHARE)


def data_in_use() -> int | None:
    """This process's private writable memory now (what RLIMIT_DATA counts), if known."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


#: (allowance, hard limit) once :func:`apply` ran in this process.
_cpu: tuple[int, int] | None = None


def apply(allowance: Allowance) -> None:
    """Limit this process (the one about to run a target) to ``allowance``.

    Only the hard limits of the calling process change where they must: the
    soft CPU limit has to move forward later, so its hard limit stays.
    """
    global _cpu
    if allowance.memory is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = allowance.memory
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    if allowance.cpu_seconds is None:
        return
    _cpu = (allowance.cpu_seconds, resource.getrlimit(resource.RLIMIT_CPU)[1])
    case_started()


def case_started() -> None:
    """Give the case about to run its CPU allowance, counted from now.

    A no-op unless :func:`apply` ran in this process, so the simulator pays
    nothing outside an isolated command.
    """
    if _cpu is None:
        return
    seconds, hard = _cpu
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
