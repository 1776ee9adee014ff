"""The ``dpsim`` command: one sub-command per job, each in its own module.

Every user mistake surfaces as a :class:`~dpsim.errors.UsageError`, printed
here as a single line with exit status 2 (its traceback too under every
command's ``--debug``), as does a target dpsim cannot drive
(:class:`~dpsim.errors.BoundaryError`). A reader that stops reading
(``dpsim check | head -1``) ends the command quietly with status 141, as a
process killed by SIGPIPE would, instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from dpsim.errors import DEBUG_ENV, UsageError, debugging
from dpsim.terminal import printable

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: 128 + SIGPIPE: what a shell reports for a writer whose reader went away.
EXIT_BROKEN_PIPE = 141

DESCRIPTION = """\
Simulate vLLM's data-parallel sync on N virtual ranks, in one process,
through the real vLLM code, and check that the ranks always agree.

typical use:
  dpsim check                         property suite on the newest release
  dpsim check --vllm 0.29.0 --ranks 2..8 --examples 500
  dpsim check --target my/dp_utils.py --vllm 0.33.0
  dpsim targets 0.29.0 0.33.0         fetch, load and show each API
  dpsim diff 0.33.0 0.34.0            what a change does, on the same cases
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``dpsim`` parser; with ``command``, only that sub-command's.

    Registering a command imports its module and what that imports (torch,
    Hypothesis, the lanes): a run of one command builds only its own parser,
    so it does not pay for the others' imports before its first case.
    """
    parser = _Parser(
        prog="dpsim",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    for module in command_modules(command):
        module.register(commands)
    return parser


def add_command(
    commands: Any, name: str, help: str, epilog: str
) -> argparse.ArgumentParser:
    """A sub-command whose help is also its description, with examples kept as written."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=help,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_debug_argument(parser)
    return parser


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    """``--debug``: an error's traceback beside its one line. Unset, it
    leaves the namespace alone, so a command's action parsers (``policy
    show``) can take it too without resetting the command's own."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print an error's traceback beside its one-line message",
    )


def command_modules(command: str | None = None) -> list[ModuleType]:
    """Every module of this package that defines a sub-command, by name (only
    ``command``'s, when a module has that name).

    Adding a command is adding a module with a ``register(commands)`` that
    registers the command of the module's own name.
    """
    names = sorted(info.name for info in pkgutil.iter_modules(__path__))
    if command in names:
        names = [command]
    found = []
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        if callable(getattr(module, "register", None)):
            found.append(module)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    debug_before = os.environ.get(DEBUG_ENV)
    try:
        return _main(argv)
    finally:
        if debug_before is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = debug_before


def _main(argv: Sequence[str] | None) -> int:
    try:
        # Inside: building the parser imports every command (torch among
        # them), seconds in which a Ctrl-C must not print a traceback.
        arguments_given = sys.argv[1:] if argv is None else list(argv)
        parser = build_parser(_command_word(arguments_given))
        arguments = parser.parse_args(arguments_given)
        if arguments.command is None:
            parser.print_help()
            return EXIT_USAGE
        if getattr(arguments, "debug", False):
            # Children inherit it; the process (a test calling main) gets
            # its own value back when main returns.
            os.environ[DEBUG_ENV] = "1"
        return int(arguments.run(arguments))
    except UsageError as error:
        if debugging():
            traceback.print_exception(error, file=sys.stderr)
        # A message may quote a path or a file's content: escaped, it stays
        # one line and cannot drive the terminal.
        print(f"dpsim: error: {printable(error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dpsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as error:
        # dpsim failing where no child isolates the work: no verdict, one
        # line (the traceback under --debug), never exit 1 ("a property failed").
        from dpsim.isolation import internal_error

        if debugging():
            traceback.print_exception(error, file=sys.stderr)
        print(f"dpsim: error: {printable(internal_error(error))}", file=sys.stderr)
        return EXIT_USAGE


def _command_word(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names, if its first word is one (``dpsim
    --help`` and mistakes get the full parser, which lists every command)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def run() -> None:
    line_buffered()
    code = main()
    # From here on a Ctrl-C ends the process at once and quietly: raised in an
    # exit handler (torch registers some), it would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        sys.stdout.flush()  # what is still buffered may meet a closed pipe too
    except BrokenPipeError:
        _silence_stdout()
        code = EXIT_BROKEN_PIPE
    sys.exit(code)


def line_buffered() -> None:
    """Flush stdout and stderr at every line, also when piped (``dpsim check |
    tee log``): progress and results show as they come, not when a block fills."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's own flush at exit
    cannot raise BrokenPipeError again (and print it)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing flushes it at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)


def check_output_directory(path: Path, flag: str) -> None:
    """Refuse, before any work, an output directory that cannot be written.

    Nothing is created here: a run that writes nothing leaves no directory
    behind. ``path`` must be a writable directory, or not exist under a
    writable one.
    """
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise UsageError(f"{flag} {path}: {existing} is a dangling symlink")
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        where = (
            "is not a directory" if existing == path else f"is under {existing}, a file"
        )
        raise UsageError(f"{flag} {path}: {where}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {existing} is not writable")
