"""vLLM drifting under dpsim: a release's files changed as releases change them.

Each variant copies 0.33.0's cached files into a tree and edits them at test
time the way vLLM's code moves between releases: a new required argument to
the manager or the sync, a renamed keyword, a new ``DPSyncState`` field, a new
row of the all-reduced tensor, a moved module, a new config switch read off
``parallel_config``, a pure refactor. For each, ``dpsim check`` must either
give the verdicts it gives on the unmodified tree or refuse in one line with
exit status 2: never a traceback, never exit status 1 (the scenarios checked
hold on 0.33.0, so a 1 would be a false finding).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpsim.cli import main
from dpsim.targets.cache import ensure_release

pytestmark = pytest.mark.release

RELEASE = "0.33.0"
GPU = "v1/worker/gpu"
#: Scenarios that hold on 0.33.0 over these few cases (its ubatch bug aside):
#: the plain step and the drafter's, whose reuse and skip_drafts the variants touch.
SCENARIOS = ("step", "drafter")
EXAMPLES = "20"


def _edit(package: Path, relative: str, old: str, new: str, count: int = 1) -> None:
    path = package / relative
    text = path.read_text()
    assert text.count(old) == count, f"{RELEASE}'s {relative} changed: {old!r}"
    path.write_text(text.replace(old, new))


def manager_argument(package: Path) -> None:
    """The capture managers take a new required argument (as 0.34.0's took
    ``decode_query_lens``)."""
    _edit(
        package,
        f"{GPU}/cudagraph_utils.py",
        "        decode_query_len: int,\n        lora_capture_cases",
        "        decode_query_len: int,\n        graph_pool_size: int,\n"
        "        lora_capture_cases",
        count=2,
    )


def sync_argument(package: Path) -> None:
    """``dispatch_cg_and_sync_dp`` takes a new required argument."""
    _edit(
        package,
        f"{GPU}/dp_utils.py",
        "    dp_rank: int,\n    max_query_len: int | None = None,\n    need_eager",
        "    dp_rank: int,\n    dp_epoch: int,\n    max_query_len: int | None = None,\n"
        "    need_eager",
    )


def renamed_keyword(package: Path) -> None:
    """The sync's reuse keyword is renamed (as 0.32 renamed ``dp_sync``)."""
    path = package / GPU / "dp_utils.py"
    text = path.read_text()
    assert "dp_sync_state" in text
    path.write_text(text.replace("dp_sync_state", "prior_sync"))


def new_field(package: Path) -> None:
    """``DPSyncState`` carries a new field (as 0.34.0's ``max_query_len``)."""
    _edit(
        package,
        f"{GPU}/dp_utils.py",
        "    skip_drafts: bool = False\n",
        "    skip_drafts: bool = False\n    # Ranks in the agreement.\n"
        "    ranks_agreed: int = 0\n",
    )


def new_row(package: Path) -> None:
    """The all-reduced tensor gains a row (as 0.33 added skip_drafts')."""
    dp_utils = f"{GPU}/dp_utils.py"
    _edit(package, dp_utils, "torch.zeros(7, dp_size", "torch.zeros(8, dp_size")
    _edit(
        package,
        dp_utils,
        "    tensor[6][dp_rank] = int(allow_skip_drafts)\n",
        "    tensor[6][dp_rank] = int(allow_skip_drafts)\n    tensor[7][dp_rank] = 1\n",
    )


def moved_module(package: Path) -> None:
    """The capture managers' module moves; every import follows it."""
    moved = package / GPU / "cudagraph" / "manager.py"
    moved.parent.mkdir()
    (moved.parent / "__init__.py").write_text("")
    (package / GPU / "cudagraph_utils.py").rename(moved)
    _renamed_imports(
        package,
        "vllm.v1.worker.gpu.cudagraph_utils",
        "vllm.v1.worker.gpu.cudagraph.manager",
    )


def moved_helper(package: Path) -> None:
    """A helper module the managers import moves (math_utils, round_up's)."""
    (package / "utils" / "math_utils.py").rename(package / "utils" / "math.py")
    _renamed_imports(package, "vllm.utils.math_utils", "vllm.utils.math")


def config_switch_in_sync(package: Path) -> None:
    """The sync reads a new switch off ``parallel_config`` (as 0.34.0 reads
    ``enable_fault_tolerance``)."""
    _edit(
        package,
        f"{GPU}/dp_utils.py",
        '    assert dp_size > 1, "DP size must be greater than 1"\n',
        '    assert dp_size > 1, "DP size must be greater than 1"\n'
        "    if parallel_config is not None and parallel_config.enable_elastic_dp:\n"
        "        dp_size = parallel_config.data_parallel_size\n",
    )


def config_switch_in_manager(package: Path) -> None:
    """The manager reads a new switch off the config's ``parallel_config``."""
    _edit(
        package,
        f"{GPU}/cudagraph_utils.py",
        "        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs\n",
        "        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs\n"
        "        self.elastic = vllm_config.parallel_config.enable_elastic_dp\n",
    )


def pure_refactor(package: Path) -> None:
    """The sync's file is refactored without a change of behaviour: its
    tensor renamed, its lines moved down."""
    path = package / GPU / "dp_utils.py"
    text = path.read_text()
    refactored = re.sub(r"\btensor\b", "votes", text)
    assert refactored != text
    path.write_text("# Agreement across DP ranks.\n\n" + refactored)


def _renamed_imports(package: Path, old: str, new: str) -> None:
    for path in package.rglob("*.py"):
        text = path.read_text()
        if old in text:
            path.write_text(text.replace(old, new))


#: Variant -> what the refusal must name (None: any one-line refusal or the
#: same verdicts will do, the variant being one dpsim may drive or refuse).
MUST_REFUSE: dict[Callable[[Path], None], tuple[str, ...] | None] = {
    manager_argument: (
        "CudaGraphManager.__init__() missing 1 required positional argument: "
        "'graph_pool_size'",
        "dpsim's call at dpsim/targets/manager.py:",
        "into vLLM's v1/worker/gpu/cudagraph_utils.py:",
    ),
    sync_argument: ("dispatch_cg_and_sync_dp() missing", "'dp_epoch'"),
    moved_module: ("no vllm/v1/worker/gpu/cudagraph_utils.py there", "moved"),
    moved_helper: ("'_StubMeta'", "v1/worker/gpu/cudagraph_utils.py:"),
    config_switch_in_sync: (
        "'enable_elastic_dp'",
        "vLLM reads it at v1/worker/gpu/dp_utils.py:",
    ),
    config_switch_in_manager: (
        "'enable_elastic_dp'",
        "vLLM reads it at v1/worker/gpu/cudagraph_utils.py:",
    ),
    renamed_keyword: None,
    new_field: None,
    new_row: None,
}
#: Variants that change nothing dpsim depends on: the very same verdicts.
MUST_AGREE = (pure_refactor,)


def _tree(root: Path, variant: Callable[[Path], None] | None) -> Path:
    package = ensure_release(RELEASE)
    tree = root / (variant.__name__ if variant else "unmodified")
    shutil.copytree(package, tree / "vllm")
    if variant is not None:
        variant(tree / "vllm")
    return tree


def _check(
    tree: Path, capsys: pytest.CaptureFixture[str], *lane: str
) -> tuple[int, dict[str, Any], str]:
    """``dpsim check --json`` on ``tree``: status, summary, stderr."""
    capsys.readouterr()
    cases = (
        ["--examples", "3"]
        if lane
        else ["--examples", EXAMPLES, *(f"--scenario={name}" for name in SCENARIOS)]
    )
    status = main(
        [
            "check",
            *lane,
            "--vllm",
            str(tree),
            *cases,
            "--json",
            "--out",
            str(tree / "out"),
        ]
    )
    captured = capsys.readouterr()
    return status, json.loads(captured.out), captured.err


def _verdicts(summary: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """Each scenario's verdict and failed property (the runner lane's one
    search under its own name)."""
    scenarios = summary.get("scenarios") or {"runner-lane": summary}
    return {
        name: (scenario["verdict"], scenario["property"])
        for name, scenario in scenarios.items()
    }


#: The unmodified tree's status and verdicts, per lane, once worked out.
_UNMODIFIED: dict[str, tuple[int, dict[str, tuple[str, str | None]]]] = {}


def _unmodified(
    lane: str, factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, tuple[str, str | None]]]:
    if lane not in _UNMODIFIED:
        tree = _tree(factory.mktemp("unmodified"), None)
        flags = ("--lane", "runner") if lane == "runner" else ()
        status, summary, err = _check(tree, capsys, *flags)
        # A verdict, pass or a real finding (the runner lane's few cases may
        # meet finding 13 of 0.33.0), never dpsim's error.
        assert status in (0, 1) and "Traceback" not in err, err
        _UNMODIFIED[lane] = (status, _verdicts(summary))
    return _UNMODIFIED[lane]


def _refused_in_one_line(status: int, summary: dict[str, Any], err: str) -> str:
    assert status == 2, err
    assert summary["verdict"] == "error"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpsim: error: "), err
    return lines[0]


@pytest.mark.parametrize("variant", list(MUST_REFUSE), ids=lambda v: v.__name__)
def test_a_drifted_release_gets_its_verdicts_or_a_one_line_refusal(
    variant: Callable[[Path], None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    status, summary, err = _check(_tree(tmp_path, variant), capsys)
    assert "Traceback" not in err and status != 1, err
    named = MUST_REFUSE[variant]
    if named is None and status == 0:
        expected = _unmodified("sync", tmp_path_factory, capsys)
        assert (status, _verdicts(summary)) == expected
        return
    line = _refused_in_one_line(status, summary, err)
    for part in named or ():
        assert part in line, line


@pytest.mark.parametrize("variant", MUST_AGREE, ids=lambda v: v.__name__)
def test_a_refactored_release_gets_the_very_same_verdicts(
    variant: Callable[[Path], None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    status, summary, err = _check(_tree(tmp_path, variant), capsys)
    assert "Traceback" not in err, err
    assert (status, _verdicts(summary)) == _unmodified("sync", tmp_path_factory, capsys)


def test_the_runner_lane_refuses_a_manager_argument_it_does_not_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, summary, err = _check(
        _tree(tmp_path, manager_argument), capsys, "--lane", "runner"
    )
    line = _refused_in_one_line(status, summary, err)
    assert "CudaGraphManager.__init__() missing 1 required positional" in line
    assert "'graph_pool_size'" in line and "Traceback" not in err


def test_the_runner_lane_gives_a_refactored_release_the_same_verdicts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    status, summary, err = _check(
        _tree(tmp_path, pure_refactor), capsys, "--lane", "runner"
    )
    assert "Traceback" not in err, err
    expected = _unmodified("runner", tmp_path_factory, capsys)
    assert (status, _verdicts(summary)) == expected


def _commands(tree: Path, out: Path) -> dict[str, list[str]]:
    """Every command that drives a target, each on ``tree``, with few cases."""
    from faults import idle_case_on_033

    policy = out / "policy.toml"
    policy.write_text('capture_sizes = [1, 2, 4]\ncudagraph_mode = "FULL"\n')
    vllm = str(tree)
    return {
        "replay": ["replay", str(idle_case_on_033(out)), "--vllm", vllm],
        "diff": ["diff", RELEASE, vllm, "--examples", "5", "--out", str(out / "d")],
        "fuzz": ["fuzz", "--vllm", vllm, "--for", "30s", "--workers", "1",
                 "--out", str(out / "f"), "--db", str(out / "db")],
        "policy": ["policy", "show", str(policy), "--vllm", vllm],
        "bench": ["bench", "--vllm", vllm, "--measure", "sim", "--ranks", "2",
                  "--rounds", "2"],
        "mutate": ["mutate", "--vllm", vllm, "--limit", "1", "--examples", "3",
                   "--workers", "0"],
        "targets": ["targets", "--lane", "runner", vllm],
    }  # fmt: skip


@pytest.mark.parametrize(
    "command", ["replay", "diff", "fuzz", "policy", "bench", "mutate", "targets"]
)
def test_every_command_refuses_a_release_it_cannot_drive_in_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path, manager_argument)
    argv = _commands(tree, tmp_path)[command]
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = [line for line in err.strip().splitlines() if line.startswith("dpsim")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert "'graph_pool_size'" in lines[0], err


def test_versions_gives_a_release_it_cannot_drive_an_error_row_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path, manager_argument)
    out = tmp_path / "report"
    capsys.readouterr()
    status = main(["versions", str(tree), "--runner", "v2", "--examples", "3",
                   "--workers", "1", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert status == 2 and "Traceback" not in captured.err, captured.err
    rows = [line for line in (out / "report.md").read_text().splitlines()
            if line.startswith("| vllm")]  # fmt: skip
    assert len(rows) == 1 and "| **error** |" in rows[0], rows
    assert "'graph_pool_size'" in rows[0]


def test_debug_shows_the_traceback_beside_the_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path, manager_argument)
    capsys.readouterr()
    status = main(["check", "--vllm", str(tree), "--examples", "3", "--debug",
                   "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback (most recent call last)" in err
    assert "TypeError: CudaGraphManager.__init__() missing 1" in err
    assert err.strip().splitlines()[-1].startswith("dpsim: error: dpsim cannot drive")


def test_the_pytest_plugin_reports_a_case_it_cannot_drive_as_an_error(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    tree = _tree(tmp_path, manager_argument)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "dpsim.suite", "-p",
         "no:cacheprovider", "-q", "-k", "test_step", "--dpsim-vllm", str(tree),
         "--dpsim-examples", "3", "--dpsim-out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert "1 error" in done.stdout and "failed" not in done.stdout, done.stdout
    assert "ERROR at call of test_step" in done.stdout
    assert "dpsim: error: dpsim cannot drive" in done.stdout
    assert "You can reproduce this failure" not in done.stdout
    # Nothing saved to the example database either: the search stopped.
    examples = tmp_path / ".hypothesis" / "examples"
    assert [path for path in examples.rglob("*") if path.is_file()] == []
