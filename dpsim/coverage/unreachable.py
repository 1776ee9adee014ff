"""The target's lines and branches no run can reach, each with its reason.

The entries are the branch-reach work's (issue 19); the mechanism, matching by
text so an entry survives line moves between releases, is
:mod:`dpsim.coverage.marks`. ``dpsim check --coverage`` lists a matched branch
apart with its reason instead of as missing.

"Unreachable" means: not by ``dpsim check`` under its defaults (2..16 ranks,
the sync lane's callers), for the reason given. An entry the run does reach is
reported as reached, and one that matches nothing as stale, so the table
cannot quietly go out of date.
"""

from __future__ import annotations

from .marks import Unreachable

_V2 = "v1/worker/gpu/dp_utils.py"

#: Why a single DP rank is never simulated by ``check``.
_ONE_RANK = (
    "one DP rank: check draws 2..16 ranks by default, since a lone rank has "
    "nothing to agree on (`--ranks 1..16`, mutate's default, runs this branch)"
)

UNREACHABLE: tuple[Unreachable, ...] = (
    Unreachable(
        releases=">=0.20",
        file=_V2,
        function="dispatch_cg_and_sync_dp",
        source="if dp_size == 1:",
        to="return batch_desc, None",
        reason=_ONE_RANK,
    ),
    Unreachable(
        releases=">=0.20",
        file=_V2,
        function="dispatch_cg_and_sync_dp",
        source="return batch_desc, None",
        to=None,
        reason=_ONE_RANK,
    ),
)
