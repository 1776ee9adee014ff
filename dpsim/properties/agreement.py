"""``agreement``: every rank comes out of a sync with the same agreement.

Asserts, for every sync that all ranks completed: the agreement each rank got
back (every ``DPSyncState`` field, or the token-count tensor of versions
without one) is identical on all ranks; and unless the ranks agreed to run
eager, they chose the same padded token count and the same number of
microbatches.

Why: callers branch on the agreement to decide which collectives to issue and
with what shapes. Any per-rank value in it lets ranks take different branches,
which in a DP+EP deployment is a hang or silent corruption of the MoE
all-to-all. Guards: a per-rank value used where an agreed one was needed
(vLLM 25906, 35294, vllm-ascend 1636); eager/graph disagreement (30173/30323).

For the V1 runner the agreement is what ``coordinate_batch_across_dp``
returned: the per-rank count tensor, the synced cudagraph mode (0.13+) and
whether to microbatch; eager is every rank running ``CUDAGraphMode.NONE``.
"""

from __future__ import annotations

from dataclasses import fields

from dpsim.records.sync import Agreement

from .base import EAGER, Evidence, Property, Verdict, first_difference

NAME = "agreement"


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.complete_phases:
        agreements = phase.agreements
        differs = phase.agreements_differ
        if differs is not None:
            first, other = differs
            field = _first_field_differing(agreements[first], agreements[other])
            return Verdict(
                NAME,
                phase.name,
                differs,
                f"rank {first} and rank {other} got different agreements "
                f"({field}: {_field(agreements[first], field)} vs "
                f"{_field(agreements[other], field)})",
            )
        agreed = agreements[0]
        descriptors = phase.descriptors
        eager = (
            agreed.eager
            if agreed is not None and agreed.eager is not None
            else phase.modes.count(EAGER) == len(descriptors)
        )
        if eager:
            continue
        for label, chosen in (
            ("padded token count", phase.padded_counts),
            ("microbatch count", [d.num_ubatches for d in descriptors]),
        ):
            differs = first_difference(chosen)
            if differs is not None:
                first, other = differs
                return Verdict(
                    NAME,
                    phase.name,
                    differs,
                    f"ranks chose different {label}s: rank {first} "
                    f"{chosen[first]}, rank {other} {chosen[other]}",
                )
    return None


def _first_field_differing(left: Agreement | None, right: Agreement | None) -> str:
    if left is None or right is None:
        return "agreement"
    return next(
        field.name
        for field in fields(Agreement)
        if getattr(left, field.name) != getattr(right, field.name)
    )


def _field(agreement: Agreement | None, field: str) -> object:
    """The field as the trace shows it; the whole agreement for "agreement"."""
    if agreement is None:
        return None
    shown = agreement.to_json()
    return shown.get(field, shown)


PROPERTY = Property(
    NAME,
    "every rank returns the same agreement and, unless eager, the same padded "
    "token count and microbatch count",
    "per-rank value where an agreed one was needed (25906, 35294, ascend 1636)",
    judge,
)
