"""The fast engine on dpsim's real strategies and real releases.

Its cheap data object must draw, for every scenario and profile of both
runners, exactly the case Hypothesis' engine replays from the same choices:
otherwise the case it finds failing is not the case Hypothesis shrinks. And
``dpsim check --engine fast`` must be as deterministic as the default engine
and catch a planted bug with a counterexample as small as the default's,
including where the failing rank is the last of many (its shrink pass that
lowers a count with what it counted).
"""

from __future__ import annotations

from pathlib import Path
from random import Random
from typing import cast

import pytest
from test_search_fast import replayed

import dpsim.corpus as corpus
from dpsim.check import CheckOptions, CheckReport, Finding, run_check
from dpsim.records.case import PROFILES
from dpsim.scenarios.generate import cases, scenarios_for, seeded_draws_only
from dpsim.search.draw import draw
from dpsim.targets import load_target

pytestmark = pytest.mark.release

TARGETS = [
    ("0.29.0", "v2"),
    ("0.33.0", "v2"),
    ("0.18.0", "v2"),
    ("0.33.0", "v1"),
    ("0.12.0", "v1"),
]
SEEDS = range(4)
DRAWS_PER_SEED = 10


@pytest.mark.parametrize(("vllm", "runner"), TARGETS)
def test_every_case_drawn_is_the_one_hypothesis_replays(vllm: str, runner: str) -> None:
    target = load_target(vllm, runner=runner)
    compared = 0
    with seeded_draws_only():
        for scenario in scenarios_for(target):
            for profile in PROFILES:
                strategy = cases(
                    target, scenario=scenario, profile=profile, ranks=(2, 16)
                )
                for seed in SEEDS:
                    random = Random(seed)
                    # Every other draw starts with the last one's policy, as
                    # the fast engine's draws often do.
                    policy: tuple[object, ...] = ()
                    for index in range(DRAWS_PER_SEED):
                        drawn = draw(strategy, random, policy if index % 2 else ())
                        if drawn is None:
                            continue
                        case, choices, fast_data = drawn
                        policy = choices[: fast_data.first_part or 0]
                        again = replayed(strategy, choices)
                        assert repr(again) == repr(case), (scenario, profile, seed)
                        compared += 1
    assert compared > len(scenarios_for(target)) * len(PROFILES) * len(SEEDS) * 6


def _corpus_check(name: str, directory: Path, engine: str) -> CheckReport:
    entry = next(entry for entry in corpus.CORPUS if entry.name == name)
    path = corpus.materialize(entry, directory)
    target = load_target(entry.vllm, path, runner=entry.runner)
    options = CheckOptions(
        scenarios=(entry.scenario,),
        profile=entry.profile,
        policy=entry.policy,
        engine=engine,
    )
    return run_check(target, options)


#: A planted bug per runner that both engines catch by the same property
#: first (which property a search meets first depends on its cases).
PLANTED = ("dispatch-own-count", "v1-unpadded-count-row")


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_bug_is_found_and_shrunk_the_same_every_time(
    name: str, tmp_path: Path
) -> None:
    first, second = (
        _corpus_check(name, tmp_path / str(index), "fast") for index in range(2)
    )
    default = _corpus_check(name, tmp_path / "default", "hypothesis")
    runs = [report.first_failure for report in (first, second, default)]
    findings = [run.finding for run in runs if run is not None]
    assert len(findings) == 3 and None not in findings
    ours, again, theirs = cast(list[Finding], findings)
    assert repr(ours.case) == repr(again.case)
    assert str(ours.primary) == str(again.primary)
    assert first.examples == second.examples
    assert ours.primary.property == theirs.primary.property
    # As small as the default engine's: no more ranks and no more steps.
    assert ours.case.dp_size <= theirs.case.dp_size
    assert len(ours.case.steps) <= len(theirs.case.steps)


#: Entries whose first failing case (seed 0) Hypothesis' shrinker alone left
#: at 6 ranks and 2 steps, and at 16 ranks and 2 steps: the failing rank was
#: the last one, so lowering the rank count alone lost the failure.
COUNTED = ("uniform-count-per-rank", "uniform-read-off-rank-0")


@pytest.mark.parametrize("name", COUNTED)
def test_a_count_is_lowered_with_what_it_counted(name: str, tmp_path: Path) -> None:
    run = _corpus_check(name, tmp_path, "fast").first_failure
    assert run is not None and run.finding is not None
    # The fewest the cases' strategy draws, as the default engine reaches.
    assert run.finding.case.dp_size == 2
    assert len(run.finding.case.steps) == 1
