"""``agreed-values``: the agreement holds what the ranks voted, not just the same thing.

Asserts, for every sync that all ranks made afresh (not reusing an earlier
agreement) and that gave every rank the same ``DPSyncState``: its uniform decode
length is the ranks' common one, or None when they differ or any rank has
none; ``eager`` is set only when every rank runs eager; its request bound
(``num_reqs``, where the version has it) is at least every rank's request
count, and is the largest of them unless a FULL graph imposed its padded
count; ``skip_drafts`` (where the version has it) is set exactly when every
rank allowed it; the query-length bound (where the version agrees one, 0.34+)
is the largest rank's, or None when any rank has none.

Why: ``agreement`` only asks that ranks got the same values, so an agreement
computed wrongly but identically everywhere (a uniform length no rank has, a
request bound below a rank's batch, drafts skipped that a rank needed) passes
it, and callers then size buffers or skip work from a wrong number. Guards:
agreed values computed from the wrong rank or the wrong reduction (30173,
35294, 40589/44185 for skipped drafts). A reusing dispatch takes the agreed
bound in place of its own (0.34+), so a bound below a rank's would put that
rank's longer queries into a varlen graph too narrow for them.

Not run on the V1 runner: ``coordinate_batch_across_dp`` returns no
``DPSyncState``, and what it does agree (the least mode, microbatching, the
padded counts) is judged against the votes by ``graph-choice``,
``ubatch-decision`` and ``padded-counts``.
"""

from __future__ import annotations

from dpsim.records.sync import Agreement

from .base import EAGER, FULL_GRAPH, Evidence, Phase, Property, Verdict

NAME = "agreed-values"


def judge(evidence: Evidence) -> Verdict | None:
    for phase in evidence.complete_phases:
        if not phase.any_work or phase.any_reused:
            continue
        agreement = phase.agreements[0]
        if agreement is None or agreement.eager is None:
            continue  # no DPSyncState: the version agrees token counts only
        if phase.agreements_differ is not None:
            continue  # ranks disagree: `agreement`'s to report
        reason = _wrong_value(phase, agreement)
        if reason is not None:
            return Verdict(NAME, phase.name, tuple(range(len(phase.records))), reason)
    return None


def _wrong_value(phase: Phase, agreement: Agreement) -> str | None:
    inputs = phase.all_inputs
    descriptors = phase.descriptors
    voted = {batch.uniform_token_count for batch in inputs}
    common = voted.pop() if len(voted) == 1 else None
    expected_uniform = common or None
    if agreement.uniform_token_count != expected_uniform:
        return (
            f"agreed uniform length {agreement.uniform_token_count}, but the ranks "
            f"passed {[batch.uniform_token_count for batch in inputs]}"
        )
    if agreement.eager and any(d.cg_mode != EAGER for d in descriptors):
        graph = next(d for d in descriptors if d.cg_mode != EAGER)
        return f"agreed eager, but a rank replays a {graph.cg_mode} graph"
    if agreement.num_reqs is not None:
        most = max(batch.num_reqs for batch in inputs)
        padded = {
            d.num_reqs for d in descriptors if d.cg_mode == FULL_GRAPH and d.num_reqs
        }
        allowed = {most} | (padded if len(padded) == 1 else set())
        if agreement.num_reqs not in allowed or agreement.num_reqs < most:
            return (
                f"agreed request bound {agreement.num_reqs}, but the ranks have "
                f"up to {most} requests"
                + (f" (FULL graph pads to {padded.pop()})" if len(padded) == 1 else "")
            )
    if agreement.reports_max_query_len:
        bounds = [batch.max_query_len for batch in inputs]
        expected_bound = None if None in bounds else max(bounds)  # type: ignore[type-var]
        if agreement.max_query_len != expected_bound:
            return (
                f"agreed query-length bound {agreement.max_query_len}, but the "
                f"ranks passed {bounds}"
            )
    if agreement.skip_drafts is not None:
        votes = [batch.allow_skip_drafts for batch in inputs]
        if agreement.skip_drafts != all(votes):
            return f"agreed skip_drafts={agreement.skip_drafts}, but the ranks voted {votes}"
    return None


PROPERTY = Property(
    NAME,
    "the agreement holds what the ranks voted: uniform length, eager, request "
    "bound, skip-drafts",
    "agreed values from the wrong rank or reduction (30173, 35294, 40589)",
    judge,
    not_for_v1="V1 agrees no DPSyncState; graph-choice, ubatch-decision and "
    "padded-counts judge what it agrees",
)
