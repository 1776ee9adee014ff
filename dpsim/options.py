"""Options every command and the pytest suite spell the same way.

Torch-free and free of the CLI, so the suite's configuration (imported in
every pytest session) and each command parse a ``--ranks`` and a
``--runner`` alike (ranks against the bound in :mod:`dpsim.limits`), with
the same refusal.
"""

from __future__ import annotations

import argparse

from dpsim.errors import UsageError
from dpsim.lanes import DEFAULT_LANE, LANES
from dpsim.limits import MAX_RANKS


def parse_ranks(text: str) -> tuple[int, int]:
    """``N`` or ``LO..HI`` as ``(low, high)``; a one-line UsageError otherwise."""
    try:
        if ".." in text:
            low, high = (int(part) for part in text.split("..", 1))
        else:
            low = high = int(text)
    except ValueError:
        raise UsageError(
            f"--ranks {text!r}: expected N or LO..HI, e.g. 2..16"
        ) from None
    if not 1 <= low <= high:
        raise UsageError(f"--ranks {text!r}: need 1 <= LO <= HI")
    if high > MAX_RANKS:
        raise UsageError(f"--ranks {text!r}: at most {MAX_RANKS:,} ranks")
    return low, high


#: The model runners whose DP coordination dpsim checks.
RUNNERS = ("v1", "v2")

#: What --seed and --profile mean, wherever a command takes them.
SEED_HELP = "the search's seed (default 0): the same seed draws the same cases"
PROFILE_HELP = (
    "caller (default): what vLLM's model runner passes; contract: everything "
    "the sync's documented contract allows"
)

#: What ``--runner`` means, said alike by every command and the pytest plugin.
RUNNER_HELP = (
    "whose DP coordination to check: v1 = the V1 model runner "
    "(coordinate_batch_across_dp in v1/worker/dp_utils.py, called by "
    "GPUModelRunner._determine_batch_execution_and_padding; vLLM 0.11.1 to 0.33, "
    "0.34.0 removed it), "
    "v2 = the V2 model runner (v1/worker/gpu/dp_utils.py; vLLM 0.18+); "
    "default: v2 where the vLLM has V2's sync, else v1"
)


def add_runner_argument(parser: argparse.ArgumentParser) -> None:
    """``--runner v1|v2``; absent, the target's default runner."""
    parser.add_argument("--runner", choices=RUNNERS, help=RUNNER_HELP)


def parse_runner(text: str | None, flag: str = "--runner") -> str | None:
    """``text`` when it names a runner, ``None`` (the target's default) when
    empty; a one-line UsageError otherwise."""
    if not text:
        return None
    if text not in RUNNERS:
        raise UsageError(f"{flag} {text!r}: expected one of {', '.join(RUNNERS)}")
    return text


LANE_HELP = (
    "sync = the real DP sync under callers dpsim models (default); runner = "
    "vLLM's real engine loop, worker, model runner and speculators per "
    "virtual rank (the V2 runner by default, vLLM 0.26+; with --runner v1 "
    "the V1 runner and its EAGLE/MTP drafter: `dpsim targets --lane runner "
    "--runner v1 X` says which releases it drives)"
)


def add_lane_argument(parser: argparse.ArgumentParser) -> None:
    """``--lane sync|runner``; the sync lane by default."""
    parser.add_argument("--lane", choices=LANES, default=DEFAULT_LANE, help=LANE_HELP)


#: The model runner the runner lane drives when ``--runner`` is not given
#: (on the sync lane an absent ``--runner`` is the target's default instead).
RUNNER_LANE_DEFAULT = "v2"


def lane_runner(lane: str, runner: str | None) -> str | None:
    """The model runner a command drives: under the runner lane ``--runner``
    or V2 (the lane's default, whatever the release's default runner); on the
    sync lane ``--runner`` as given (None: the target's default)."""
    if lane == "runner":
        return runner or RUNNER_LANE_DEFAULT
    return runner
