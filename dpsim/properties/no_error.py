"""``no-error``: no rank's call into the target raises.

Asserts that every sync call returned. The generators only produce inputs the
function's callers (``caller`` profile) or its documented contract
(``contract`` profile) allow, so an exception, an assertion above all, is the
target failing its own contract.

Why: in production an assertion in the step path kills the engine on one
rank and leaves the others blocked in the next collective. Guards: padding
assertions and crashes (26375, 30173, 35243, 55458, 56281).

For the V1 runner the call is the caller method with the sync inside it, so
its assertions count (the re-dispatch's count check, the dispatcher's), and
so does the release's ``DPMetadata.make`` that the forward builds.
"""

from __future__ import annotations

from .base import Evidence, Property, Verdict

NAME = "no-error"


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.phases:
        failed = [
            (rank, record.error)
            for rank, record in enumerate(phase.records)
            if record is not None and record.error is not None
        ]
        if failed:
            ranks = tuple(rank for rank, _ in failed)
            return Verdict(
                NAME,
                phase.name,
                ranks,
                f"rank {failed[0][0]} raised {failed[0][1]}"
                + (f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""),
            )
    for trace in evidence.result.ranks:
        if trace.error is not None:
            return Verdict(
                NAME,
                None,
                (trace.rank,),
                f"rank {trace.rank} raised {trace.error.type}: {trace.error.message}",
            )
    return None


PROPERTY = Property(
    NAME,
    "no rank's call into the target raises",
    "assertions and crashes in the step path (26375, 35243, 55458, 56281)",
    judge,
)
