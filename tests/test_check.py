"""dpsim check: finding, shrinking, determinism, the CLI's contract, real findings."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from faults import VOTING

from dpsim import cex, check
from dpsim.check import CheckOptions, run_check
from dpsim.cli import main
from dpsim.records.case import Case, RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import sync_records
from dpsim.scenarios import run_case
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
    """Finding 4 (docs/findings.md): a 0-token rank amid busy ranks, in a step that runs
    eager, gets a 0-token descriptor although an agreement exists (someone has
    work). vLLM's model runner skips the forward on ``batch_desc.num_tokens ==
    0``, so that rank would skip the MoE collectives its peers enter: a hang.
    dpsim's forward model branches on the agreement, as DPSyncState asks."""
    target = load_target("0.33.0")
    policy = CapturePolicy(capture_sizes=(1,), cudagraph_mode="FULL", max_num_seqs=16)
    busy = RankBatch(num_reqs=1, num_tokens=1, uniform_token_count=1, max_query_len=1)
    idle = RankBatch(num_reqs=0, num_tokens=0, kind="idle")
    result = run_case(target, Case("step", "contract", policy, ((busy, idle),)))
    busy_sync, idle_sync = (sync_records(trace.events)[0] for trace in result.ranks)
    assert busy_sync.descriptor is not None and busy_sync.descriptor.num_tokens == 1
    assert idle_sync.descriptor is not None
    assert idle_sync.descriptor.num_tokens == 0  # vLLM's skip signal...
    assert idle_sync.agreement is not None  # ...while the ranks agreed to run
    assert idle_sync.agreement.eager is True
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


def test_every_failing_scenario_gets_its_file_test_and_json_entry(
    per_rank_padding: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    arguments = ["--vllm", "0.20.0", "--target", str(per_rank_padding)]
    arguments += ["--scenario", "step", "--scenario", "drafter", "--ranks", "2..4"]
    arguments += ["--examples", "100", "--out", str(out)]
    assert main(["check", *arguments, "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    step, drafter = summary["scenarios"]["step"], summary["scenarios"]["drafter"]
    # The top-level keys still name the first failure, as before.
    assert summary["counterexample"] == step["counterexample"]
    assert summary["failures"] == 2
    for entry in (step, drafter):
        assert entry["verdict"] == "fail" and entry["message"]
        path = Path(entry["counterexample"])
        assert cex.read(path).case.scenario in {"step", "drafter"}
        assert cex.regression.regression_test_path(path).is_file()
        # Shrink attempts are counted apart from the cases generated.
        assert entry["examples"] == entry["generated"] + entry["shrinking"]
        assert entry["shrinking"] > 0
    assert step["counterexample"] != drafter["counterexample"]
    assert len(list(out.glob("*.json"))) == 2
    assert main(["check", *arguments]) == 1
    text = capsys.readouterr().out
    assert text.count("counterexample (shrunk)") == 2
    for entry in (step, drafter):
        assert f"replay:  dpsim replay {entry['counterexample']}" in text
    assert "of them while shrinking" in text


#: Added to a faulty target's sync: in the profile scenario (no manager), the
#: 20th call writes MARKER, waits for Ctrl-C and swallows it, as careless code
#: does; with SECOND, it then writes SECOND and waits again.
_INTERRUPTIBLE = """
import time
from pathlib import Path
_profile_calls = [0]


def _await_ctrl_c():
    _profile_calls[0] += 1
    if _profile_calls[0] != 20:
        return
    try:
        Path(MARKER).write_text("waiting")
        time.sleep(600)
    except BaseException:
        if SECOND:
            Path(SECOND).write_text("swallowed one")
            time.sleep(600)
"""


def _interruptible(source: str, directory: Path, twice: bool) -> tuple[Path, Path]:
    marker, second = directory / "marker", directory / "second"
    text = source + _INTERRUPTIBLE.replace("MARKER", repr(str(marker))).replace(
        "SECOND", repr(str(second)) if twice else "None"
    )
    hook = "    if dp_size == 1:\n"
    assert hook in text
    text = text.replace(
        hook, "    if cudagraph_manager is None:\n        _await_ctrl_c()\n" + hook
    )
    path = directory / "interruptible.py"
    path.write_text(text)
    return path, second if twice else marker


def _start_check(
    target: Path, out: Path, scenarios: tuple[str, ...]
) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", "from dpsim.cli import run; run()", "check"]
    command += ["--vllm", "0.20.0", "--target", str(target), "--ranks", "2..3"]
    for scenario in scenarios:
        command += ["--scenario", scenario]
    command += ["--examples", "5000", "--out", str(out), "--json"]
    # A session of its own: Ctrl-C goes to the process group, as from a terminal.
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    while not path.exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)  # polling a file the target writes; no race on timing


def test_ctrl_c_prints_the_summary_so_far_writes_what_was_found_and_exits_130(
    tmp_path: Path,
) -> None:
    source = VOTING.replace("PAD_FROM", "num_tokens")
    target, marker = _interruptible(source, tmp_path, twice=False)
    # step fails (and is shrunk) first; profile then runs until interrupted.
    scenarios = ("step", "profile", "drafter")
    process = _start_check(target, tmp_path / "out", scenarios)
    _wait_for(marker, process)
    # The target swallows this Ctrl-C; the run stops before its next case anyway.
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] is True and summary["verdict"] == "fail"
    step = summary["scenarios"]["step"]
    assert step["verdict"] == "fail" and step["shrunk"] is True
    assert cex.read(Path(step["counterexample"])).case.scenario == "step"
    profile = summary["scenarios"]["profile"]
    assert profile["verdict"] == "interrupted" and profile["interrupted"] is True
    assert 0 < profile["examples"] < 5000
    assert summary["scenarios"]["drafter"]["verdict"] == "not-run"


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    source = VOTING.replace("PAD_FROM", "int(counts.max())")
    target, second = _interruptible(source, tmp_path, twice=True)
    process = _start_check(target, tmp_path / "out", ("profile",))
    _wait_for(tmp_path / "marker", process)
    os.killpg(process.pid, signal.SIGINT)
    # The target swallowed the first and waits on; the second ends the run.
    _wait_for(second, process)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr


# What the test provokes is the warning: Python dropping a KeyboardInterrupt.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_swallowed_ctrl_c_still_stops_the_search_before_the_next_case(
    agreed_padding: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python drops a KeyboardInterrupt raised in a gc callback, a __del__ or a
    greenlet torn down by the collector ("Exception ignored in ..."): the
    search's handler counts the signal, so the next case does not start."""
    target = load_target("0.20.0", agreed_padding)
    calls, handlers = [], []
    evaluate = check.evaluate

    def in_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc.callbacks.remove(in_gc)
            signal.raise_signal(signal.SIGINT)

    def swallowing(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 5:
            gc.callbacks.append(in_gc)
            gc.collect()  # the Ctrl-C lands in the callback, and Python drops it
            # A second Ctrl-C would now end the process at once.
            handlers.append(signal.getsignal(signal.SIGINT))
        return evaluate(*args)

    monkeypatch.setattr(check, "evaluate", swallowing)
    options = CheckOptions(scenarios=("step", "profile"), examples=200)
    with pytest.raises(check.CheckInterrupted) as stopped:
        run_check(target, options)
    report = stopped.value.report
    assert len(calls) == 5 and handlers == [signal.SIG_DFL]
    assert report.interrupted and not report.passed
    assert [run.scenario for run in report.runs] == ["step"]
    assert report.runs[0].interrupted and report.runs[0].examples == 5
    assert report.not_run == ("profile",)
    # The search's handler is gone again; Python's own is back.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_output_is_line_buffered_when_piped() -> None:
    # `dpsim check | tee log` shows each line as it comes, not when a block fills.
    probe = (
        "import sys, dpsim.cli as cli\n"
        "cli.main = lambda argv=None: print(sys.stdout.line_buffering, "
        "sys.stderr.line_buffering) or 0\n"
        "cli.run()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr


def test_ctrl_c_while_the_commands_load_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dpsim.cli

    def interrupted(command: str | None = None) -> None:
        raise KeyboardInterrupt  # as if Ctrl-C came while torch imports

    monkeypatch.setattr(dpsim.cli, "build_parser", interrupted)
    assert main(["check"]) == 130
    assert capsys.readouterr().err == "dpsim: interrupted\n"
