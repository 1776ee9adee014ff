"""``dpsim mutate``: mutation testing of the property suite on the real sync.

A passing property suite says nothing about the bugs it would miss. This
package plants one small, plausible bug at a time in a target's real
``dp_utils.py`` (generated at run time, never stored), checks each mutant the
way ``dpsim check`` does, and reports the share caught, how fast, by which
property, and every survivor as a diff to review. Under ``--lane runner`` the
mutated file is one the runner lane runs (engine loop, model runner,
speculators) and the judge is the runner lane's check: see
:mod:`dpsim.mutate.runner`.

Why a small AST engine and not cosmic-ray or mutmut: both run a test command
per mutant against an importable package (a subprocess with a fresh torch
import, seconds per mutant, where a kill here takes a fraction of one), and
neither restricts mutation to named functions or knows the DP-specific
operators (reductions, all/any, per-rank vs agreed values). The target is one
file loaded through dpsim's shim, not an importable module, and the checks
run in-process, so the engine is operators over ``ast`` plus text edits.
"""

from dpsim.mutate.mutants import Mutant, generate, select_operators, sites
from dpsim.mutate.operators import OPERATOR_NAMES, OPERATORS
from dpsim.mutate.report import render, summary, write
from dpsim.mutate.run import (
    DEFAULT_EXAMPLES,
    DEFAULT_SECONDS,
    Budget,
    MutantOutcome,
    Plan,
    baseline,
    check_mutant,
)
from dpsim.mutate.session import MutationReport, Result, mutate

__all__ = [
    "DEFAULT_EXAMPLES",
    "DEFAULT_SECONDS",
    "OPERATORS",
    "OPERATOR_NAMES",
    "Budget",
    "Mutant",
    "MutantOutcome",
    "MutationReport",
    "Plan",
    "Result",
    "baseline",
    "check_mutant",
    "generate",
    "mutate",
    "render",
    "select_operators",
    "sites",
    "summary",
    "write",
]
