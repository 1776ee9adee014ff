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

On the runner lane "the one it was given" is what vLLM's caller handed in:
0.32+'s drafter decode hands the sync an agreement it derived from the
target's (``_build_uniform_batch_dp_sync``: uniform decodes of one token), and
the lane notes it beside the record (``reuse_given``).

Not run on the V1 runner: its caller hands ``coordinate_batch_across_dp`` no
earlier agreement (dpsim has no V1 drafter scenario), so nothing is reused.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from dpsim.records.sync import REUSE_GIVEN_EVENT, SYNC_EVENT, Agreement

from .base import Evidence, Property, Verdict, on_dp_group

NAME = "reuse"


def judge(evidence: Evidence) -> Verdict | None:
    if not any(phase.any_reused for phase in evidence.phases):
        return None  # only a reusing call can break it (most runs have none)
    for trace in evidence.result.ranks:
        given: Agreement | None = None
        handed = iter(_handed_in(trace.events))
        for record, issued in evidence.syncs_and_their_collectives(trace):
            # The agreement this call was handed, where the runner lane noted
            # it was not the latest fresh one; else that one.
            expected = next(handed) or given
            if record.reused and not record.raised and expected is not None:
                if on_dp_group(issued()):
                    return Verdict(
                        NAME,
                        record.phase,
                        (trace.rank,),
                        f"rank {trace.rank} reused an agreement but synced again",
                    )
                reason = _changed(expected, record.agreement)
                if reason is not None:
                    return Verdict(NAME, record.phase, (trace.rank,), reason)
            elif not record.reused and not record.solo:
                given = record.agreement
    return None


def _handed_in(events: tuple[Any, ...]) -> list[Agreement | None]:
    """Per sync record of a rank, the agreement its call was handed when the
    runner lane noted one other than the latest fresh one; else None."""
    handed: list[Agreement | None] = []
    pending: Agreement | None = None
    for event in events:
        if event.kind == REUSE_GIVEN_EVENT:
            pending = Agreement.from_json(event.payload["agreement"])
        elif event.kind == SYNC_EVENT:
            handed.append(pending)
            pending = None
    return handed


def _changed(given: Agreement, returned: Agreement | None) -> str | None:
    if returned is None:
        return "the reused agreement came back as none"
    for field in fields(Agreement):
        key = field.name
        if key == "num_tokens_across_dp":
            continue
        value, now = getattr(given, key), getattr(returned, key)
        if now != value:
            return f"reuse changed the agreed {key} from {value} to {now}"
    before, after = given.num_tokens_across_dp, returned.num_tokens_across_dp
    if after != before and (
        len(set(after)) != 1
        or any(new < old for new, old in zip(after, before, strict=True))
    ):
        return (
            f"reuse changed the agreed counts from {list(before)} to {list(after)}, "
            "not only padding them"
        )
    return None


PROPERTY = Property(
    NAME,
    "a call reusing an agreement issues no collective and returns it, padded further only",
    "drafter and target disagreeing (27691, 30119)",
    judge,
    not_for_v1="V1's caller reuses no agreement (no V1 drafter scenario)",
)
