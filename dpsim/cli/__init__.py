"""The ``dpsim`` command: one sub-command per job, each in its own module.

Every user mistake surfaces as a :class:`~dpsim.errors.UsageError`, printed
here as a single line with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from dpsim.errors import UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """\
Simulate vLLM's data-parallel sync on N virtual ranks, in one process,
through the real vLLM code, and check that the ranks always agree.

typical use:
  dpsim check                         property suite on the newest release
  dpsim check --vllm 0.29.0 --ranks 2..8 --examples 500
  dpsim check --target my/dp_utils.py --vllm 0.33.0
  dpsim targets 0.29.0 0.33.0         fetch, load and show each API
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dpsim",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    for module in command_modules():
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
    return parser


def command_modules() -> list[ModuleType]:
    """Every module of this package that defines a sub-command, by name.

    Adding a command is adding a module with a ``register(commands)``.
    """
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "register", None)):
            found.append(module)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        arguments = parser.parse_args(argv)
        if arguments.command is None:
            parser.print_help()
            return EXIT_USAGE
        return int(arguments.run(arguments))
    except UsageError as error:
        print(f"dpsim: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dpsim: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    sys.exit(main())
