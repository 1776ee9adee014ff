"""Rerunning counterexamples: in the simulator, or on real torch.distributed.

``replay_in_sim`` reruns a file's case on the recorded (or another) target
with the recorded scheduling choices; ``run_lane`` runs it on N real
processes with gloo (or NCCL) groups and judges what they did with the same
properties; ``disagreements`` compares the two. ``assert_holds`` is what the
regression tests that ``dpsim check --out`` writes call.
"""

from dpsim.replay.compare import disagreements
from dpsim.replay.lane import BACKENDS, LaneError, LaneRun, run_lane
from dpsim.replay.simulated import (
    FAILS_DIFFERENTLY,
    HOLDS,
    REPRODUCED,
    SAME_VERDICTS,
    Rerun,
    ResolvedTarget,
    assert_holds,
    compare,
    load_chosen,
    replay_in_sim,
    resolve_target,
)
from dpsim.replay.sources import (
    Chosen,
    SourcesChanged,
    check_recorded_sources,
    choose,
    recorded_spec,
)

__all__ = [
    "BACKENDS",
    "FAILS_DIFFERENTLY",
    "HOLDS",
    "REPRODUCED",
    "SAME_VERDICTS",
    "Chosen",
    "LaneError",
    "LaneRun",
    "Rerun",
    "ResolvedTarget",
    "SourcesChanged",
    "assert_holds",
    "check_recorded_sources",
    "choose",
    "compare",
    "disagreements",
    "load_chosen",
    "recorded_spec",
    "replay_in_sim",
    "resolve_target",
    "run_lane",
]
