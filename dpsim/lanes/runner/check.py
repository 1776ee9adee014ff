"""``dpsim check --lane runner``'s engine: draw runner cases, run, judge, shrink.

Hypothesis draws whole runner cases (:func:`runner_cases`: engine options and
per-rank request streams from :mod:`dpsim.lanes.runner.generate`, a capture
policy the engine's options fit, a seed), each runs through the release's real
callers (:func:`~dpsim.lanes.runner.run.run_runner_case`) and the runner
lane's properties judge its trace. As in the sync lane's check
(:mod:`dpsim.check`), the first failure fixes the property chased, shrinking
keeps only cases failing that same property, generation is seeded and no
example database is read, so a target, options and seed give the same
counterexample byte for byte. A case the lane cannot drive (a gap, a part
refusing the release) ends the check with that one-line refusal: no verdict
is not a pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from random import Random
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, find, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample, Unsatisfiable

from dpsim.boundary import searching, stops_the_search
from dpsim.capture.strategies import MODES_SIMPLEST_FIRST
from dpsim.properties import Property, Verdict, judge, select_for_runner_lane
from dpsim.records.policy import (
    CapturePolicy,
    PolicyError,
    vllm_default_max_capture_size,
    vllm_default_sizes,
)
from dpsim.scenarios.generate import seeded_draws_only
from dpsim.search.bounded import bounded_shrinking
from dpsim.targets.load import Target

from .case import RunnerCase
from .generate import engine_options, workloads
from .run import RunnerResult, preflight, run_runner_case
from .stream import EngineOptions

if TYPE_CHECKING:
    from dpsim.coverage import Measurement

#: Cases per check by default: a few seconds at the lane's cost per case.
DEFAULT_RUNNER_EXAMPLES = 100
#: DP sizes drawn by default (the lane runs whole engines: small is plenty).
DEFAULT_RUNNER_RANKS = (2, 4)

#: Called as ``progress(examples_run, examples_planned)``.
Progress = Callable[[int, int], None]
#: The scenario name target coverage counts the lane's cases under.
COVERAGE_CONTEXT = "runner-lane"


@dataclass(frozen=True)
class RunnerCheckOptions:
    properties: tuple[str, ...] = ()
    ranks: tuple[int, int] = DEFAULT_RUNNER_RANKS
    examples: int = DEFAULT_RUNNER_EXAMPLES
    seed: int = 0
    #: Only these speculators (None: no speculator); all when empty.
    speculators: tuple[str | None, ...] = ()
    shrink: bool = True
    #: A fixed capture policy (its mode, sizes and drafter table); each case
    #: takes its max_num_seqs and decode length from the engine options drawn.
    policy: CapturePolicy | None = None
    #: The model runner the cases drive (``v2`` or ``v1``); the target must
    #: be loaded for the same one.
    runner: str = "v2"
    #: Target coverage (``--coverage``): each case's run is traced.
    coverage: Measurement | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RunnerFinding:
    """A shrunk runner case and what it showed."""

    case: RunnerCase
    run: RunnerResult
    verdicts: tuple[Verdict, ...]

    @property
    def primary(self) -> Verdict:
        return self.verdicts[0]


@dataclass(frozen=True)
class RunnerCheckReport:
    target: Target
    options: RunnerCheckOptions
    properties: tuple[Property, ...]
    #: Every case run, shrink attempts included (``shrinking`` of them).
    examples: int
    shrinking: int
    seconds: float
    finding: RunnerFinding | None

    @property
    def passed(self) -> bool:
        return self.finding is None


def runner_cases(
    *,
    ranks: tuple[int, int] = DEFAULT_RUNNER_RANKS,
    speculators: tuple[str | None, ...] = (),
    policy: CapturePolicy | None = None,
    runner: str = "v2",
) -> st.SearchStrategy[RunnerCase]:
    """Runner cases of ``runner``'s model runner: options and streams
    (:mod:`.generate`), a policy those options fit (``policy`` fitted to them,
    when given), and a seed; every part shrinks towards less."""
    options = (
        engine_options(speculators=speculators, runner=runner) if speculators else None
    )
    return _runner_cases(
        workloads(
            min_ranks=ranks[0], max_ranks=ranks[1], options=options, runner=runner
        ),
        policy,
        runner,
    )


@st.composite
def _runner_cases(
    draw: Any,
    workload: st.SearchStrategy[Any],
    fixed: CapturePolicy | None,
    runner: str,
) -> RunnerCase:
    options, streams = draw(workload)
    if fixed is None:
        policy = draw(policies_for(options))
    else:
        try:
            policy = fitted(fixed, options)
        except PolicyError:
            reject()  # the fixed table cannot serve these options: draw others
    return RunnerCase(
        policy, options, streams, seed=draw(st.integers(0, 3)), runner=runner
    )


def fitted(policy: CapturePolicy, options: EngineOptions) -> CapturePolicy:
    """``policy`` for an engine with ``options``: the engine's max_num_seqs
    and decode length (1 + k), and only capture sizes within its token budget
    (vLLM's config filters them by max_num_batched_tokens), as vLLM derives
    its tables from them."""
    budget = options.max_num_batched_tokens
    ceiling = policy.max_capture_size
    return replace(
        policy,
        capture_sizes=tuple(size for size in policy.capture_sizes if size <= budget)
        or (1,),
        max_capture_size=None if ceiling is None else min(ceiling, budget),
        max_num_seqs=options.max_num_seqs,
        decode_query_len=options.decode_query_len,
    )


def policies_for(options: EngineOptions) -> st.SearchStrategy[CapturePolicy]:
    """Capture policies of a deployment with ``options``: a graph mode, vLLM's
    default grid (its ceiling from max_num_seqs and the decode length) or
    powers of two, sizes within the token budget, the decode length 1 + k.
    No LoRA, no microbatching, no separate drafter table: the lane refuses
    the first two, and the speculators build theirs from this one."""
    return _policies_for(options)


@st.composite
def _policies_for(draw: Any, options: EngineOptions) -> CapturePolicy:
    mode = draw(st.sampled_from(MODES_SIMPLEST_FIRST))
    decode = options.decode_query_len
    budget = options.max_num_batched_tokens
    if draw(st.booleans()):
        ceiling = vllm_default_max_capture_size(options.max_num_seqs, decode)
        sizes = vllm_default_sizes(min(ceiling, budget))
    else:
        sizes = tuple(1 << k for k in range(budget.bit_length()) if 1 << k <= budget)
    return CapturePolicy(
        capture_sizes=sizes or (1,),
        cudagraph_mode=mode,
        max_num_seqs=options.max_num_seqs,
        decode_query_len=decode,
    )


def evaluate(
    target: Target,
    case: RunnerCase,
    properties: tuple[Property, ...],
    traced: AbstractContextManager[None] | None = None,
) -> tuple[RunnerResult, list[Verdict]]:
    """Run one runner case and judge it (TargetError when the lane cannot);
    ``traced`` (target coverage) is entered around the run only."""
    with traced if traced is not None else nullcontext():
        run = run_runner_case(target, case)
    return run, judge(case, run.result, properties)


def run_runner_check(
    target: Target, options: RunnerCheckOptions, progress: Progress | None = None
) -> RunnerCheckReport:
    properties = select_for_runner_lane(options.properties)
    # A release whose code does not fit is refused now, in one line.
    preflight(target)
    strategy = runner_cases(
        ranks=options.ranks,
        speculators=options.speculators,
        policy=options.policy,
        runner=options.runner,
    )
    chased: list[str] = []
    examples = 0
    generated = 0
    started = time.perf_counter()

    def fails(case: RunnerCase) -> bool:
        nonlocal examples, generated
        examples += 1
        if progress is not None:
            progress(examples, options.examples)
        _, verdicts = evaluate(
            target,
            case,
            properties,
            None
            if options.coverage is None
            else options.coverage.running(COVERAGE_CONTEXT, "caller"),
        )
        if not verdicts:
            return False
        if not chased:
            generated = examples
            chased.append(verdicts[0].property)
        return any(verdict.property == chased[0] for verdict in verdicts)

    config = settings(
        max_examples=options.examples,
        database=None,
        deadline=None,
        phases=(Phase.generate,) + ((Phase.shrink,) if options.shrink else ()),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    finding = None
    try:
        # A case the lane cannot drive stops the search at once (dpsim.boundary).
        with seeded_draws_only(), bounded_shrinking(), searching():
            minimal = find(
                strategy,
                stops_the_search(fails),
                settings=config,
                random=Random(options.seed),
            )
    except (NoSuchExample, Unsatisfiable):
        pass
    else:
        run, verdicts = evaluate(target, minimal, properties)
        ordered = sorted(verdicts, key=lambda verdict: verdict.property != chased[0])
        finding = RunnerFinding(minimal, run, tuple(ordered))
    return RunnerCheckReport(
        target,
        options,
        properties,
        examples,
        examples - generated if chased else 0,
        time.perf_counter() - started,
        finding,
    )
