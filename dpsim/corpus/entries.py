"""The corpus: each entry one upstream bug, planted in a correct reference twin.

Edits quote the reference verbatim (old text) and say what the buggy code did
instead (new text); keep them small enough to read as a code-review diff.
``caught_by`` lists the properties expected to fail, the designated one first.
"""

from __future__ import annotations

from dpsim.corpus.entries_v1 import V1_ENTRIES
from dpsim.corpus.model import (
    AGREED_FOR_PER_RANK,
    COLLECTIVE_SKIPPED,
    DRAFTER_PADDING,
    DUMMY_NOT_SHAPED,
    EAGER_AND_GRAPH,
    EXTRA_COLLECTIVE,
    GRAPH_MISSED,
    PER_RANK_FOR_AGREED,
    UBATCH_BOUNDARY,
    FaultyTarget,
)
from dpsim.records.policy import CapturePolicy, CudagraphMode, Microbatching

# Reference texts several entries edit, named once so the diffs stay legible.
_V29_IDLE_RETURN = """\
    if not bool(counts.any()):
        # Nobody has work: no graph, and nothing for a later step to reuse.
        return eager_descriptor(0, 0), None
"""
_V29_EAGER_DECISION = "    if int(table[MODE_ROW].min()) == CUDAGraphMode.NONE.value:\n"
_V29_REUSE_REPORTS_PADDING = """\
    if chosen.num_tokens != num_tokens:
        # That table padded further: report what every rank now runs.
        dp_sync = replace(
            dp_sync,
            num_tokens_across_dp=torch.full_like(
                dp_sync.num_tokens_across_dp, chosen.num_tokens
            ),
        )
"""

# A drafter whose capture sizes sit between the target's: every target size
# but the largest pads further on the drafter (4 -> 6, 8 -> 12).
_DRAFTER_PADS_FURTHER = CapturePolicy(
    capture_sizes=(4, 8),
    cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
    max_num_seqs=8,
    decode_query_len=2,
    drafter=CapturePolicy(
        capture_sizes=(6, 12), cudagraph_mode=CudagraphMode.PIECEWISE, max_num_seqs=8
    ),
)
# Varlen decode graphs (bounded by the decode length, 2) over a wide table, so
# a decoding rank next to a rank with longer queries often fits one.
_VARLEN_DECODE = CapturePolicy(
    capture_sizes=(2, 4, 8, 16, 32, 64, 128, 256),
    cudagraph_mode=CudagraphMode.FULL_AND_PIECEWISE,
    max_num_seqs=256,
    decode_query_len=2,
    varlen_decode=True,
)
# Two-way microbatching with thresholds every batch clears and FULL graphs only
# at 8 and 16, so counts such as [4, 8] land on the 57020 boundary.
_TWO_WAY_SPLIT = CapturePolicy(
    capture_sizes=(8, 16),
    cudagraph_mode=CudagraphMode.FULL,
    max_num_seqs=16,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
    ),
)

#: Thresholds far apart, so a decode held to the wrong one is decided wrongly.
_THRESHOLDS_APART = CapturePolicy(
    capture_sizes=(8, 16),
    cudagraph_mode=CudagraphMode.FULL,
    max_num_seqs=16,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=2, prefill_token_threshold=12
    ),
)

ISSUES: tuple[FaultyTarget, ...] = (
    FaultyTarget(
        name="dispatch-own-count",
        kind="issue",
        reference="v29",
        edits=(("        int(counts.max()),\n", "        num_tokens,\n"),),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#25906", "ascend#1636"),
        docstring=(
            "after the exchange each rank dispatches its own token count instead "
            "of the largest, as vLLM's dummy run did before #25906 and "
            "vllm-ascend's torchair attention did before #1636. Ranks with "
            "different loads replay graphs of different sizes, so their MoE "
            "all-to-alls move different shapes: a hang on NCCL, a size mismatch "
            "on gloo, and an agreement whose padded counts differ by rank."
        ),
        caught_by=("no-hang", "agreement", "padded-counts"),
        scenario="step",
    ),
    FaultyTarget(
        name="idle-rank-skips-sync",
        kind="issue",
        reference="v29",
        edits=(
            (
                "    if dp_size == 1:\n        return wanted, None\n",
                "    if dp_size == 1 or num_tokens == 0:\n"
                "        # Nothing scheduled here: skip the exchange.\n"
                "        return wanted, None\n",
            ),
        ),
        bug_class=COLLECTIVE_SKIPPED,
        upstream=("vllm#28774", "vllm#43547"),
        docstring=(
            "a rank with no scheduled tokens returns before the DP all-reduce, "
            "as execute_model did for 0-token steps (#28774; #43547 for the ray "
            "and mp backends). The busy ranks wait in the exchange for a rank "
            "that never comes: a gloo size mismatch at once, or, where each "
            "asymmetric step drifts the collectives by one, an NCCL deadlock an "
            "hour later."
        ),
        caught_by=("idle", "no-hang", "agreement", "padded-counts"),
        scenario="step",
        profile="contract",
    ),
    FaultyTarget(
        name="eager-mode-not-synced",
        kind="issue",
        reference="v29",
        edits=(
            (_V29_EAGER_DECISION, "    if wanted.cg_mode == CUDAGraphMode.NONE:\n"),
        ),
        bug_class=EAGER_AND_GRAPH,
        upstream=("vllm#30173", "vllm#30323"),
        docstring=(
            "the graph mode each rank wants is exchanged but each rank decides "
            "eager on its own wish, so a rank with a mixed batch under "
            "FULL_DECODE_ONLY (or an eager dummy run) runs eager while the others "
            "replay a graph of the agreed size. Fixed upstream by syncing the "
            "mode (#30173, #30323); before that, the "
            "`num_tokens == num_tokens_padded` assertion or a hang."
        ),
        caught_by=("eager-contagion", "no-hang", "agreement"),
        scenario="step",
    ),
    FaultyTarget(
        name="uniform-count-per-rank",
        kind="issue",
        reference="v29",
        edits=(
            (
                "    uniform = shared_value(table[UNIFORM_ROW], NO_UNIFORM)\n",
                "    uniform = uniform_token_count\n",
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#30173", "vllm#35294"),
        docstring=(
            "each rank keeps its own uniform decode length instead of the one "
            "all ranks share (None unless every rank decodes alike). A decoding "
            "rank picks a FULL uniform-decode graph while a rank with a prefill "
            "picks a PIECEWISE one, possibly of another size, and the agreement "
            "each hands its drafter differs by rank: the uniform-decode "
            "disagreement behind #30173, and per-rank speculator counts (#35294)."
        ),
        caught_by=("agreement", "no-hang"),
        scenario="step",
    ),
    FaultyTarget(
        name="uniform-read-off-rank-0",
        kind="issue",
        reference="v29",
        edits=(
            (
                "    if first == absent or bool((column != first).any()):\n",
                "    if first == absent:\n",
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#30173", "vllm#35243"),
        docstring=(
            "the shared uniform decode length is read off rank 0 without checking "
            "that every rank decodes alike. All ranks agree, on the same wrong "
            "value: when rank 0 decodes and another rank has a prefill, every "
            "rank replays rank 0's FULL uniform-decode graph, and the rank with "
            "the prefill runs it over a batch it cannot describe (the uniform-"
            "decode disagreement of #30173; non-uniform batches in uniform graphs, "
            "#35243). A drafter reusing that agreement trips its same-batch "
            "assertion on the prefill rank, which is where it shows most."
        ),
        caught_by=("no-error", "coverage"),
        scenario="drafter",
    ),
    FaultyTarget(
        name="drafter-reuse-unreported-padding",
        kind="issue",
        reference="v29",
        edits=((_V29_REUSE_REPORTS_PADDING, ""),),
        bug_class=DRAFTER_PADDING,
        upstream=("vllm#30119", "vllm#27691"),
        docstring=(
            "a drafter reusing the target's agreement re-dispatches on its own "
            "capture table, which may pad further, but hands back the target's "
            "counts unchanged. The forward context then sizes every rank's share "
            "of the MoE all-to-all from a count smaller than the one each rank "
            "runs: the drafter-padding mismatch of #30119 and #27691."
        ),
        caught_by=("padded-counts",),
        scenario="drafter",
        policy=_DRAFTER_PADS_FURTHER,
    ),
    FaultyTarget(
        name="drafter-reuse-ignores-eager",
        kind="issue",
        reference="v29",
        edits=(("    if need_eager or dp_sync.eager:\n", "    if need_eager:\n"),),
        bug_class=DRAFTER_PADDING,
        upstream=("vllm#27691", "vllm#30119"),
        docstring=(
            "a drafter reusing an eager agreement dispatches a graph anyway. An "
            "eager agreement fixed no shape: each rank's count is its own, so "
            "each rank's drafter table picks a graph of its own size (or none), "
            "and the drafter forward hangs or crashes as in #27691, where ranks "
            "disagreed on drafter padding."
        ),
        caught_by=("no-hang", "eager-contagion", "agreement"),
        scenario="drafter",
    ),
    FaultyTarget(
        name="ubatch-own-vote",
        kind="issue",
        reference="v33",
        edits=(
            (
                '    if reports.unanimous("allow_ubatching"):\n',
                "    if allow_ubatching:\n",
            ),
        ),
        bug_class=UBATCH_BOUNDARY,
        upstream=("vllm#50945", "vllm#27771"),
        docstring=(
            "a rank microbatches on its own vote instead of only when every rank "
            "allows it. Ranks that split run one expert all-to-all per microbatch, "
            "the others run one: the collective counts drift and the step hangs. "
            "Microbatching is all or nothing (#50945); an idle or small rank "
            "cannot opt out alone (#27771)."
        ),
        caught_by=("agreement", "no-hang", "padded-counts"),
        scenario="ubatch",
        profile="contract",
    ),
    FaultyTarget(
        name="ubatch-own-threshold",
        kind="issue",
        reference="v33",
        edits=(
            (
                "            parallel_config, reports.smallest, "
                "uniform_decode=shared_decode\n",
                "            parallel_config, num_tokens, uniform_decode=shared_decode\n",
            ),
        ),
        bug_class=UBATCH_BOUNDARY,
        upstream=("vllm#27771", "vllm#50945"),
        docstring=(
            "the microbatching threshold is checked against the rank's own token "
            "count rather than the smallest rank's, so near the threshold ranks "
            "above it split and ranks below it do not (the mixed decision of "
            "#27771). Their expert all-to-all counts differ: a hang."
        ),
        caught_by=("no-hang", "agreement"),
        scenario="ubatch",
    ),
)

WITNESSES: tuple[FaultyTarget, ...] = (
    FaultyTarget(
        name="witness-agreement",
        kind="witness",
        reference="v29",
        edits=(
            (
                "num_tokens_across_dp=counts, uniform_token_count=uniform, eager=True",
                "num_tokens_across_dp=counts,\n"
                "                uniform_token_count=uniform_token_count,\n"
                "                eager=True,",
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#35294",),
        docstring=(
            "when the ranks fall back to eager, the agreement records this rank's "
            "own uniform decode length instead of the shared one. Eager pads "
            "nothing, so no shape changes this step; but callers branch on the "
            "agreement (a reused eager agreement decides the drafter's uniform "
            "length), so ranks may take different branches later, as each rank "
            "kept its own speculator count on eager fallback in #35294."
        ),
        caught_by=("agreement",),
        scenario="step",
    ),
    FaultyTarget(
        name="witness-no-hang",
        kind="witness",
        reference="v29",
        edits=(
            (
                _V29_EAGER_DECISION,
                "    if wanted.cg_mode == CUDAGraphMode.NONE:\n"
                "        # Eager runs unpadded: gather the real counts for the forward.\n"
                "        counts = torch.zeros(dp_size, dtype=torch.int32)\n"
                "        counts[dp_rank] = num_tokens\n"
                "        dist.all_reduce(counts, group=get_dp_group().cpu_group)\n"
                + _V29_EAGER_DECISION,
            ),
        ),
        bug_class=EXTRA_COLLECTIVE,
        upstream=("vllm#56281", "ascend#9689"),
        docstring=(
            "a rank that itself wanted eager gathers the unpadded counts again "
            "with a second all-reduce, which the ranks that wanted a graph never "
            "issue. The values come out the same, so every agreement matches; but "
            "the ranks' collective sequences differ, and the next collective "
            "pairs a rank's extra all-reduce with another rank's forward pass: a "
            "hang, or a size mismatch, like the extra DP sync of #56281 and the "
            "two sync paths of vllm-ascend #9689."
        ),
        caught_by=("no-hang",),
        scenario="step",
    ),
    FaultyTarget(
        name="witness-coverage",
        kind="witness",
        reference="v29",
        edits=(("    return int(column.max())\n", "    return int(column.min())\n"),),
        bug_class=AGREED_FOR_PER_RANK,
        upstream=("vllm#26375", "vllm#55458"),
        docstring=(
            "the agreed query-length bound is the smallest rank's, not the "
            "largest. Every rank asks the same question and gets the same graph, "
            "so shapes, agreements and counts all match; but when one rank "
            "decodes and another has longer queries, all replay a varlen decode "
            "graph whose bound is below the longer rank's queries, which then "
            "runs attention metadata sized for a batch it does not have: the "
            "agreed-for-own confusion of #26375 and #55458."
        ),
        caught_by=("coverage",),
        scenario="step",
        policy=_VARLEN_DECODE,
    ),
    FaultyTarget(
        name="witness-eager-contagion",
        kind="witness",
        reference="v29",
        edits=(
            (
                "    if need_eager:\n        wanted = eager_descriptor(",
                "    if cudagraph_manager is None:\n        wanted = eager_descriptor(",
            ),
        ),
        bug_class=EAGER_AND_GRAPH,
        upstream=("vllm#30173", "vllm#34102"),
        docstring=(
            "a rank's need_eager is honoured only when it has no manager (the "
            "profile run), so a rank that must run eager for another reason votes "
            "for, and replays, the graph the others agreed on. Shapes agree, so "
            "nothing hangs; the rank runs a graph its batch cannot use, the "
            "eager/graph disagreement of #30173 and #34102."
        ),
        caught_by=("eager-contagion",),
        scenario="step",
    ),
    FaultyTarget(
        name="witness-idle",
        kind="witness",
        reference="v29",
        edits=(
            (
                _V29_IDLE_RETURN,
                _V29_IDLE_RETURN.replace(
                    "), None\n",
                    "), DPSyncState(\n"
                    "            num_tokens_across_dp=counts,\n"
                    "            uniform_token_count=None,\n"
                    "            eager=True,\n"
                    "        )\n",
                ),
            ),
        ),
        bug_class=DUMMY_NOT_SHAPED,
        upstream=("vllm#28774", "ascend#2454"),
        docstring=(
            "when no rank has work the sync still hands back an (eager, all-zero) "
            "agreement. Callers take an agreement to mean a forward pass, so an "
            "all-idle step runs dummy work, and anything reusing that agreement "
            "builds on a step that never ran (#28774, vllm-ascend #2454)."
        ),
        caught_by=("idle",),
        scenario="step",
        profile="contract",
    ),
    FaultyTarget(
        name="witness-padded-counts",
        kind="witness",
        reference="v29",
        edits=(
            (
                "    padded = torch.full_like(counts, agreed.num_tokens)\n",
                "    padded = counts\n",
            ),
        ),
        bug_class=DUMMY_NOT_SHAPED,
        upstream=("vllm#56281", "vllm#35376"),
        docstring=(
            "the agreement keeps each rank's unpadded count after the ranks "
            "agreed on a padded graph size. Every rank gets the same agreement "
            "and the same graph, but the forward context sizes the MoE all-to-all "
            "from counts that are not what each rank runs (#56281: missing "
            "agreed counts; #35376: dummy batches not shaped like real ones)."
        ),
        caught_by=("padded-counts",),
        scenario="step",
    ),
    FaultyTarget(
        name="witness-no-error",
        kind="witness",
        reference="v29",
        edits=(
            (
                _V29_IDLE_RETURN,
                '    assert bool(counts.any()), "DP sync with no work on any rank"\n',
            ),
        ),
        bug_class=COLLECTIVE_SKIPPED,
        upstream=("vllm#28774", "vllm#43547"),
        docstring=(
            "the sync asserts that some rank has work. A step where every rank "
            "has 0 tokens is legal (async scheduling produces them, and #28774 / "
            "#43547 made such ranks sync rather than skip), so the assertion "
            "kills every engine at once."
        ),
        caught_by=("no-error",),
        scenario="step",
        profile="contract",
    ),
    FaultyTarget(
        name="witness-ubatch-split",
        kind="witness",
        reference="v33",
        edits=(
            (
                "        if reports.smallest > (parts - 1) * (graph.num_tokens // parts):\n",
                "        if not 2 * reports.smallest < graph.num_tokens:\n",
            ),
        ),
        bug_class=UBATCH_BOUNDARY,
        upstream=("vllm#57020", "vllm#51700"),
        docstring=(
            "the microbatched-graph guard falls back to eager only when "
            "`2 * min < graph_tokens`, so at equality (counts [64, 128], a "
            "128-token graph) the smaller rank replays a FULL two-way graph whose "
            "second microbatch holds nothing but padding (#57020, open against "
            "#51700's guard)."
        ),
        caught_by=("ubatch-split",),
        scenario="ubatch",
        policy=_TWO_WAY_SPLIT,
    ),
    FaultyTarget(
        name="witness-ubatch-decision",
        kind="witness",
        reference="v33",
        edits=(
            (
                "            parallel_config, reports.smallest, uniform_decode=shared_decode\n",
                "            parallel_config, reports.smallest, uniform_decode=True\n",
            ),
        ),
        bug_class=UBATCH_BOUNDARY,
        upstream=("vllm#25622", "vllm#51700"),
        docstring=(
            "every step is held to the decode threshold, prefills included, so "
            "steps the prefill threshold should keep whole are split in two "
            "(#25622 fixed the same mix-up in the first DBO code). Every rank "
            "splits alike and the prefills run eager, so nothing hangs and no "
            "graph runs half empty: only the decision itself is wrong."
        ),
        caught_by=("ubatch-decision",),
        scenario="ubatch",
        policy=_THRESHOLDS_APART,
    ),
    FaultyTarget(
        name="witness-graph-choice",
        kind="witness",
        reference="v33",
        edits=(
            (
                "        num_active_loras,\n        reports.query_bound,\n    )\n"
                "    padded = torch.full_like",
                "        num_active_loras,\n        None,\n    )\n"
                "    padded = torch.full_like",
            ),
        ),
        bug_class=GRAPH_MISSED,
        upstream=("vllm#35376", "vllm#34167"),
        docstring=(
            "the agreed dispatch drops the query-length bound the ranks agreed, so "
            "varlen decode graphs, which need one, never match and every decode "
            "step falls back to a PIECEWISE graph on every rank alike: a CUDA "
            "graph miss that costs throughput with no error, as #35376's idle "
            "ranks degraded decode graphs to mixed ones and #34167's wrong bound "
            "kept the decode path from ever being taken."
        ),
        caught_by=("graph-choice",),
        scenario="step",
        policy=_VARLEN_DECODE,
    ),
    FaultyTarget(
        name="witness-solo",
        kind="witness",
        reference="v33",
        edits=(
            (
                "    if should_skip_dp_coordination():\n"
                "        # Coordination is off: behave as if every rank reported what this one did.\n"
                "        table[:] = table[:, dp_rank : dp_rank + 1].clone()\n"
                "    else:\n"
                "        get_dp_group().cpu_all_reduce_(table)\n",
                "    get_dp_group().cpu_all_reduce_(table)\n",
            ),
        ),
        bug_class=COLLECTIVE_SKIPPED,
        upstream=("vllm#24828", "vllm#43547"),
        docstring=(
            "the sync all-reduces even when told to skip DP coordination. Non-MoE "
            "DP ranks skip it on purpose (#24828), each on its own schedule, so a "
            "rank that still all-reduces waits for peers that are not syncing: "
            "the per-step collective some ranks skip, the hang of #43547. With "
            "every rank in the sync the answers are right, which is why only the "
            "collective shows it."
        ),
        caught_by=("solo",),
        scenario="step",
    ),
    FaultyTarget(
        name="witness-agreed-values",
        kind="witness",
        reference="v29",
        edits=(
            (
                "num_tokens_across_dp=padded, uniform_token_count=uniform, eager=False",
                "num_tokens_across_dp=padded,\n"
                "        uniform_token_count=uniform or int(table[UNIFORM_ROW].max()) or None,\n"
                "        eager=False,",
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#30173", "vllm#35294"),
        docstring=(
            "when the ranks' uniform decode lengths differ, the agreement records "
            'the largest any rank voted instead of None ("the ranks disagreed"). '
            "Every rank records the same wrong value and dispatch used the right "
            "one, so nothing diverges this step; but a drafter reusing the "
            "agreement then treats a mixed batch as a uniform decode (the eager "
            "and uniform-decode disagreements of #30173 and #35294)."
        ),
        caught_by=("agreed-values",),
        scenario="step",
    ),
    FaultyTarget(
        name="witness-reuse",
        kind="witness",
        reference="v29",
        edits=(
            (
                "    if dp_size > 1 and dp_sync is not None:\n",
                "    if dp_size > 1 and dp_sync is not None:\n"
                "        # Re-check the agreement with the other ranks before reusing it.\n"
                "        dist.all_reduce(\n"
                "            torch.ones(1, dtype=torch.int32), group=get_dp_group().cpu_group\n"
                "        )\n",
            ),
        ),
        bug_class=EXTRA_COLLECTIVE,
        upstream=("vllm#56281", "vllm#30119"),
        docstring=(
            "the drafter's reuse path all-reduces again before reusing the "
            "target's agreement. Every rank that drafts does it, so nothing hangs "
            "here; but the round trip reuse exists to save is back, and a rank "
            "that reaches the drafter without it (a dummy or skipped draft, as in "
            "#56281's extra sync) waits forever."
        ),
        caught_by=("reuse",),
        scenario="drafter",
    ),
)

CORPUS: tuple[FaultyTarget, ...] = ISSUES + WITNESSES + V1_ENTRIES
