"""dpsim check: finding, shrinking, determinism, the CLI's contract, real findings."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from dpsim import cex, check
from dpsim.capture.policy import CapturePolicy
from dpsim.check import CheckOptions, run_check
from dpsim.cli import main
from dpsim.scenarios import Case, RankBatch, run_case
from dpsim.scenarios.ranks import sync_records
from dpsim.targets import load_target

pytestmark = pytest.mark.release


def test_check_finds_and_shrinks_per_rank_padding(per_rank_padding: Path) -> None:
    target = load_target("0.20.0", per_rank_padding)
    report = run_check(target, CheckOptions(scenarios=("step",), examples=300))
    assert not report.passed
    finding = report.runs[0].finding
    assert finding is not None
    assert finding.primary.property in {"agreement", "no-hang", "padded-counts"}
    # Shrunk: the fewest ranks and steps that still show it.
    assert finding.case.dp_size == 2
    assert len(finding.case.steps) == 1


def test_the_correct_twin_passes(agreed_padding: Path) -> None:
    target = load_target("0.20.0", agreed_padding)
    report = run_check(target, CheckOptions(examples=150))
    assert report.passed, [
        str(run.finding.primary) for run in report.runs if run.finding
    ]


def test_a_baseline_excuses_only_the_failures_it_shares_word_for_word(
    per_rank_padding: Path, agreed_padding: Path
) -> None:
    faulty = load_target("0.20.0", per_rank_padding)
    correct = load_target("0.20.0", agreed_padding)
    options = CheckOptions(scenarios=("step",), examples=150, shrink=False)
    # Against itself, every failure is the baseline's own.
    alone = run_check(faulty, replace(options, baseline=faulty))
    assert alone.passed
    # Against a correct baseline, the bug is the target's.
    relative = run_check(faulty, replace(options, baseline=correct))
    assert not relative.passed


def test_same_seed_same_counterexample_byte_for_byte(
    per_rank_padding: Path, tmp_path: Path
) -> None:
    target = load_target("0.20.0", per_rank_padding)
    texts = []
    for attempt in range(2):
        report = run_check(
            target, CheckOptions(scenarios=("step",), examples=200, seed=7)
        )
        finding = report.runs[0].finding
        assert finding is not None
        built = cex.files.build(
            target, finding.case, finding.result, finding.verdicts, ("all",)
        )
        texts.append(cex.write(built, tmp_path / str(attempt)).read_text())
    assert texts[0] == texts[1]


def test_cli_exit_status_json_summary_and_counterexample_file(
    per_rank_padding: Path,
    agreed_padding: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    common = [
        "--vllm",
        "0.20.0",
        "--scenario",
        "step",
        "--examples",
        "200",
        "--out",
        str(out),
        "--json",
    ]
    assert main(["check", "--target", str(per_rank_padding), *common]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "fail" and summary["scenario"] == "step"
    assert {"property", "examples", "seconds", "counterexample"} <= set(summary)
    written = cex.read(Path(summary["counterexample"]))
    assert written.case.dp_size == 2
    assert main(["check", "--target", str(agreed_padding), *common]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "pass" and summary["counterexample"] is None


def test_cli_prints_the_per_rank_table(
    per_rank_padding: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "check",
        "--vllm",
        "0.20.0",
        "--target",
        str(per_rank_padding),
        "--scenario",
        "step",
    ]
    assert main([*args, "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "counterexample (shrunk)" in out
    assert "rank | passed in" in out and "where each rank stands" in out
    assert "replay:  dpsim replay" in out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--ranks", "0..3"], "need 1 <= LO <= HI"),
        (["--ranks", "two"], "expected N or LO..HI"),
        (["--examples", "0"], "--examples must be at least 1"),
        (["--vllm", "0.29.0", "--scenario", "ubatch"], "has no 'ubatch' scenario"),
        (["--policy", "/nonexistent/policy.toml"], "/nonexistent/policy.toml"),
        (["--scenario", "stepp"], "invalid choice"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", *arguments]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_real_finding_an_idle_rank_in_a_busy_eager_step_is_told_zero_tokens() -> None:
    """Documented in README: a 0-token rank amid busy ranks, in a step that runs
    eager, gets a 0-token descriptor although an agreement exists (someone has
    work). vLLM's model runner skips the forward on ``batch_desc.num_tokens ==
    0``, so that rank would skip the MoE collectives its peers enter: a hang.
    dpsim's forward model branches on the agreement, as DPSyncState asks."""
    target = load_target("0.33.0")
    policy = CapturePolicy(capture_sizes=(1,), cudagraph_mode="FULL", max_num_seqs=16)
    busy = RankBatch(num_reqs=1, num_tokens=1, uniform_token_count=1, max_query_len=1)
    idle = RankBatch(num_reqs=0, num_tokens=0, kind="idle")
    result = run_case(target, Case("step", "contract", policy, ((busy, idle),)))
    busy_sync, idle_sync = (sync_records(trace)[0] for trace in result.ranks)
    assert busy_sync["descriptor"]["num_tokens"] == 1
    assert idle_sync["descriptor"]["num_tokens"] == 0  # vLLM's skip signal...
    assert idle_sync["agreement"] is not None  # ...while the ranks agreed to run
    assert idle_sync["agreement"]["eager"] is True
    assert result.outcome.value == "ok"  # branching on the agreement, nobody hangs


def test_searches_in_a_row_survive_a_torch_error_in_a_pooled_rank(
    tmp_path: Path,
) -> None:
    """Regression: greenlets pooled across several searches crashed the process
    (SIGSEGV) when a torch C++ IndexError was raised in one. Run in a child
    process, so a crash fails this test instead of the test run."""
    script = tmp_path / "searches.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import re
            from pathlib import Path
            from dpsim.check import CheckOptions, run_check
            from dpsim.corpus import reference_path
            from dpsim.targets import load_target

            reference = reference_path("v29").read_text()
            rows = int(re.search(r"^ROWS = (\\d+)", reference, re.M).group(1))
            wide = Path({str(tmp_path / "wide.py")!r})
            narrow = Path({str(tmp_path / "narrow.py")!r})
            wide.write_text(reference.replace(f"ROWS = {{rows}}", f"ROWS = {{rows + 1}}"))
            narrow.write_text(reference.replace(f"ROWS = {{rows}}", f"ROWS = {{rows - 1}}"))
            for scenario in ("step", "drafter", "profile"):
                options = CheckOptions(scenarios=(scenario,), examples=100)
                assert run_check(load_target("0.29.0", wide), options).passed
            options = CheckOptions(scenarios=("step",), examples=100)
            finding = run_check(load_target("0.29.0", narrow), options).runs[0].finding
            print(finding.primary.property)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "no-error"


def test_a_seed_draws_the_same_cases_whatever_local_modules_are_loaded(
    agreed_padding: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hypothesis harvests constants from every local module imported; a user's
    # script, a test file or a mutant must not change what a seed draws.
    target = load_target("0.20.0", agreed_padding)
    options = CheckOptions(scenarios=("step",), examples=200, seed=3)
    seen: list[str] = []
    evaluate = check.evaluate

    def recording(target, case, *args):  # type: ignore[no-untyped-def]
        seen.append(json.dumps(case.to_dict(), sort_keys=True))
        return evaluate(target, case, *args)

    monkeypatch.setattr(check, "evaluate", recording)
    assert run_check(target, options).passed
    before, seen[:] = list(seen), []
    constants = ", ".join(str(value) for value in range(3, 4000, 7))
    (tmp_path / "dpsim_constants_probe.py").write_text(f"VALUES = ({constants},)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("dpsim_constants_probe")
    try:
        assert run_check(target, options).passed
    finally:
        sys.modules.pop("dpsim_constants_probe", None)
    assert seen == before
