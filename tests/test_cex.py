"""Counterexample files: round trips, exact simulated replay, and hostile input.

A file found on a faulty target (hand-written here) or on a real release must
replay to the same bytes; a file that is not what it claims must be refused in
one line with exit status 2, whatever is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import runpy
import shutil
from pathlib import Path
from typing import Any

import faults as faulty
import pytest
import schemas
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from dpsim import cex, limits
from dpsim.cex import files
from dpsim.check import CheckOptions, run_check
from dpsim.cli import main
from dpsim.errors import UsageError
from dpsim.replay import (
    HOLDS,
    REPRODUCED,
    compare,
    replay_in_sim,
    resolve_target,
)
from dpsim.replay.simulated import target_for_tests
from dpsim.targets import load_target

pytestmark = pytest.mark.release


def _find(target_file: Path | None, vllm: str, out: Path, **options: Any) -> Path:
    """What `dpsim check --out` does: search, shrink, write the file."""
    target = load_target(vllm, target_file)
    report = run_check(
        target,
        CheckOptions(
            scenarios=("step",), profile="contract", properties=("no-hang",), **options
        ),
    )
    failed = report.first_failure
    assert failed is not None and failed.finding is not None
    finding = failed.finding
    names = ("no-hang",)
    return cex.write(
        files.build(target, finding.case, finding.result, finding.verdicts, names),
        out,
    )


@pytest.fixture
def idle_hang_file(tmp_path: Path) -> Path:
    source = faulty.write(tmp_path, "dp_utils_idle.py", faulty.IDLE_RETURNS_EARLY)
    return _find(source, faulty.BASE, tmp_path / "out", ranks=(2, 4), examples=100)


def test_a_faulty_targets_counterexample_round_trips_and_replays_byte_for_byte(
    idle_hang_file: Path,
) -> None:
    recorded = cex.read(idle_hang_file)
    assert files.encode(recorded) == idle_hang_file.read_text()
    assert recorded.outcome == "hang"
    assert recorded.verdicts[0]["property"] == "no-hang"
    resolved = resolve_target(recorded)
    assert resolved.drift == () and not resolved.overridden
    rerun = replay_in_sim(recorded, resolved.target)
    assert not rerun.diverged
    assert files.canonical(rerun.as_rerun_dict()) == files.canonical(
        files.recorded_rerun(recorded)
    )
    assert compare(recorded, rerun) == REPRODUCED


def test_the_real_033_idle_rank_case_replays_identically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = faulty.idle_case_on_033(tmp_path)
    recorded = cex.read(found)
    failing = bool(recorded.verdicts)  # a hang under HEAD's scenario semantics
    assert main(["replay", str(found)]) == (1 if failing else 0)
    shown = capsys.readouterr().out
    assert f"outcome: {recorded.outcome}" in shown
    assert main(["replay", str(found), "--json"]) == (1 if failing else 0)
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == (REPRODUCED if failing else HOLDS)
    assert summary["verdicts"] == list(recorded.verdicts)
    rerun = replay_in_sim(recorded, resolve_target(recorded).target)
    assert files.canonical(rerun.as_rerun_dict()) == files.canonical(
        files.recorded_rerun(recorded)
    )


def test_a_v1_runner_counterexample_records_its_runner_and_replays_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = faulty.v1_mode_not_synced_on_033(tmp_path)
    recorded = cex.read(found)
    assert files.encode(recorded) == found.read_text()
    assert recorded.target["spec"]["runner"] == "v1"
    assert "vllm.v1.worker.gpu_model_runner" in recorded.target["files"]
    assert recorded.verdicts[0]["property"] == "no-hang"
    assert main(["replay", str(found), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (summary["status"], summary["runner"]) == (REPRODUCED, "v1")
    # The V2 runner of the same release, named: the V1 file is left behind,
    # and 0.33.0's own V2 sync holds on this case.
    assert main(["replay", str(found), "--runner", "v2", "--json"]) == 0
    v2 = json.loads(capsys.readouterr().out)
    assert (v2["runner"], v2["target"], v2["status"]) == ("v2", "vllm 0.33.0", HOLDS)


def test_a_regression_test_runs_the_runner_dpsim_runner_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = cex.read(faulty.v1_mode_not_synced_on_033(tmp_path))
    assert target_for_tests(recorded).target.runner == "v1"
    monkeypatch.setenv("DPSIM_RUNNER", "v2")
    resolved = target_for_tests(recorded)
    assert (resolved.target.runner, resolved.overridden) == ("v2", True)
    monkeypatch.setenv("DPSIM_RUNNER", "v0")
    with pytest.raises(UsageError, match=r"^DPSIM_RUNNER 'v0': expected one of"):
        target_for_tests(recorded)


def test_a_file_without_a_runner_replays_as_the_v2_file_it_is(
    idle_hang_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every file written before dpsim knew V1 lacks the key; V2 files still do.
    assert "runner" not in json.loads(idle_hang_file.read_text())["target"]["spec"]
    assert main(["replay", str(idle_hang_file), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (summary["status"], summary["runner"]) == (REPRODUCED, "v2")


def test_a_v1_record_changed_under_it_is_refused_naming_the_v1_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = faulty.v1_mode_not_synced_on_033(tmp_path)
    data = json.loads(found.read_text())
    del data["target"]["files"]["vllm.v1.cudagraph_dispatcher"]
    found.write_text(json.dumps(data))
    assert main(["replay", str(found)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "dpsim: error: the counterexample's target changed: "
        "vllm.v1.cudagraph_dispatcher: executed by every V1 target, not recorded;"
    )


def test_check_out_writes_a_regression_test_that_fails_while_the_bug_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = faulty.write(tmp_path, "idle.py", faulty.IDLE_RETURNS_EARLY)
    out = tmp_path / "out"
    arguments = ["check", "--target", str(source), "--vllm", faulty.BASE]
    options = ["--profile", "contract", "--scenario", "step", "--property", "no-hang"]
    sizes = ["--ranks", "2..4", "--examples", "100", "--out", str(out)]
    assert main([*arguments, *options, *sizes]) == 1
    capsys.readouterr()
    (written,) = out.glob("*.json")
    (regression,) = out.glob("test_*.py")
    assert written.name in regression.read_text()
    test = runpy.run_path(str(regression))
    function = next(v for k, v in test.items() if k.startswith("test_"))
    with pytest.raises(AssertionError, match="no-hang"):
        function()
    monkeypatch.setenv(
        "DPSIM_TARGET", str(faulty.write(tmp_path, "fixed.py", faulty.FIXED))
    )
    function()


def test_another_version_says_whether_the_bug_is_still_there(
    idle_hang_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = cex.read(idle_hang_file)
    fix = faulty.write(tmp_path, "fixed.py", faulty.FIXED)
    fixed = resolve_target(recorded, target_file=fix)
    assert fixed.overridden
    rerun = replay_in_sim(recorded, fixed.target)
    assert compare(recorded, rerun) == HOLDS
    assert main(["replay", str(idle_hang_file), "--target", str(fix)]) == 0
    assert "every property holds now" in capsys.readouterr().out

    # The same fault in another file: same verdicts, and the file differs.
    again = faulty.write(tmp_path, "again.py", faulty.IDLE_RETURNS_EARLY + "\n# copy\n")
    moved = resolve_target(recorded, target_file=again)
    assert moved.drift and "sha256" in moved.drift[0]
    assert compare(recorded, replay_in_sim(recorded, moved.target)) == REPRODUCED
    assert main(["replay", str(idle_hang_file), "--target", str(again)]) == 1


def test_a_case_another_version_cannot_take_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0.33.0's case passes uniform_decode, which 0.29.0's sync has no parameter for.
    found = faulty.idle_case_on_033(tmp_path)
    assert main(["replay", str(found), "--vllm", "0.29.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dpsim: error: cannot replay this case on vllm 0.29.0: the case passes "
        "uniform_decode, which vllm 0.29.0's sync does not take"
    ]


def test_a_changed_recorded_source_is_refused_before_it_runs(
    idle_hang_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "dp_utils_idle.py"
    recorded = cex.read(idle_hang_file).target["files"]["vllm.v1.worker.gpu.dp_utils"]
    marker = tmp_path / "executed"
    # Executing the edited file at all leaves the marker behind.
    source.write_text(
        f"open({str(marker)!r}, 'w').close()\n" + faulty.IDLE_RETURNS_EARLY
    )
    now = hashlib.sha256(source.read_bytes()).hexdigest()
    assert main(["replay", str(idle_hang_file)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"dpsim: error: the counterexample's target changed: {source}: sha256 "
        f"{now[:12]} now, {recorded[:12]} recorded; pass --vllm/--target explicitly "
        "to run it anyway: that is how a fix is verified"
    )
    assert not marker.exists()
    # Named on the command line, the same file runs: how a fix is verified.
    assert main(["replay", str(idle_hang_file), "--target", str(source)]) == 1
    assert marker.exists()
    assert "replay will execute" not in capsys.readouterr().err


def test_a_regression_test_passes_once_the_bug_is_fixed(
    idle_hang_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cex.write_regression_test(idle_hang_file)
    assert path.name == f"test_{idle_hang_file.stem.replace('-', '_')}.py"
    test = runpy.run_path(str(path))
    function = next(v for k, v in test.items() if k.startswith("test_"))
    with pytest.raises(AssertionError, match="no-hang"):
        function()
    fix = faulty.write(tmp_path, "fixed.py", faulty.FIXED)
    monkeypatch.setenv("DPSIM_TARGET", str(fix))
    function()


# -- hostile and broken files ------------------------------------------------------


def _mutations() -> list[tuple[str, Any, str]]:
    def set_path(path: tuple[Any, ...], value: Any) -> Any:
        def mutate(data: dict[str, Any]) -> dict[str, Any]:
            node: Any = data
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            return data

        return mutate

    def drop(key: str) -> Any:
        def mutate(data: dict[str, Any]) -> dict[str, Any]:
            del data[key]
            return data

        return mutate

    def reshape_steps(widths: list[int]) -> Any:
        def mutate(data: dict[str, Any]) -> dict[str, Any]:
            (step,) = data["case"]["steps"]
            data["case"]["steps"] = [step[:width] for width in widths]
            return data

        return mutate

    batch = ("case", "steps", 0, 0)
    bad = "malformed counterexample: "
    tokens = f"{bad}case.steps[0][0].num_tokens must be"
    return [
        ("not an object", lambda data: [data], "not a dpsim counterexample file"),
        (
            "foreign kind",
            set_path(("kind",), "something-else"),
            "not a dpsim counterexample file",
        ),
        (
            "future schema",
            set_path(("schema",), 99),
            "counterexample schema '99'; this dpsim reads 1",
        ),
        ("no case", drop("case"), f"{bad}file has no 'case'"),
        ("no choices", drop("choices"), f"{bad}file has no 'choices'"),
        (
            "case is a list",
            set_path(("case",), []),
            f"{bad}case must be an object, got a list",
        ),
        (
            "tokens as text",
            set_path((*batch, "num_tokens"), "12"),
            f"{tokens} an integer >= 0, got '12'",
        ),
        (
            "tokens as bool",
            set_path((*batch, "num_tokens"), True),
            f"{tokens} an integer >= 0, got True",
        ),
        (
            "tokens as float",
            set_path((*batch, "num_tokens"), 1.5),
            f"{tokens} an integer >= 0, got 1.5",
        ),
        (
            "negative tokens",
            set_path((*batch, "num_tokens"), -1),
            f"{tokens} an integer >= 0, got -1",
        ),
        (
            "huge tokens",
            set_path((*batch, "num_tokens"), 10**30),
            f"{tokens} at most 2,147,483,647, got an integer of 100 bits",
        ),
        (
            "flag as int",
            set_path((*batch, "need_eager"), 1),
            f"{bad}case.steps[0][0].need_eager must be true or false",
        ),
        (
            "unknown batch key",
            set_path((*batch, "exec"), "rm -rf /"),
            f"{bad}case.steps[0][0] has unknown keys: exec",
        ),
        (
            "unknown kind",
            set_path((*batch, "kind"), "weird"),
            f"{bad}case.steps[0][0].kind = 'weird'; expected one of batch, decode, "
            "dummy, idle, mixed, prefill, profile, varlen",
        ),
        (
            "ragged steps",
            reshape_steps([2, 1]),
            f"{bad}case.steps: every step needs one batch per rank",
        ),
        (
            "a step without ranks",
            reshape_steps([2, 0]),
            f"{bad}case.steps[1] has no ranks",
        ),
        (
            "no steps",
            set_path(("case", "steps"), []),
            f"{bad}case.steps is empty; a case has at least one step",
        ),
        (
            "too many ranks",
            set_path(("case", "steps"), [[{}] * 5000]),
            f"{bad}case.steps[0] has 5000 entries; at most 1024 allowed",
        ),
        (
            "dp_size lies",
            set_path(("case", "dp_size"), 3),
            f"{bad}case.dp_size is 3 but each step has 2 batches",
        ),
        (
            "unknown scenario",
            set_path(("case", "scenario"), "__import__"),
            f"{bad}case.scenario = '__import__'; expected one of drafter, profile, "
            "step, ubatch",
        ),
        (
            "bad policy",
            set_path(("case", "policy", "cudagraph_mode"), "TURBO"),
            f"{bad}malformed case: cudagraph_mode: unknown mode 'TURBO'; expected one "
            "of NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE",
        ),
        (
            "huge policy",
            set_path(("case", "policy", "capture_sizes"), [1] * 5000),
            f"{bad}case.policy.capture_sizes has 5000 entries; at most 2048 allowed",
        ),
        (
            "choice out of range",
            set_path(("choices",), [0, 7]),
            f"{bad}choices[1] must be at most 1, got 7",
        ),
        (
            "choice as text",
            set_path(("choices",), ["0"]),
            f"{bad}choices[0] must be an integer >= 0, got '0'",
        ),
        (
            "unknown property",
            set_path(("properties",), ["no-hang", "os.system"]),
            # Then every property's name, which grows with the suite.
            f"{bad}properties[1] = 'os.system'; expected one of agreed-values, ",
        ),
        (
            "unknown outcome",
            set_path(("outcome",), "fine"),
            f"{bad}outcome = 'fine'; expected one of budget, crash, hang, mismatch, ok",
        ),
        (
            "verdict rank out of range",
            set_path(("verdicts", 0, "ranks"), [9]),
            f"{bad}verdicts[0].ranks[0] must be at most 1, got 9",
        ),
        (
            "bad digest",
            set_path(("target", "files", "vllm.x"), "not-a-digest"),
            f"{bad}target.files['vllm.x'] is not a SHA-256 hex digest",
        ),
        (
            "bad module name",
            set_path(("target", "files"), {"../../etc": "0" * 64}),
            f"{bad}target.files: '../../etc' is not a module name",
        ),
        (
            "unknown spec kind",
            set_path(("target", "spec", "kind"), "url"),
            f"{bad}target.spec.kind = 'url'; expected one of release, tree",
        ),
        (
            "unknown runner",
            set_path(("target", "spec", "runner"), "v3"),
            f"{bad}target.spec.runner = 'v3'; expected one of v1, v2",
        ),
        (
            "caller file a number",
            set_path(("target", "spec", "caller_file"), 7),
            f"{bad}target.spec.caller_file must be a string, got an integer",
        ),
        (
            "trace is text",
            set_path(("trace",), "x"),
            f"{bad}trace must be an object, got a string",
        ),
        (
            "version is a number",
            set_path(("dpsim_version",), 1),
            f"{bad}dpsim_version must be a string, got an integer",
        ),
    ]


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A well-formed file's content, with a verdict (the idle target hangs)."""
    from dpsim.properties import judge
    from dpsim.scenarios import run_case

    directory = tmp_path_factory.mktemp("valid")
    source = faulty.write(directory, "idle.py", faulty.IDLE_RETURNS_EARLY)
    target = load_target(faulty.BASE, source)
    case = faulty.step_case(1, 0)
    result = run_case(target, case)
    verdicts = tuple(judge(case, result))
    assert verdicts
    return files.build(target, case, result, verdicts, ("no-hang",)).to_dict()


@pytest.mark.parametrize(
    ("label", "mutate", "expected"),
    _mutations(),
    ids=[label for label, _, _ in _mutations()],
)
def test_a_malformed_file_is_refused_in_one_line(
    label: str,
    mutate: Any,
    expected: str,
    valid: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(mutate(json.loads(json.dumps(valid)))))
    assert main(["replay", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    # The field at fault and what is wrong with it, after the file's path.
    assert line.startswith(f"dpsim: error: {path}: {expected}")
    if label != "unknown property":
        assert line == f"dpsim: error: {path}: {expected}"


@pytest.mark.parametrize(
    ("label", "content"),
    [
        ("empty", b""),
        ("binary", bytes(range(256))),
        ("not json", b"{'kind': 'dpsim-counterexample'}"),
        ("nan", b'{"kind": "dpsim-counterexample", "schema": NaN}'),
        ("deep", b"[" * 100_000 + b"]" * 100_000),
        ("giant int", b'{"schema": ' + b"9" * 100_000 + b"}"),
        ("truncated", b'{"kind": "dpsim-counterexample", "sch'),
    ],
)
def test_garbage_is_refused_in_one_line(
    label: str, content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "garbage.json"
    path.write_bytes(content)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpsim: error: ") and len(err.strip().splitlines()) == 1


def test_missing_oversized_and_directory_paths_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "nowhere.json")]) == 2
    assert main(["replay", str(tmp_path)]) == 2
    big = tmp_path / "big.json"
    big.write_text(" " * 2048 + "{}")
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 1024)
    assert main(["replay", str(big)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("dpsim: error: ") for line in lines)
    assert "over" in lines[2]


def test_reading_a_valid_file_builds_the_same_case(
    valid: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(valid))
    read = cex.read(path)
    assert read.case == faulty.step_case(1, 0)
    assert read.to_dict() == valid


# -- replay checks the recorded target before any of it runs ------------------------


def test_a_verdict_naming_a_rank_twice_is_refused(
    valid: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(json.dumps(valid))
    data["verdicts"][0]["ranks"] = [1, 1]
    path = tmp_path / "twice.json"
    path.write_text(json.dumps(data))
    assert main(["replay", str(path)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("malformed counterexample: verdicts[0].ranks lists rank 1 twice")
    )


def test_a_path_the_file_names_is_said_before_it_runs(
    idle_hang_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(idle_hang_file)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"dpsim: replay will execute {tmp_path / 'dp_utils_idle.py'}, named by the "
        "counterexample, not on this command line"
    )


def test_a_recorded_tree_is_hashed_and_said_before_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpsim.properties import judge
    from dpsim.scenarios import run_case
    from dpsim.targets.cache import ensure_release

    tree = tmp_path / "tree"
    shutil.copytree(ensure_release(faulty.BASE), tree / "vllm")
    source = faulty.write(tmp_path, "idle.py", faulty.IDLE_RETURNS_EARLY)
    target = load_target(str(tree), source)
    case = faulty.step_case(1, 0)
    result = run_case(target, case)
    verdicts = tuple(judge(case, result))
    built = files.build(target, case, result, verdicts, ("no-hang",))
    path = cex.write(built, tmp_path / "out")
    assert main(["replay", str(path)]) == 1
    notice = capsys.readouterr().err.splitlines()[0]
    assert notice == (
        f"dpsim: replay will execute {tree / 'vllm'} and {source}, named by the "
        "counterexample, not on this command line"
    )
    # --target alone keeps the recorded tree under it: the tree is still said.
    assert main(["replay", str(path), "--target", str(source)]) == 1
    assert (
        capsys.readouterr()
        .err.splitlines()[0]
        .startswith(f"dpsim: replay will execute {tree / 'vllm'}, named by")
    )
    edited = tree / "vllm" / "v1" / "worker" / "gpu" / "cudagraph_utils.py"
    edited.write_text(edited.read_text() + "\n# edited\n")
    assert main(["replay", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"target changed: {edited}: sha256 " in line and "--vllm/--target" in line


def test_a_module_loaded_now_but_not_recorded_is_refused(
    idle_hang_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(idle_hang_file.read_text())
    del data["target"]["files"]["vllm.utils.math_utils"]
    idle_hang_file.write_text(json.dumps(data))
    assert main(["replay", str(idle_hang_file)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "dpsim: error: the counterexample's target changed: vllm.utils.math_utils: "
        "loaded now, not recorded; pass --vllm/--target explicitly to run it "
        "anyway: that is how a fix is verified"
    )


def test_a_record_without_the_modules_every_target_runs_is_refused_before_loading(
    idle_hang_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(idle_hang_file.read_text())
    data["target"]["files"] = {}
    idle_hang_file.write_text(json.dumps(data))
    assert main(["replay", str(idle_hang_file)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        "dpsim: error: the counterexample's target changed: "
        "vllm.v1.worker.gpu.dp_utils: executed by every V2 target, not recorded "
        "(and 2 more); pass --vllm/--target"
    )


def test_a_regression_test_refuses_a_changed_recorded_target(
    idle_hang_file: Path, tmp_path: Path
) -> None:
    from dpsim.replay import SourcesChanged, assert_holds

    source = tmp_path / "dp_utils_idle.py"
    source.write_text(source.read_text() + "\n# edited\n")
    with pytest.raises(SourcesChanged, match=r"target changed: .*dp_utils_idle\.py"):
        assert_holds(idle_hang_file)


# -- text from outside dpsim is shown escaped ----------------------------------------

#: A target whose exception message tries to clear the screen and forge a line.
_RAISES_CONTROLS = faulty.PADS_LOCALLY.replace(
    "    counts = _counts(",
    '    raise RuntimeError("\\x1b[2J\\rcleared\\nforged: every property holds")\n'
    "    counts = _counts(",
)


def _controls(text: str) -> set[str]:
    return {char for char in text if not char.isprintable() and char != "\n"}


def test_control_characters_in_a_counterexample_are_shown_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpsim.properties import judge
    from dpsim.scenarios import run_case

    source = faulty.write(tmp_path, "raises\x1b[31m.py", _RAISES_CONTROLS)
    target = load_target(faulty.BASE, source)
    case = faulty.step_case(1, 1)
    result = run_case(target, case)
    verdicts = tuple(judge(case, result))
    assert "\x1b[2J" in verdicts[0].message
    written = cex.write(
        files.build(target, case, result, verdicts, ("no-error",)), tmp_path
    )
    path = written.rename(tmp_path / "evil\x1b]0;title\x07\r.json")
    assert main(["replay", str(path)]) == 1
    shown = capsys.readouterr()
    assert _controls(shown.out + shown.err) == set()
    assert "\\x1b[2J\\rcleared\\nforged" in shown.out
    assert "evil\\x1b]0;title\\x07\\r.json" in shown.out
    assert "raises\\x1b[31m.py" in shown.err  # the notice names the target file

    assert main(["replay", str(tmp_path / "gone\x1b[2J\r.json")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert _controls(line) == set() and "gone\\x1b[2J\\r.json" in line


# -- every counterexample dpsim writes, it reads back and replays ---------------------


@pytest.fixture(scope="module")
def writer_targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A hand-written target that fails many properties (each rank pads to its
    own count), and a real release, whose contract-profile cases fail some."""
    directory = tmp_path_factory.mktemp("writer")
    own = faulty.write(
        directory, "own_padding.py", faulty.VOTING.replace("PAD_FROM", "num_tokens")
    )
    return {
        "own-padding": load_target(faulty.BASE, own),
        "0.33.0": load_target("0.33.0"),
        "out": directory / "out",
    }


@pytest.mark.parametrize("name", ["own-padding", "0.33.0"])
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_every_counterexample_dpsim_writes_is_read_back_and_replays(
    name: str, writer_targets: dict[str, Any], data: st.DataObject
) -> None:
    from dpsim.properties import PROPERTY_NAMES, judge
    from dpsim.scenarios import PolicyRefused, run_case
    from dpsim.scenarios.generate import cases, scenarios_for

    target = writer_targets[name]
    scenario = data.draw(st.sampled_from(scenarios_for(target)), label="scenario")
    case = data.draw(cases(target, scenario=scenario, profile="contract", ranks=(1, 4)))
    try:
        result = run_case(target, case)
    except PolicyRefused:
        reject()
    verdicts = judge(case, result)
    # What check, versions and the suite write for a failing run.
    path = cex.save(
        target, case, result, verdicts, PROPERTY_NAMES, writer_targets["out"]
    )
    schemas.assert_valid(path)  # it is what the published schema describes ...
    read = cex.read(path)  # ... the reader accepts it ...
    assert files.encode(read) == path.read_text()
    rerun = replay_in_sim(read, resolve_target(read).target)  # ... and it replays
    assert files.canonical(rerun.as_rerun_dict()) == files.canonical(
        files.recorded_rerun(read)
    )
    assert compare(read, rerun) == (REPRODUCED if verdicts else HOLDS)


# -- bounds shared with policies, workloads and flags (dpsim.limits) ----------------

_BATCH = ("case", "steps", 0, 0)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (
            (*_BATCH, "num_tokens"),
            2**62,
            f"case.steps[0][0].num_tokens must be at most {limits.MAX_INT:,}, "
            f"got {2**62}",
        ),
        (
            (*_BATCH, "num_reqs"),
            limits.MAX_INT + 1,
            f"case.steps[0][0].num_reqs must be at most {limits.MAX_INT:,}, "
            f"got {limits.MAX_INT + 1}",
        ),
        (
            (*_BATCH, "num_tokens"),
            "12",
            "case.steps[0][0].num_tokens must be an integer >= 0, got '12'",
        ),
        (
            ("case", "dp_size"),
            limits.MAX_RANKS + 1,
            f"case.dp_size must be at most {limits.MAX_RANKS:,}, "
            f"got {limits.MAX_RANKS + 1}",
        ),
        (
            ("case", "num_speculative_steps"),
            limits.MAX_SPECULATIVE_TOKENS + 1,
            "case.num_speculative_steps must be at most "
            f"{limits.MAX_SPECULATIVE_TOKENS}, got {limits.MAX_SPECULATIVE_TOKENS + 1}",
        ),
        (
            # Within the file's generic integer bound, above a capture size's.
            ("case", "policy", "capture_sizes"),
            [1, 10**8],
            "malformed case: capture_sizes: every size must be at most "
            f"{limits.MAX_CAPTURE_SIZE:,}, got {10**8}",
        ),
        (
            ("case", "policy", "max_num_seqs"),
            10**8,
            f"malformed case: max_num_seqs: must be at most {limits.MAX_NUM_SEQS:,}, "
            f"got {10**8}",
        ),
    ],
)
def test_a_counterexamples_numbers_are_bounded_by_the_shared_limits(
    where: tuple[Any, ...],
    value: Any,
    message: str,
    valid: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = json.loads(json.dumps(valid))
    node: Any = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "big.json"
    path.write_text(json.dumps(data))
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpsim: error: {path}: ")
    assert err.endswith(f": {message}\n") and err.count("\n") == 1


def test_a_regression_test_skips_with_the_reason_on_a_version_without_the_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 0.33.0 case passes uniform_decode, which 0.29.0's sync does not take.
    path = cex.write_regression_test(faulty.idle_case_on_033(tmp_path))
    test = runpy.run_path(str(path))
    function = next(v for k, v in test.items() if k.startswith("test_"))
    monkeypatch.setenv("DPSIM_VLLM", "0.29.0")
    with pytest.raises(pytest.skip.Exception) as skipped:
        function()
    assert str(skipped.value) == (
        "vllm 0.29.0 cannot run this counterexample: the case passes "
        "uniform_decode, which vllm 0.29.0's sync does not take"
    )


def test_a_ubatch_regression_test_skips_on_a_release_without_microbatching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpsim.properties import PROPERTY_NAMES

    target = load_target("0.33.0")
    report = run_check(target, CheckOptions(scenarios=("ubatch",), examples=300))
    finding = report.runs[0].finding
    assert finding is not None  # 0.33.0's findings 1 and 2 (docs/findings.md)
    written = cex.save(
        target, finding.case, finding.result, finding.verdicts, PROPERTY_NAMES, tmp_path
    )
    test = runpy.run_path(str(cex.write_regression_test(written)))
    function = next(v for k, v in test.items() if k.startswith("test_"))
    monkeypatch.setenv("DPSIM_VLLM", "0.29.0")
    with pytest.raises(pytest.skip.Exception, match="has no 'ubatch' scenario"):
        function()


def test_replay_says_when_a_caller_case_has_a_policy_its_release_never_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file from before the caller profile drew only buildable tables: LoRA
    capture cases [1] (vLLM's always include 0) under the caller profile."""
    from dataclasses import replace

    from dpsim.properties import judge
    from dpsim.scenarios import run_case

    target = load_target("0.33.0")
    built = []
    for name, cases in (("without-lora", None), ("lora-1", (1,))):
        policy = replace(faulty.POLICY, lora_capture_cases=cases)
        case = replace(faulty.step_case(2, 1, profile="caller"), policy=policy)
        result = run_case(target, case)
        counterexample = files.build(
            target, case, result, tuple(judge(case, result)), ("no-hang",)
        )
        built.append(cex.write(counterexample, tmp_path / name))
    buildable, unbuildable = built
    main(["replay", str(buildable), "--json"])
    assert json.loads(capsys.readouterr().out)["caller_policy_unbuildable"] is None
    main(["replay", str(unbuildable)])
    assert (
        "note: the case claims the caller profile, but vllm 0.33.0 would not "
        "build its policy (LoRA cases [1] are no LoRA configuration's): read it "
        "as a contract-profile case"
    ) in capsys.readouterr().out
