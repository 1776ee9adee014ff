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

On the runner lane, an exception vLLM's executor kept in a future (the
engine loop re-raises it only when it pops that batch, and may first enter
its next DP sync while peers wait) counts too (``worker_error`` events).
"""

from __future__ import annotations

from .base import Evidence, Property, Verdict

NAME = "no-error"


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.phases:
        if phase.complete:
            continue  # every rank returned: none raised
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
    for rank, event in evidence.worker_errors:
        # Kept in a future by vLLM's executor: the rank went on (and its
        # peers may hang on it), but it raised all the same.
        return Verdict(
            NAME,
            None,
            (rank,),
            f"rank {rank} raised {event.payload['error']} at "
            f"{event.payload.get('where') or '(no vLLM frame)'} (kept in "
            "the executor's future)",
        )
    for trace in evidence.result.ranks:
        # dpsim's own error is no verdict (runs refuse it before judging).
        if trace.error is not None and trace.error.fault is None:
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
