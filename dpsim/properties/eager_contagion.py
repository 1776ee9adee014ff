"""``eager-contagion``: one rank eager means every rank eager.

Asserts, for every completed sync in which some rank has work: if any rank
runs eager (``CUDAGraphMode.NONE``) or asked for eager (``need_eager``), every
rank runs eager.

Why: a rank running eager issues its MoE collectives with its own, unpadded
count while graph ranks replay a fixed padded shape: a hang, or on some
backends a ``num_tokens == num_tokens_padded`` assertion. Guards: eager on
some ranks and a graph on others (30173/30323, 34102).

For the V1 runner the same: ``need_eager`` is the caller's ``force_eager``
(profile runs, ``CUDAGraphMode.NONE`` dummy runs), and the synced least mode
is what should carry one rank's eager to all (0.12 synced no mode).
"""

from __future__ import annotations

from operator import attrgetter

from .base import EAGER, Evidence, Property, Verdict

NAME = "eager-contagion"
_NEED_EAGER = attrgetter("need_eager")


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.complete_phases:
        if not phase.any_work:
            continue
        eager_ranks = phase.modes.count(EAGER)
        if eager_ranks == len(phase.modes) or not (
            eager_ranks or any(map(_NEED_EAGER, phase.all_inputs))
        ):
            continue  # the usual phase, seen without a Python loop
        ranks = range(len(phase.records))
        eager = [d.cg_mode == EAGER for d in phase.descriptors]
        asked = [batch.need_eager for batch in phase.all_inputs]
        graph_ranks = tuple(rank for rank in ranks if not eager[rank])
        cause = next(rank for rank in ranks if eager[rank] or asked[rank])
        why = "asked for eager" if asked[cause] else "runs eager"
        # A rank that asked for eager and replays a graph itself is the
        # plainest contradiction: say that, naming the rank once.
        shown = cause if cause in graph_ranks else graph_ranks[0]
        mode = phase.descriptors[shown].cg_mode
        who = "" if shown == cause else f" rank {shown}"
        return Verdict(
            NAME,
            phase.name,
            (cause, *graph_ranks),
            f"rank {cause} {why} but{who} replays a {mode} graph",
        )
    return None


PROPERTY = Property(
    NAME,
    "one rank eager means all eager",
    "eager on some ranks, a graph on others (30173, 30323)",
    judge,
)
