"""A command builds only its own parser, so it imports only what it needs."""

from __future__ import annotations

import argparse

import pytest

from dpsim.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    (subparsers,) = [
        action
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return sorted(subparsers.choices)


def test_a_named_command_registers_alone_and_help_lists_every_one() -> None:
    assert _commands(build_parser("bench")) == ["bench"]
    every = _commands(build_parser())
    assert {"bench", "check", "targets"} <= set(every)
    # A word that is no command gets the full parser, whose error lists them all.
    assert _commands(build_parser("nosuch")) == every


def test_an_unknown_command_is_still_refused_naming_the_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["nosuch"]) == 2
    error = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in error and "'check'" in error
