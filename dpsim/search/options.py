"""``--engine``: the option that picks how cases are drawn, shared by every command."""

from __future__ import annotations

import argparse

#: How cases are drawn; the first is the default. ``check.CheckOptions.engine``.
ENGINES = ("hypothesis", "fast")

ENGINE_HELP = (
    "how cases are drawn (default hypothesis). hypothesis: Hypothesis' engine "
    "draws every case, and may mutate earlier cases and replay its example "
    "database's. fast: dpsim draws each case from the same strategies, with "
    "Hypothesis' own distribution but without its engine, which costs several "
    "times less per case; no mutation of earlier cases, exact repeats skipped; "
    "a database is still replayed first and the failing case saved to it, and "
    "the first failing case is shrunk by Hypothesis' shrinker as under hypothesis, "
    "with one pass more (a rank or step count lowered together with the ranks "
    "or steps it counted)"
)


def add_engine_argument(
    parser: argparse.ArgumentParser, *, flag: str = "--engine", repeatable: bool = False
) -> None:
    """``flag`` with :data:`ENGINES`; ``repeatable`` where a command measures
    several engines side by side (``dpsim bench``)."""
    if repeatable:
        parser.add_argument(
            flag,
            action="append",
            choices=ENGINES,
            help=ENGINE_HELP + " (repeatable: a row each; default both)",
        )
    else:
        parser.add_argument(flag, default=ENGINES[0], choices=ENGINES, help=ENGINE_HELP)
