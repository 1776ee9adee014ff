"""``reuse``: a call that reuses an agreement issues no collective and keeps it.

Asserts, for every sync a rank made with an earlier agreement to reuse (the
drafter's prefill): the call issued no collective on the DP group, and the
agreement it returned is the one it was given, except that the agreed
per-rank counts may be raised to what this call's table pads to.

Why: reuse exists so that the drafter's prefill, which runs the target's
batch shape, costs no second round trip; a reuse that silently syncs again
is a collective some callers issue and others do not (a hang when only some
ranks have a drafter step), and one that changes the agreed values
desynchronises the drafter from the target. Guards: drafter and target
disagreeing (27691, 30119).
"""

from __future__ import annotations

from typing import Any

from .base import (
    Evidence,
    Property,
    Verdict,
    on_dp_group,
    syncs_and_their_collectives,
)

NAME = "reuse"


def judge(evidence: Evidence) -> Verdict | None:
    for trace in evidence.result.ranks:
        given: dict[str, Any] | None = None
        for payload, issued in syncs_and_their_collectives(trace):
            if payload["reused"] and "descriptor" in payload and given is not None:
                if on_dp_group(issued):
                    return Verdict(
                        NAME,
                        payload["phase"],
                        (trace.rank,),
                        f"rank {trace.rank} reused an agreement but synced again",
                    )
                reason = _changed(given, payload["agreement"])
                if reason is not None:
                    return Verdict(NAME, payload["phase"], (trace.rank,), reason)
            elif not payload["reused"] and not payload.get("solo"):
                given = payload.get("agreement")
    return None


def _changed(given: dict[str, Any], returned: dict[str, Any] | None) -> str | None:
    if returned is None:
        return "the reused agreement came back as none"
    for key, value in given.items():
        if key == "num_tokens_across_dp":
            continue
        if returned[key] != value:
            return f"reuse changed the agreed {key} from {value} to {returned[key]}"
    before, after = given["num_tokens_across_dp"], returned["num_tokens_across_dp"]
    if after != before and (
        len(set(after)) != 1
        or any(new < old for new, old in zip(after, before, strict=True))
    ):
        return f"reuse changed the agreed counts from {before} to {after}, not only padding them"
    return None


PROPERTY = Property(
    NAME,
    "a call reusing an agreement issues no collective and returns it, padded further only",
    "drafter and target disagreeing (27691, 30119)",
    judge,
)
