"""Does the real lane agree with the simulator? Any difference is a dpsim bug.

The simulator is dpsim's model of what real process groups do; the lane runs
the same target, case and programs on real ones. They must agree on the
outcome, on every rank's end state, on where each stuck rank stands, on every
collective each rank entered (group, number, signature, contribution and, if
it completed, result), on every sync record, and on the verdicts. Scheduling
choices and step counts of ranks the simulator stopped are the simulator's
own business and are not compared.
"""

from __future__ import annotations

import json
from typing import Any

from dpsim.properties import Verdict
from dpsim.records.trace import SimResult

_RANK_FIELDS = ("state", "returned", "error", "waiting", "collectives", "events")


def disagreements(
    simulated: SimResult,
    simulated_verdicts: tuple[Verdict, ...],
    real: SimResult,
    real_verdicts: tuple[Verdict, ...],
) -> tuple[str, ...]:
    """One line per difference; empty when the lanes agree."""
    lines = []
    if simulated.outcome != real.outcome:
        lines.append(
            f"outcome: simulator {simulated.outcome.value}, real {real.outcome.value}"
        )
    for sim_rank, real_rank in zip(
        simulated.to_dict()["ranks"], real.to_dict()["ranks"], strict=True
    ):
        for name in _RANK_FIELDS:
            if sim_rank[name] != real_rank[name]:
                lines.append(
                    f"rank {sim_rank['rank']} {name}: simulator {_short(sim_rank[name])}"
                    f", real {_short(real_rank[name])}"
                )
    sim_incomplete = [item.to_dict() for item in simulated.incomplete]
    real_incomplete = [item.to_dict() for item in real.incomplete]
    if sim_incomplete != real_incomplete:
        lines.append(
            f"incomplete collectives: simulator {_short(sim_incomplete)}, "
            f"real {_short(real_incomplete)}"
        )
    sim_verdicts = [verdict.to_dict() for verdict in simulated_verdicts]
    real_verdicts_list = [verdict.to_dict() for verdict in real_verdicts]
    if sorted(map(_key, sim_verdicts)) != sorted(map(_key, real_verdicts_list)):
        lines.append(
            f"verdicts: simulator {_short(sim_verdicts)}, real {_short(real_verdicts_list)}"
        )
    return tuple(lines)


def _key(verdict: dict[str, Any]) -> str:
    return json.dumps(verdict, sort_keys=True)


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
