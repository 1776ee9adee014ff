"""``graph-choice``: no rank settles for less than the table's graph for the agreed batch.

Asserts, for every sync that all ranks made afresh in a step the scenario's
oracle judged (:mod:`dpsim.scenarios.expect`: steps with a capture table and
some work), wherever the oracle gives a rank a graph and the rank splits its
step as the oracle does: the rank runs no lower a mode (eager below PIECEWISE
below FULL) and pads to no more tokens than that graph. The oracle's graph is
the table's own choice (the version's ``dispatch``) for the agreed batch: the
largest token count, the uniform length every rank shares, the largest
query-length bound, the rank's own request and LoRA counts; none when some
rank asked for eager or gets no graph for its own batch, and a microbatched
one only when every rank fills its last microbatch.

Why: the safety properties compare ranks with each other, so a choice wrong on
every rank alike passes them: a vote dropped so that every step runs eager, a
query-length bound lost so that varlen graphs never match, padding to a graph
larger than the agreed batch needs. Each costs throughput on every step of a
deployment without a single error. Where a rank runs more than the oracle
(a graph where it says eager, a higher mode, fewer tokens) or splits
differently, the safety properties (``eager-contagion``, ``ubatch-split``,
``coverage``, ``ubatch-decision``) judge; this one does not report their
findings twice. Guards: agreed values computed wrongly but identically, graph
misses that degrade decode steps (35376, 34167), eager fallbacks that fire too
often (51700's microbatching guard), and capture-size policies that do not
serve the batches they should.

For the V1 runner the oracle is :mod:`dpsim.scenarios.expect_v1`: each rank's
own dispatch, the least mode, the largest padded count when that mode
replays a graph or the step is split, and each rank's dispatch at the agreed
count restricted to the agreed mode, all asked of the release's dispatcher.
There an eager step is judged too: an eager rank pads no further than its
own padded vote (V1 pads only graphs and microbatched steps to the largest
rank, since 0.17; 0.12-0.16 pad every step of a deployment with graphs).
"""

from __future__ import annotations

from dpsim.records.policy import CudagraphMode
from dpsim.records.sync import Choice

from .base import EAGER, Evidence, Property, Verdict

NAME = "graph-choice"
#: Less is cheaper to get wrong: a rank may not fall to a lower mode.
_RANK: dict[str, int] = {
    CudagraphMode.NONE: 0,
    CudagraphMode.PIECEWISE: 1,
    CudagraphMode.FULL: 2,
}


def judge(evidence: Evidence) -> Verdict | None:
    expected = evidence.expected
    v1 = evidence.runner == "v1"
    for phase in evidence.complete_phases:
        choices = expected.get(phase.name)
        if choices is None or phase.any_reused:
            continue
        descriptors = phase.descriptors
        for rank, choice in enumerate(choices):
            ran = descriptors[rank]
            parts = ran.num_ubatches or 1
            if parts != choice.num_ubatches:
                continue  # the safety properties' to judge
            mode, wanted = ran.cg_mode, choice.cg_mode
            if wanted == EAGER and not (v1 and mode == EAGER):
                continue  # the safety properties' to judge
            # Ranked only when the modes differ: hashing a mode runs the
            # enum's Python __hash__, and a mode is no lower than itself.
            downgraded = mode != wanted and _RANK[mode] < _RANK[wanted]
            if downgraded or ran.num_tokens > choice.num_tokens:
                got = _shape(mode, ran.num_tokens, parts)
                return Verdict(
                    NAME,
                    phase.name,
                    (rank,),
                    f"rank {rank} runs {got}, but the agreed batch "
                    f"({_agreed(choice)}) calls for "
                    f"{_shape(wanted, choice.num_tokens, choice.num_ubatches)}",
                )
    return None


def _shape(mode: str, tokens: int, parts: int) -> str:
    split = f" in {parts} microbatches" if parts > 1 else ""
    return f"{mode} x {tokens} tokens{split}"


def _agreed(choice: Choice) -> str:
    return (
        f"largest {choice.largest} tokens, uniform {choice.uniform}, "
        f"query bound {choice.bound}"
    )


PROPERTY = Property(
    NAME,
    "no rank settles for less than the table's graph for the agreed batch",
    "choices wrong on every rank alike: needless eager, lost bounds, "
    "over-padding (35376, 34167)",
    judge,
)
