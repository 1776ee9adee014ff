"""How a real lane's run is shown: its processes and whether it agrees with
the simulator, as text and as ``replay --json``'s summary.

Both lanes' real runs use it (the sync lane's :class:`dpsim.replay.LaneRun`
and the runner lane's :class:`dpsim.lanes.runner.processes.RunnerLaneRun`),
so it sits below the CLI that prints it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpsim.report import table
from dpsim.terminal import printable

if TYPE_CHECKING:
    from dpsim.lanes.runner.processes import RunnerLaneRun
    from dpsim.replay.lane import LaneRun


def render_processes(
    lane: LaneRun | RunnerLaneRun, differences: tuple[str, ...]
) -> list[str]:
    """How a real lane's processes ended, and whether it agrees with the
    simulator (both lanes' real runs: the sync lane's and the runner lane's)."""
    lines = ["processes:"]
    rows = [
        (
            str(end.rank),
            str(end.pid),
            _exit(end.exitcode),
            end.reaped,
            end.backend_error or "",
        )
        for end in lane.ends
    ]
    lines.extend(
        "  " + line
        for line in table(
            ("rank", "pid", "exit", "reaped", "backend said"), rows
        ).splitlines()
    )
    lines.append(
        f"  start-up {lane.startup_s:.1f}s, run {lane.run_s:.1f}s"
        + (
            ", watchdog fired (no progress within the timeout)"
            if lane.watchdog_fired
            else ""
        )
    )
    lines.append("")
    if differences:
        lines.append("DPSIM BUG: the real lane disagrees with the simulator:")
        lines.extend(f"  {printable(line)}" for line in differences)
    else:
        lines.append("the real lane agrees with the simulator")
    return lines


def _exit(code: int | None) -> str:
    if code is None:
        return "?"
    return f"signal {-code}" if code < 0 else str(code)


def lane_summary(
    lane: LaneRun | RunnerLaneRun, differences: tuple[str, ...]
) -> dict[str, Any]:
    """A real lane's run in ``replay --json``'s summary (both lanes')."""
    return {
        "verdict": "pass" if lane.holds else "fail",
        "outcome": lane.result.outcome.value,
        "verdicts": [verdict.to_dict() for verdict in lane.verdicts],
        "ranks": [
            {
                "rank": end.rank,
                "state": trace.state.value,
                "exit": end.exitcode,
                "reaped": end.reaped,
                "backend_error": end.backend_error,
            }
            for end, trace in zip(lane.ends, lane.result.ranks, strict=True)
        ],
        "watchdog_fired": lane.watchdog_fired,
        "startup_s": round(lane.startup_s, 3),
        "run_s": round(lane.run_s, 3),
        "disagreements": list(differences),
    }
