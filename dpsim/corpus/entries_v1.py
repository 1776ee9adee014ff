"""The V1 runner's corpus: bugs planted in ``reference_v1_v33.py``.

Each entry edits the from-scratch twin of V1's ``coordinate_batch_across_dp``
and runs under the release's own caller, ``_determine_batch_execution_and_padding``
(``dpsim check --target FILE --vllm 0.33.0 --runner v1``), so what the caller
does with a wrong answer (re-dispatch at the returned count, restricted to the
returned mode, and vLLM's own assertion on the result) is vLLM's, not a model.
"""

from __future__ import annotations

from dpsim.corpus.model import (
    COLLECTIVE_SKIPPED,
    EAGER_AND_GRAPH,
    EXTRA_COLLECTIVE,
    PER_RANK_FOR_AGREED,
    UBATCH_BOUNDARY,
    FaultyTarget,
)
from dpsim.records.policy import CapturePolicy, CudagraphMode, Microbatching

_RETURN = "    return split, votes.counts(pad=mode != 0 or split), mode\n"

#: Two-way microbatching every batch clears, FULL graphs only at 8 and 16, so
#: counts such as [4, 8] put the smaller rank's tokens all in the first half.
_V1_TWO_WAY_SPLIT = CapturePolicy(
    capture_sizes=(8, 16),
    cudagraph_mode=CudagraphMode.FULL,
    max_num_seqs=16,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=1, prefill_token_threshold=1
    ),
)

#: Both thresholds at 8 with a FULL graph at 8, so a rank of 7 tokens (no vote)
#: beside a rank of 8 (a vote) fills both halves of the 8-token split.
_V1_THRESHOLD_AT_A_GRAPH = CapturePolicy(
    capture_sizes=(4, 8, 16),
    cudagraph_mode=CudagraphMode.FULL,
    max_num_seqs=16,
    microbatching=Microbatching(
        num_ubatches=2, decode_token_threshold=8, prefill_token_threshold=8
    ),
)

V1_ENTRIES: tuple[FaultyTarget, ...] = (
    FaultyTarget(
        name="v1-mode-not-synced",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                _RETURN,
                "    return split, votes.counts(pad=mode != 0 or split), cudagraph_mode\n",
            ),
        ),
        bug_class=EAGER_AND_GRAPH,
        upstream=("vllm#30173", "vllm#30323"),
        docstring=(
            "the ranks exchange their graph modes but each returns its own. When "
            "one rank's batch runs eager (a mixed batch under FULL_DECODE_ONLY, "
            "a count past the largest graph) the others still replay graphs of "
            "their own sizes: eager and graph forwards issue different MoE "
            "collectives, the hang and `num_tokens == num_tokens_padded` "
            "assertion of #30173 / #30323, which added the mode row."
        ),
        caught_by=("eager-contagion", "no-hang", "agreement"),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-mode-max",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                '        return int(self.row("mode").min())\n',
                '        return int(self.row("mode").max())\n',
            ),
        ),
        bug_class=EAGER_AND_GRAPH,
        upstream=("vllm#30173", "vllm#34102"),
        docstring=(
            "the synced graph mode is the most any rank can run instead of the "
            "least. Every rank re-dispatches at the agreed count held to that "
            "mode, so a rank whose batch has no such graph (a mixed batch under "
            "FULL_DECODE_ONLY, a count past the largest FULL graph) asks the "
            "dispatcher for a graph it does not have, and vLLM's dispatcher "
            "asserts; a rank forced eager stays eager while the others replay "
            "graphs (the eager/graph split of #30173)."
        ),
        caught_by=("no-error", "graph-choice"),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-pad-by-own-mode",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                _RETURN,
                "    return split, votes.counts(pad=cudagraph_mode != 0 or split), mode\n",
            ),
        ),
        bug_class=EAGER_AND_GRAPH,
        upstream=("vllm#34102", "vllm#30173"),
        docstring=(
            "whether to pad is decided from the mode this rank wanted, not the "
            "mode the ranks agreed. When one rank runs eager, the ranks that "
            "wanted a graph hand back counts padded to the largest and the "
            "eager one its own: the ranks' agreed counts differ, so each sizes "
            "the MoE all-to-all from another table (#34102 moved the padding "
            "decision onto the agreed mode)."
        ),
        caught_by=("agreement", "padded-counts"),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-pad-own-rank-only",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                _RETURN,
                "    counts = votes.counts(pad=False)\n"
                "    if mode != 0 or split:\n"
                "        # Pad this rank up to the largest.\n"
                "        counts[parallel_config.data_parallel_rank] = int(counts.max())\n"
                "    return split, counts, mode\n",
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#18724", "ascend#1636"),
        docstring=(
            "under a graph only the calling rank's own entry is padded to the "
            "largest count; the others keep their own padded counts. Every rank "
            "runs the largest graph, so the forward itself matches, but each "
            "rank's table of counts differs from every other's and from what "
            "the ranks run: the MoE dispatch is sized per rank (ascend #1636), "
            "which DP padding (#18724) exists to prevent."
        ),
        caught_by=("agreement", "padded-counts"),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-graph-not-padded",
        kind="issue",
        reference="v1-v33",
        edits=((_RETURN, "    return split, votes.counts(pad=split), mode\n"),),
        bug_class=COLLECTIVE_SKIPPED,
        upstream=("vllm#18724",),
        docstring=(
            "the counts are padded to the largest only when microbatching, not "
            "when the ranks replay graphs. Each rank replays the graph of its "
            "own size, so the ranks' MoE dispatch and combine move different "
            "shapes: the unequal-count CUDA-graph deadlock #18724 introduced DP "
            "padding for."
        ),
        caught_by=("no-hang", "agreement"),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-unpadded-count-row",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                '        padded = self.row("padded").to("cpu")\n',
                '        padded = self.row("unpadded").to("cpu")\n',
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("vllm#30173", "vllm#35243"),
        docstring=(
            "the counts handed back are read from the unpadded row. Under a "
            "graph every rank re-dispatches at the largest real count, which "
            "the table pads further, so the caller's own check that the "
            "descriptor has the agreed count fails on every rank: the "
            "`num_tokens == num_tokens_padded` assertion of #30173 and #35243."
        ),
        caught_by=("no-error",),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-pad-to-smallest",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                "            return torch.full_like(padded, int(padded.max()))\n",
                "            return torch.full_like(padded, int(padded.min()))\n",
            ),
        ),
        bug_class=PER_RANK_FOR_AGREED,
        upstream=("ascend#1636", "vllm#25906"),
        docstring=(
            "the ranks agree on the smallest padded count, not the largest. "
            "Every rank replays the same graph, so nothing hangs; but a rank "
            "with more tokens than that graph holds runs a descriptor that "
            "cannot serve its batch (wrong padding from a per-rank reduction "
            "taken the wrong way, as in ascend #1636)."
        ),
        caught_by=("coverage",),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-ubatch-own-vote",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                '        if not bool((self.row("split") == 1).all()):\n',
                '        if not bool((self.row("split") == 1).any()):\n',
            ),
        ),
        bug_class=UBATCH_BOUNDARY,
        upstream=("vllm#50945", "vllm#27771"),
        docstring=(
            "the ranks microbatch when any rank wants to instead of only when all "
            "do. A rank below its threshold (or not allowed to split) is made to "
            "split anyway; microbatching is all or nothing (#50945), and which "
            "ranks may opt out is exactly what went wrong in #27771."
        ),
        caught_by=("ubatch-decision",),
        scenario="ubatch",
        policy=_V1_THRESHOLD_AT_A_GRAPH,
    ),
    FaultyTarget(
        name="v1-ubatch-guard-dropped",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                "        return not is_last_ubatch_empty(smallest, largest, parts)\n",
                "        return True\n",
            ),
        ),
        bug_class=UBATCH_BOUNDARY,
        upstream=("vllm#57020", "vllm#51700"),
        docstring=(
            "the empty-last-microbatch guard is gone: when the smallest rank's "
            "tokens all fit in the first microbatch of the largest padded batch "
            "(counts [4, 8] at a 16-token two-way split), the ranks split anyway "
            "and that rank's last microbatch holds nothing but padding (#57020)."
        ),
        caught_by=("ubatch-split", "ubatch-decision", "solo"),
        scenario="ubatch",
        policy=_V1_TWO_WAY_SPLIT,
    ),
    FaultyTarget(
        name="v1-eager-rank-reduces-on-cpu",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                "    if parallel_config.disable_nccl_for_dp_synchronization:\n",
                "    if parallel_config.disable_nccl_for_dp_synchronization or eager:\n",
            ),
            (
                "    parallel_config: ParallelConfig,\n) -> tuple[str",
                "    parallel_config: ParallelConfig,\n    eager: bool = False,\n) -> tuple[str",
            ),
            (
                "    device, group = _where_to_reduce(parallel_config)\n",
                "    # An eager rank has no graph to keep off the host: reduce on CPU.\n"
                "    device, group = _where_to_reduce(parallel_config, column[3] == 0)\n",
            ),
        ),
        bug_class=EXTRA_COLLECTIVE,
        upstream=("ascend#9689", "vllm#28224"),
        docstring=(
            "a rank whose own dispatch chose eager all-reduces on the DP group's "
            "CPU (gloo) group, the others on its device (NCCL) group. The two "
            "halves of the group wait in different communicators for each "
            "other: the two-sync-paths hang of vllm-ascend #9689, seen in V1's "
            "all-reduce as #28224."
        ),
        caught_by=("no-hang",),
        scenario="step",
    ),
    FaultyTarget(
        name="v1-eager-rank-skips-sync",
        kind="issue",
        reference="v1-v33",
        edits=(
            (
                "    if parallel_config.data_parallel_size == 1:\n",
                "    if parallel_config.data_parallel_size == 1 or cudagraph_mode == 0:\n"
                "        # Eager here: no graph shape to agree on, nothing to pad.\n",
            ),
        ),
        bug_class=COLLECTIVE_SKIPPED,
        upstream=("vllm#28774", "vllm#43547", "vllm#48720"),
        docstring=(
            "a rank whose own dispatch chose eager returns before the exchange, "
            "reasoning that an eager step has no graph shape to agree on. It is "
            "a rank-local early return before the DP all-reduce, like "
            "execute_model's for 0-token steps (#28774, #43547; #48720 lists "
            "such rank-local decisions): the ranks that wanted a graph wait in "
            "the exchange for a rank that never comes."
        ),
        caught_by=("no-hang",),
        scenario="step",
    ),
)
