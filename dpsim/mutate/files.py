"""Which file of a target a mutation run edits, and which of its functions.

``sync`` is the runner's ``dp_utils.py`` (V2's ``dispatch_cg_and_sync_dp`` and
its helpers, or V1's ``coordinate_batch_across_dp`` and its helpers): every
module-level function. ``caller`` is V1's ``gpu_model_runner.py``, mutated
only inside ``GPUModelRunner._determine_batch_execution_and_padding`` (and
the closures it defines): that method is the part of the 4,000-line file dpsim
runs for real, so a mutant anywhere else could never be told from the
original, and would only dilute the score.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

from dpsim.errors import UsageError
from dpsim.mutate.mutants import defined_functions
from dpsim.targets.load import (
    DP_UTILS_MODULE,
    V1_CALLER_MODULE,
    V1_DP_UTILS_MODULE,
    Target,
    source_paths,
)
from dpsim.targets.v1.caller import CALLER_METHOD, RUNNER_CLASS

#: What ``dpsim mutate --file`` accepts.
SLOTS = ("sync", "caller")


@dataclass(frozen=True)
class MutatedFile:
    """The text a run mutates and where the mutants may go."""

    #: ``sync`` or ``caller``: which file of the target each mutant replaces.
    slot: str
    path: str
    text: str
    sha256: str
    #: Qualified names of the functions to mutate (``Class.method``); None:
    #: every module-level function.
    functions: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        """The file's name in diffs: the vLLM file it stands for, whatever
        the path (a ``--target`` file stands for dp_utils.py)."""
        return diff_name(self.slot)


#: The file a runner-lane slot (:data:`dpsim.mutate.runner.RUNNER_SLOTS`)
#: names, as diffs name it.
_RUNNER_DIFF_NAMES = {
    "core": "core.py",
    "model_runner": "model_runner.py",
    "speculator": "speculator.py",
    "draft": "speculator.py",
    "parallel": "parallel.py",
}


def diff_name(slot: str) -> str:
    """The vLLM file a mutant of ``slot`` replaces, as diffs name it."""
    if slot in _RUNNER_DIFF_NAMES:
        return _RUNNER_DIFF_NAMES[slot]
    return "gpu_model_runner.py" if slot == "caller" else "dp_utils.py"


def mutated_file(target: Target, slot: str = "sync") -> MutatedFile:
    """The file of ``target`` that ``slot`` names, refusing a slot the target lacks."""
    if slot not in SLOTS:
        raise UsageError(f"--file {slot!r}: expected one of {', '.join(SLOTS)}")
    if slot == "caller" and target.runner != "v1":
        raise UsageError(
            f"--file caller mutates the V1 runner's {CALLER_METHOD}; "
            f"{target.label} is the V2 runner's sync (add --runner v1)"
        )
    sync = V1_DP_UTILS_MODULE if target.runner == "v1" else DP_UTILS_MODULE
    module = V1_CALLER_MODULE if slot == "caller" else sync
    path = source_paths(target.spec, (module,))[module]
    if path is None:
        raise UsageError(f"{target.label}: no file for {module} to mutate")
    data = path.read_bytes()
    text = data.decode("utf-8")
    functions = None
    if slot == "caller":
        qualified = f"{RUNNER_CLASS}.{CALLER_METHOD}"
        if qualified not in defined_functions(ast.parse(text)):
            raise UsageError(
                f"{target.label}: {path.name} defines no {qualified} to mutate "
                "(vLLM 0.11.x runs the sync inside _prepare_inputs, which dpsim "
                "models; --file caller needs vLLM 0.12+)"
            )
        functions = (qualified,)
    return MutatedFile(
        slot, str(path), text, hashlib.sha256(data).hexdigest(), functions
    )
