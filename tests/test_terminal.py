"""Text from outside dpsim is escaped wherever a report shows it.

No release needed: the simulator runs a tiny program whose rank raises an
exception carrying terminal controls, and the rendered tables must show them
as escapes, one row per rank, with nothing that moves the cursor.
"""

from __future__ import annotations

import pytest

from dpsim.properties.base import Verdict
from dpsim.report import table
from dpsim.sim import render_table, simulate
from dpsim.terminal import printable

HOSTILE = "\x1b[2J\rcleared\nforged line\u202eevil\x00\x7f\x85\u2028"


def _controls(text: str) -> set[str]:
    return {char for char in text if not char.isprintable() and char != "\n"}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, é, 日本", "plain text, é, 日本"),
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("x\ry\nz\tw", "x\\ry\\nz\\tw"),
        ("bidi\u202e", "bidi\\u202e"),
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
        (3, "3"),
    ],
)
def test_printable_escapes_exactly_the_non_printable_characters(
    text: object, shown: str
) -> None:
    assert printable(text) == shown


def test_printable_leaves_nothing_that_drives_a_terminal() -> None:
    every = "".join(map(chr, range(0x250))) + HOSTILE
    assert printable(every).isprintable()


def test_a_ranks_exception_message_is_shown_escaped_in_the_rank_table() -> None:
    def program(rank: int) -> None:
        if rank == 1:
            raise RuntimeError(HOSTILE)

    rendered = render_table(simulate(program, ranks=2))
    assert _controls(rendered) == set()
    assert len(rendered.splitlines()) == 4  # outcome, header, one row per rank
    assert "RuntimeError: \\x1b[2J\\rcleared\\nforged line" in rendered


def test_table_cells_are_shown_escaped() -> None:
    rendered = table(("rank", "backend said"), [("0", HOSTILE)])
    assert _controls(rendered) == set() and len(rendered.splitlines()) == 3


def test_a_verdict_prints_its_message_escaped_and_keeps_it_whole() -> None:
    verdict = Verdict("no-error", "step 0", (1,), f"rank 1 raised {HOSTILE}")
    assert _controls(str(verdict)) == set()
    assert str(verdict).startswith("no-error at step 0: rank 1 raised \\x1b[2J\\r")
    assert verdict.to_dict()["message"] == f"rank 1 raised {HOSTILE}"


def test_a_one_line_error_quoting_a_path_is_shown_escaped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dpsim.cli import main

    assert main(["check", "--target", "gone\x1b[2J\r.py"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "dpsim: error: --target gone\\x1b[2J\\r.py: no such file"
