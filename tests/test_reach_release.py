"""Branch reach on real releases: the bugs the contract profile now reaches within
the default budget, and the sync functions' branches a default check runs under
each profile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from seed import write_seed

from dpsim.check import DEFAULT_EXAMPLES, CheckOptions, run_check
from dpsim.mutate import Budget, generate, mutate
from dpsim.mutate import run as mutate_run
from dpsim.records.case import PROFILES
from dpsim.targets import load_target

pytestmark = pytest.mark.release

V2_SYNC = "v1/worker/gpu/dp_utils.py"
#: 0.33.0's agreement on the query-length bound every rank dispatches with.
AGREED_BOUND = "synced_max_query_len = int(max_query_lens_across_dp.max())"


def _planted_min_bound(release_file: Callable[[str, str], Path], tmp: Path) -> Path:
    """0.33.0's sync with the agreed bound taken with ``min``: a varlen decode
    graph then serves a rank whose requests are longer than the graph's bound."""
    text = release_file("0.33.0", V2_SYNC).read_text()
    assert text.count(AGREED_BOUND) == 1
    planted = tmp / "dp_utils.py"
    planted.write_text(
        text.replace(AGREED_BOUND, AGREED_BOUND.replace(".max()", ".min()"))
    )
    return planted


def test_the_min_bound_mutant_is_caught_by_a_default_contract_check(
    release_file: Callable[[str, str], Path], tmp_path: Path
) -> None:
    target = load_target("0.33.0", _planted_min_bound(release_file, tmp_path))
    report = run_check(
        target, CheckOptions(profile="contract", scenarios=("step",), shrink=False)
    )
    (run,) = report.runs
    assert run.finding is not None
    assert run.finding.verdicts[0].property == "coverage"
    assert "query length bound" in run.finding.verdicts[0].message
    # Found at the seeded default search's 101st case, a third into the
    # default budget (300); the check stops there.
    assert run.examples == 101


def test_the_min_bound_mutant_is_killed_by_mutate(
    release_file: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = release_file("0.33.0", V2_SYNC).read_text()
    line = text[: text.index(AGREED_BOUND)].count("\n") + 1
    (mutant,) = [
        mutant.id
        for mutant in generate(text)
        if mutant.id.startswith(f"min-max@{line}:")
    ]
    # The step leg alone, so the test stays short: a mutant's legs run step
    # first and its first failure ends it, and the original's other legs
    # only say whether those later legs judge relatively. So a kill in step
    # here is the kill a full run scores, and the baseline's other legs
    # (about 20 s of CPU) decide nothing. The contract profile alone too:
    # the caller profile's 0.33.0 drafters pass no bound, so it cannot tell
    # min from max.
    monkeypatch.setattr(mutate_run, "scenarios_for", lambda target: ("step",))
    report = mutate(
        "0.33.0", None, budget=Budget(profiles=("contract",)), workers=0, only=(mutant,)
    )
    assert [leg.scenario for leg in report.plan.legs] == ["step"]
    (result,) = report.results
    assert result.outcome.killed and result.outcome.killer == "coverage"
    assert result.outcome.scenario == "step"


#: The caller profile's cases per scenario here: a third of the default budget
#: (300). Its draws are narrower than the contract's; they reach every
#: branch within 50 on each target below, so this keeps the test's cost
#: small with margin.
CALLER_EXAMPLES = 100


@pytest.mark.parametrize(
    ("vllm", "runner", "seed", "clean"),
    [
        ("0.33.0", "v2", False, False),
        # The sync function's first version (tests/seed.py), derived from
        # 0.29.0's own file at test time.
        ("0.29.0", "v2", True, False),
        # V1's 0.33.0 fails nothing (tests/test_scenarios_v1.py's EXAMINED):
        # its contract check here is that test's, at the default budget.
        ("0.33.0", "v1", False, True),
    ],
    ids=["0.33.0", "seed-on-0.29.0", "0.33.0-v1"],
)
def test_a_default_check_reaches_every_branch_not_marked_unreachable_for_its_profile(
    vllm: str, runner: str, seed: bool, clean: bool, tmp_path: Path
) -> None:
    """Both profiles' default checks, measured together (one target load, one
    measurement) and judged apart: a mark bound to the caller profile (a
    branch vLLM's callers never reach) must not excuse the contract. A
    ``clean`` target's checks must also find nothing."""
    from dpsim.coverage.measuring import measure
    from dpsim.coverage.targets import scopes_for

    target = load_target(vllm, write_seed(tmp_path) if seed else None, runner)
    measurement = measure(scopes_for(target))
    for profile in PROFILES:
        # 0.33.0 fails finding 1: that scenario stops at its first failure.
        report = run_check(
            target,
            CheckOptions(
                profile=profile,
                shrink=False,
                coverage=measurement,
                examples=CALLER_EXAMPLES if profile == "caller" else DEFAULT_EXAMPLES,
            ),
        )
        if clean:
            failed = report.first_failure
            assert failed is None, (profile, failed.finding)
    result = measurement.result(target.version)
    assert result.profiles == PROFILES
    for profile in PROFILES:
        for file in result.profile(profile):
            data = file.to_json()
            where = (profile, file.display)
            assert not data["missing_branches"], (*where, data["missing_branches"])
            assert not data["missing_lines"], (*where, data["missing_lines"])
            # Every mark that applies here still holds.
            assert not data["stale_marks"], (*where, data["stale_marks"])
            assert not data["marked_but_reached"], (*where, data["marked_but_reached"])
