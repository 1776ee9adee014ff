"""dpsim.isolation and dpsim.allowances: a target that ends, crashes, outgrows
or spins in the process never turns into a pass or a hung terminal, and
stdout carries only dpsim's report.

The faulty targets are VOTING (tests/faults.py, dpsim's own code) with one
line injected; the allowances are kept small so each test stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from faults import BASE, VOTING
from plain_user import as_plain_user

from dpsim import allowances
from dpsim.allowances import Allowance, parse_size
from dpsim.cli import EXIT_BROKEN_PIPE, main
from dpsim.errors import UsageError
from dpsim.isolation import EXIT_NO_VERDICT, died, run_in_child, run_isolated
from dpsim.options import parse_ranks

CORRECT = VOTING.replace("PAD_FROM", "int(counts.max())")
GENEROUS = Allowance(memory=None, cpu_seconds=60)
#: Enough for the child to finish loading and drawing; a target's loop of
#: 64 MiB blocks runs out a few blocks later.
HEADROOM = 512 * 2**20


def injected(line: str) -> str:
    """CORRECT with ``line`` run first in every call of its sync."""
    return "import os, sys\n" + CORRECT.replace(
        "    if dp_size == 1:", f"    {line}\n    if dp_size == 1:", 1
    )


@pytest.fixture
def check(tmp_path: Path) -> Callable[..., int]:
    """``dpsim check`` on a target written from ``source``: its exit status."""

    def run(source: str, *extra: str) -> int:
        target = tmp_path / "dp_utils.py"
        target.write_text(source)
        return main(
            [
                "check",
                "--vllm",
                BASE,
                "--target",
                str(target),
                "--scenario",
                "step",
                "--ranks",
                "2",
                "--examples",
                "5",
                "--out",
                str(tmp_path / "out"),
                *extra,
            ]
        )

    return run


def data_limit(headroom: int) -> str:
    used = allowances.data_in_use()
    assert used is not None
    return f"{(used + headroom) // 2**20}M"


# -- a target that ends the process ---------------------------------------------


#: What every command says of a target that calls os._exit(0).
ENDED = (
    "the target ended the process (os._exit/exit status 0) "
    "before dpsim reached a verdict"
)


@pytest.mark.release
def test_mutate_on_a_target_that_ends_the_process_is_an_error_never_a_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The original target is loaded and checked in the command's own process.
    target = tmp_path / "dp_utils.py"
    target.write_text(injected("os._exit(0)"))
    arguments = ["mutate", "--vllm", BASE, "--target", str(target), "--examples", "5"]
    assert main([*arguments, "--workers", "0", "--json"]) == EXIT_NO_VERDICT
    out, err = capsys.readouterr()
    assert json.loads(out) == {"verdict": "error", "message": ENDED}
    assert err.strip().splitlines() == [f"dpsim: error: {ENDED}"]


@pytest.mark.release
@pytest.mark.parametrize(
    "command",
    [
        ["targets", "--vllm", BASE, "--quiet"],
        [
            "policy",
            "validate",
            "docs/policies/pow2.toml",
            "--vllm",
            BASE,
            "--steps",
            "3",
        ],
    ],
    ids=["targets", "policy validate"],
)
def test_other_commands_that_run_a_target_that_ends_the_process_say_so(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "dp_utils.py"
    # At import for targets (loading is all it runs), in the sync for validate.
    line = "os._exit(0)"
    # Named like V2's sync so that it is taken for one and executed.
    sync = "def dispatch_cg_and_sync_dp(): ...\n"
    source = f"import os\n{line}\n{sync}" if command[0] == "targets" else injected(line)
    target.write_text(source)
    policy = Path(__file__).parent.parent / "docs" / "policies" / "pow2.toml"
    command = [str(policy) if part.endswith("pow2.toml") else part for part in command]
    if command[0] == "policy":
        command += ["--out", str(tmp_path / "out")]
    assert main([*command, "--target", str(target)]) == EXIT_NO_VERDICT
    assert capsys.readouterr().err.strip().splitlines() == [f"dpsim: error: {ENDED}"]


@pytest.mark.release
def test_the_pytest_suite_fails_on_a_target_that_ends_the_process(
    tmp_path: Path,
) -> None:
    target = tmp_path / "dp_utils.py"
    target.write_text(injected("os._exit(0)"))
    environment = {**os.environ, "DPSIM_VLLM": BASE, "DPSIM_TARGET": str(target)}
    environment.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "step"),
            *("--pyargs", "dpsim.suite", "--dpsim-out", str(tmp_path / "out")),
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert ENDED in done.stdout
    assert "1 failed" in done.stdout


@pytest.mark.release
def test_sys_exit_in_the_sync_is_a_rank_error_and_a_failure(
    check: Callable, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(injected("sys.exit(0)"), "--json") == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "fail" and summary["property"] == "no-error"
    assert "SystemExit" in summary["message"]


@pytest.mark.release
@pytest.mark.parametrize("json_flag", [True, False])
def test_os_exit_0_in_the_sync_is_an_error_never_a_pass(
    check: Callable, json_flag: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    code = check(injected("os._exit(0)"), *(["--json"] if json_flag else []))
    out, err = capsys.readouterr()
    message = (
        "the target ended the process (os._exit/exit status 0) "
        "before dpsim reached a verdict"
    )
    assert code == EXIT_NO_VERDICT != 0
    assert err.strip().splitlines() == [f"dpsim: error: {message}"]
    if json_flag:
        assert json.loads(out) == {"verdict": "error", "message": message}
    else:
        assert out == ""


@pytest.mark.release
def test_a_replay_whose_target_ends_the_process_is_an_error_never_holds(
    check: Callable, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check(injected("sys.exit(0)")) == 1
    capsys.readouterr()
    (found,) = (tmp_path / "out").glob("*.json")
    exits = tmp_path / "exits.py"
    exits.write_text(injected("os._exit(0)"))
    assert main(["replay", str(found), "--target", str(exits), "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "error"
    assert "(os._exit/exit status 0)" in captured.err


@pytest.mark.release
def test_system_exit_at_import_is_a_one_line_target_error(
    check: Callable, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check("raise SystemExit(0)\n" + CORRECT, "--json") == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"dpsim: error: {tmp_path / 'dp_utils.py'}:1: ")
    assert lines[0].endswith("raised SystemExit(0) while loading: dpsim cannot run it")
    assert json.loads(out)["verdict"] == "error"


# -- bounded memory and CPU -----------------------------------------------------


@pytest.mark.release
def test_allocating_in_a_loop_is_stopped_by_the_memory_allowance(
    check: Callable, capsys: pytest.CaptureFixture[str]
) -> None:
    grow = "blocks = []\n    while True: blocks.append(bytearray(64 * 2**20))"
    limit = data_limit(HEADROOM)
    assert check(injected(grow), "--json", "--memory-limit", limit) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["property"] == "no-error"
    assert "MemoryError" in summary["message"]


@pytest.mark.release
@pytest.mark.parametrize("where", ["sync", "import"])
def test_spinning_in_c_is_stopped_by_the_cpu_allowance(
    check: Callable, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spin = "sum(range(10**15))"
    source = injected(spin) if where == "sync" else f"{spin}\n{CORRECT}"
    assert check(source, "--json", "--cpu-limit", "2") == EXIT_NO_VERDICT
    out, err = capsys.readouterr()
    message = json.loads(out)["message"]
    assert "CPU allowance (2 s" in message and "SIGXCPU" in message
    assert err.strip().splitlines() == [f"dpsim: error: {message}"]


def test_memory_error_outside_a_rank_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def grow() -> int:
        blocks = []
        while True:
            blocks.append(bytearray(64 * 2**20))

    used = allowances.data_in_use()
    assert used is not None
    allowance = Allowance(memory=used + 256 * 2**20, cpu_seconds=60)
    assert run_isolated(grow, allowance=allowance, json_errors=True) == EXIT_NO_VERDICT
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "error"
    assert "ran out of its memory allowance" in captured.err


def test_a_c_spin_outside_any_case_is_stopped_within_the_allowance(
    capsys: pytest.CaptureFixture[str],
) -> None:
    allowance = Allowance(memory=None, cpu_seconds=1)
    assert run_isolated(lambda: sum(range(10**15)), allowance=allowance) == 2
    assert "SIGXCPU" in capsys.readouterr().err


# -- the parent's report of a child that sent nothing ---------------------------


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (signal.SIGKILL, "killed by SIGKILL (out of memory?"),
        (signal.SIGSEGV, "died of SIGSEGV"),
        (signal.SIGXCPU, "CPU allowance (60 s"),
        (3 << 8, "(os._exit/exit status 3)"),
    ],
)
def test_died_says_how_the_child_ended(status: int, words: str) -> None:
    assert words in died(int(status), GENEROUS)


def test_a_killed_child_is_reported_not_passed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def kill_myself() -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    assert run_isolated(kill_myself, allowance=GENEROUS, json_errors=True) == 2
    captured = capsys.readouterr()
    assert "killed by SIGKILL" in json.loads(captured.out)["message"]


def test_a_child_ended_by_a_second_ctrl_c_is_interrupted_not_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def second_ctrl_c() -> int:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 0

    assert run_isolated(second_ctrl_c, allowance=GENEROUS) == 130
    assert capsys.readouterr().err == "dpsim: interrupted\n"


def test_one_ctrl_c_in_the_parent_waits_for_the_childs_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def interrupt_then_report() -> int:
        os.kill(os.getppid(), signal.SIGINT)
        print("the report")
        return 1

    assert run_isolated(interrupt_then_report, allowance=GENEROUS) == 1
    assert capsys.readouterr().out == "the report\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_right_after_the_fork_is_counted_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parent's handler is in place before the fork: a Ctrl-C landing at
    once (a loaded machine can run the child first) must not raise in the
    parent and lose the child's report."""
    real_fork = os.fork

    def fork_then_interrupt() -> int:
        pid = real_fork()
        if pid != 0:
            os.kill(os.getpid(), signal.SIGINT)
        return pid

    monkeypatch.setattr(os, "fork", fork_then_interrupt)

    def report() -> int:
        print("the report")
        return 1

    try:
        status = run_isolated(report, allowance=GENEROUS)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C just after the fork raised in the parent")
    assert status == 1
    assert capsys.readouterr().out == "the report\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_in_the_parent_kills_a_child_that_does_not_stop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def never_stops() -> int:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:  # until the parent, counting two, kills this process
            os.kill(os.getppid(), signal.SIGINT)
            time.sleep(0.05)

    # The child may send a third SIGINT just before it is killed; that one
    # reaches whatever handler the parent restores, which in a test run must
    # not be the one that raises KeyboardInterrupt into the test runner.
    # signal.signal() runs pending handlers before it swaps them.
    outer = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        status = run_isolated(never_stops, allowance=GENEROUS, json_errors=True)
    finally:
        signal.signal(signal.SIGINT, outer)
    assert status == 130
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"verdict": "error", "message": "interrupted"}


def test_the_childs_report_and_status_come_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def work() -> int:
        print("the report")
        print("a note", file=sys.stderr)
        return 1

    assert run_isolated(work, allowance=GENEROUS, json_errors=True) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("the report\n", "a note\n")


# -- output channels ------------------------------------------------------------


@pytest.mark.release
def test_a_targets_prints_never_reach_the_json_on_stdout(
    check: Callable, capfd: pytest.CaptureFixture[str]
) -> None:
    noisy = "print('PRINTED'); sys.stdout.write('WRITTEN\\n'); os.write(1, b'RAW\\n')"
    at_import = "print('IMPORTED')\n"
    assert check(at_import + injected(noisy), "--json") == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["verdict"] == "pass"
    assert {"IMPORTED", "PRINTED", "WRITTEN", "RAW"} <= set(err.split())


@pytest.mark.release
def test_a_reader_that_stops_reading_gets_no_traceback(tmp_path: Path) -> None:
    target = tmp_path / "dp_utils.py"
    target.write_text(CORRECT)
    reading, writing = os.pipe()
    os.close(reading)  # as `| head -0` would
    try:
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("dpsim")),
                "check",
                "--vllm",
                BASE,
                "--target",
                str(target),
                "--scenario",
                "step",
                "--ranks",
                "2",
                "--examples",
                "3",
                "--out",
                str(tmp_path),
            ],
            stdout=writing,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(writing)
    assert done.returncode == EXIT_BROKEN_PIPE
    assert done.stderr == ""


# -- refused before the run -----------------------------------------------------


def test_ranks_above_the_maximum_are_refused() -> None:
    assert parse_ranks("2..1024") == (2, 1024)
    with pytest.raises(UsageError, match=r"--ranks '2\.\.1025': at most 1,024 ranks"):
        parse_ranks("2..1025")


def test_bench_refuses_ranks_above_the_maximum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--vllm", "/nonexistent", "--ranks", "1025"]) == 2
    assert "--ranks 1025: at most 1,024 ranks" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--ranks", "4096"], "at most 1,024 ranks"),
        (["--out", "FILE"], "FILE: is not a directory"),
        (["--out", "FILE/sub/dir"], "is under"),
        (["--memory-limit", "lots"], "expected a size like 8G"),
        (["--memory-limit", "1K"], "below what dpsim itself already uses"),
        (["--cpu-limit", "0"], "--cpu-limit must be at least 1 second"),
    ],
)
def test_bad_limits_and_outputs_are_one_line_before_any_run(
    arguments: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = tmp_path / "FILE"
    file.write_text("")
    arguments = [str(file) + a[4:] if a.startswith("FILE") else a for a in arguments]
    # A target that does not exist: a refusal must come before it is looked at.
    code = main(["check", "--target", str(tmp_path / "missing.py"), *arguments])
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and captured.out == ""


@pytest.mark.parametrize(
    "command", ["check", "fuzz", "versions", "mutate", "policy validate a.toml"]
)
def test_every_command_refuses_an_out_that_is_a_file_before_its_run(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "report"
    file.write_text("")
    assert main([*command.split(), "--out", str(file)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"dpsim: error: --out {file}: is not a directory"]


def test_an_unwritable_out_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    out = locked / "out"

    def refused() -> tuple[int, str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["check", "--out", str(out)])
        return code, err.getvalue()

    # Held to the folder's mode bits as a user is, even where tests run as root.
    code, err = as_plain_user(refused)
    assert code == 2
    assert err.splitlines() == [f"dpsim: error: --out {out}: {locked} is not writable"]


def test_an_out_that_does_not_exist_yet_is_not_created_by_the_check(
    tmp_path: Path,
) -> None:
    from dpsim.cli import check_output_directory

    check_output_directory(tmp_path / "new" / "out", "--out")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", ["check", "replay"])
def test_help_documents_the_allowances_and_the_rank_maximum(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--memory-limit SIZE" in text and "75% of this machine's" in text
    assert "--cpu-limit SECONDS" in text
    if command == "check":
        assert "at most 1,024" in text


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8G", 8 * 2**30),
        ("512M", 512 * 2**20),
        ("1.5g", 3 * 2**29),
        ("100", 100 * 2**20),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text, "--memory-limit") == size


def test_none_is_no_memory_limit_and_the_environment_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = argparse.Namespace(memory_limit=None, cpu_limit=5)
    monkeypatch.setenv(allowances.MEMORY_ENV, "none")
    assert allowances.from_arguments(namespace) == Allowance(None, 5)
    monkeypatch.setenv(allowances.MEMORY_ENV, "64G")
    assert allowances.from_arguments(namespace).memory == 64 * 2**30
    monkeypatch.setenv(allowances.MEMORY_ENV, "x")
    with pytest.raises(UsageError, match=allowances.MEMORY_ENV):
        allowances.from_arguments(namespace)


def test_the_child_runs_torch_on_one_thread() -> None:
    # A forked child inherits no OpenMP pool threads: a parallel torch op
    # there would wait forever for them (seen as a hung test-runner worker
    # that had run torch before forking). The child must not go parallel.
    import torch

    torch.ones(1 << 20).sum()  # the parent's pool, if it has one, is up

    def report_threads() -> int:
        print(torch.get_num_threads())
        return 0

    result = run_in_child(report_threads, allowance=GENEROUS)
    assert (result.code, result.stdout) == (0, "1\n")
