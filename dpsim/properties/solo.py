"""``solo``: a rank told to skip DP coordination answers alone, as the ranks would together.

Asserts, for every sync a rank made inside ``skip_dp_coordination()`` (the
``solo`` phases: steps in which every rank has the same batch, synced a second
time on versions that let callers skip coordination, 0.30+): the call issued
no collective on a DP group, and its descriptor and agreement are the ones the
same rank got from the coordinated sync of that step.

Why: non-MoE data parallelism runs no expert collectives, so vLLM lets such
ranks skip the per-step all-reduce (24828) and answer from their own batch as
if every rank had it. With every rank holding the same batch that answer is
known: the coordinated one. A skip that still all-reduces is a collective
only some callers issue (a hang), and one that reads the table wrongly
(its own column left empty, a neighbour's copied) runs a shape the rank's
batch does not have. Guards: the skip path of 24828 and the per-step DP
collective it removes (43547's hang when some ranks skip it).

For the V1 runner the same, on 0.30 and later: ``coordinate_batch_across_dp``
inside ``skip_dp_coordination()`` pads to the rank's own count and keeps its
own mode, which with identical batches is what the ranks agree together.
"""

from __future__ import annotations

from dpsim.records.sync import Agreement, Descriptor, SyncRecord

from .base import Evidence, Property, Verdict, on_dp_group

NAME = "solo"


def judge(evidence: Evidence) -> Verdict | None:
    if not evidence.solo_calls:
        return None  # only a solo call can break it (most runs have none)
    for trace in evidence.result.ranks:
        together: dict[str, SyncRecord] = {}
        for record, issued in evidence.syncs_and_their_collectives(trace):
            name = record.phase
            if not record.solo:
                together[name] = record
                continue
            if record.raised:
                continue  # no-error's to report
            rank = (trace.rank,)
            if on_dp_group(issued()):
                return Verdict(
                    NAME,
                    name,
                    rank,
                    f"rank {trace.rank} skipped DP coordination but synced",
                )
            # "solo 3" repeats "step 3" (or "profile 3", "ubatch 3").
            peer = together.get(name.replace("solo", evidence.case.scenario))
            if peer is None or peer.raised:
                continue
            for key, alone, agreed in (
                ("descriptor", record.descriptor, peer.descriptor),
                ("agreement", record.agreement, peer.agreement),
            ):
                if alone != agreed:
                    return Verdict(
                        NAME,
                        name,
                        rank,
                        f"rank {trace.rank} alone got {key} {_short(alone)}, "
                        f"but with every rank's identical batch the ranks agreed "
                        f"{_short(agreed)}",
                    )
    return None


def _short(value: Descriptor | Agreement | None) -> str:
    if value is None:
        return str(value)
    shown = value.to_json()
    return "{" + ", ".join(f"{k}={v}" for k, v in shown.items() if v is not None) + "}"


PROPERTY = Property(
    NAME,
    "a sync skipping DP coordination issues no DP collective and answers as "
    "the coordinated sync did for the same batch on every rank",
    "the non-MoE skip path (24828) and the collective it removes (43547)",
    judge,
)
