"""``dpsim diff`` on real releases: a release against itself, a planted change
against its original (both derived at test time from a cached release's
dp_utils.py), declared expectations, determinism, and the case file replayed
on either side."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.diff import DiffOptions, run_diff
from dpsim.targets import load_target

pytestmark = pytest.mark.release

RELEASE = "0.33.0"
DP_UTILS = "v1/worker/gpu/dp_utils.py"
#: The agreement's request bound, one more than the ranks agreed, in the
#: final (graph) return only: safe for the forward, visible in the agreement.
PLANTED = (
    "        eager=False,\n"
    "        num_reqs=int(num_reqs_across_dp.max()),\n"
    "        skip_drafts=skip_drafts,\n",
    "        eager=False,\n"
    "        num_reqs=int(num_reqs_across_dp.max()) + 1,\n"
    "        skip_drafts=skip_drafts,\n",
)
SMALL = ["--scenario", "step", "--examples", "60"]


@pytest.fixture
def original_and_planted(
    tmp_path: Path, release_file: Callable[[str, str], Path]
) -> tuple[Path, Path]:
    text = release_file(RELEASE, DP_UTILS).read_text()
    before, after = PLANTED
    assert text.count(before) == 1, f"{RELEASE}'s dp_utils.py changed"
    original = tmp_path / "original" / "dp_utils.py"
    planted = tmp_path / "planted" / "dp_utils.py"
    for path, content in ((original, text), (planted, text.replace(before, after))):
        path.parent.mkdir()
        path.write_text(content)
    return original, planted


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_release_against_itself_differs_in_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runner: str
) -> None:
    arguments = ["diff", RELEASE, RELEASE, "--runner", runner, *SMALL, "--json"]
    assert main([*arguments, "--out", str(tmp_path)]) == 0
    summary = _json(capsys)
    assert summary["verdict"] == "same"
    assert summary["cases"] == 60
    assert summary["kinds"] == {}
    assert not list(tmp_path.iterdir())


def test_a_planted_change_is_reported_as_that_change(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    original_and_planted: tuple[Path, Path],
) -> None:
    original, planted = original_and_planted
    out = tmp_path / "out"
    arguments = ["diff", str(original), str(planted), "--vllm", RELEASE, *SMALL]
    assert main([*arguments, "--out", str(out), "--json"]) == 1
    summary = _json(capsys)
    kinds = summary["kinds"]
    assert isinstance(kinds, dict)
    # The bound itself, and the property that judges it (agreed-values): the
    # forward runs the descriptor, which the change leaves alone.
    assert sorted(kinds) == ["agreement.num_reqs", "verdict"]
    changed = kinds["agreement.num_reqs"]
    assert changed["base"]["verdicts"] == []
    assert [verdict["property"] for verdict in changed["new"]["verdicts"]] == [
        "agreed-values"
    ]
    # The same draws, the same report, byte for byte.
    assert main([*arguments, "--out", str(out), "--json"]) == 1
    assert _json(capsys) == summary

    # Declared, the difference is counted apart and is no failure.
    expect = ["--expect", "agreement.num_reqs", "--expect", "verdict"]
    assert main([*arguments, *expect, "--out", str(tmp_path / "x")]) == 0
    text = capsys.readouterr().out
    assert "agreement.num_reqs" in text and "(expected)" in text
    assert "result: EXPECTED: 0 of 60 cases differed in 0 kind(s)" in text


def test_the_case_file_replays_on_either_side(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    original_and_planted: tuple[Path, Path],
) -> None:
    original, planted = original_and_planted
    out = tmp_path / "out"
    arguments = ["diff", str(original), str(planted), "--vllm", RELEASE, *SMALL]
    assert main([*arguments, "--out", str(out), "--json"]) == 1
    summary = _json(capsys)
    file = Path(summary["kinds"]["agreement.num_reqs"]["file"])  # type: ignore[index]
    assert file.name.startswith("diff-agreement.num_reqs-")
    recorded = json.loads(file.read_text())["target"]["diff"]
    assert recorded["base"]["spec"]["dp_utils_file"] == str(original.resolve())
    assert recorded["new"]["spec"]["dp_utils_file"] == str(planted.resolve())
    # The base side holds every property on it; the new side breaks one.
    assert main(["replay", str(file)]) == 0
    assert main(["replay", str(file), "--vllm", RELEASE, "--target", str(planted)]) == 1
    assert "agreed-values" in capsys.readouterr().out


def test_v1_against_v2_compares_only_what_both_report() -> None:
    v1 = load_target(RELEASE, runner="v1")
    v2 = load_target(RELEASE, runner="v2")
    report = run_diff(v1, v2, DiffOptions(scenarios=("step",), examples=20))
    assert report.ran == 20
    kinds = {group.kind for group in report.groups}
    # Neither runner's agreement has the other's own fields to compare.
    assert not kinds & {
        "agreement.eager",
        "agreement.cg_mode",
        "agreement.ubatch",
        "agreement.skip_drafts",
    }
    # V1 reduces on the DP device group, V2 on the CPU group: every case with
    # a sync says so.
    assert {"collectives.dp_cpu", "collectives.dp_device"} <= kinds


def test_cases_from_the_new_side_count_what_the_base_cannot_run_apart() -> None:
    old, new = load_target("0.29.0"), load_target(RELEASE)
    options = DiffOptions(scenarios=("step",), examples=20, cases_from="new")
    report = run_diff(old, new, options)
    (tally,) = report.tallies
    assert tally.ran == 20
    reasons = dict(tally.apart)
    # 0.30 added microbatching votes to V2's sync: 0.29 cannot take them.
    assert any(
        reason.startswith(
            "the base side cannot run it: the case passes allow_ubatching"
        )
        for reason in reasons
    )
    # The rows 0.30-0.33 added to the sync's tensor show on every case (an
    # agreement only where some rank has work).
    kinds = {group.kind: group.count for group in report.groups}
    assert kinds["collectives.dp_cpu"] == 20
    assert "agreement.num_reqs" in kinds


def test_a_reviewers_two_trees(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    release_file: Callable[[str, str], Path],
) -> None:
    package = release_file(RELEASE, DP_UTILS).parents[3]
    trees = {}
    for name in ("vllm-main", "vllm-pr"):
        trees[name] = tmp_path / name
        shutil.copytree(package, trees[name] / "vllm")
    changed = trees["vllm-pr"] / "vllm" / DP_UTILS
    before, after = PLANTED
    changed.write_text(changed.read_text().replace(before, after))
    arguments = ["diff", str(trees["vllm-main"]), str(trees["vllm-pr"]), *SMALL]
    assert main([*arguments, "--out", str(tmp_path / "out")]) == 1
    text = capsys.readouterr().out
    assert f"base vllm {RELEASE} [{trees['vllm-main'] / 'vllm'}]" in text
    assert f"new  vllm {RELEASE} [{trees['vllm-pr'] / 'vllm'}]" in text
    assert "== agreement.num_reqs:" in text


def test_a_sync_only_the_new_side_makes_is_shown_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["diff", "0.29.0", RELEASE, "--scenario", "step", "--examples", "10"]
    assert main([*arguments, "--out", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    # 0.30 let callers skip DP coordination: dpsim's step then syncs a shared
    # batch a second time, alone, which 0.29 cannot.
    assert "== syncs:" in text
    assert "(no such sync)" in text
    assert "(never got here)" not in text
