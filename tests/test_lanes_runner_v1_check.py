"""``dpsim check --lane runner --runner v1`` end to end, and its case file
replayed on the simulator and on real gloo processes.

The planted bug is a textual edit of the cached 0.33.0 release's
``v1/worker/gpu_model_runner.py`` in a temporary tree (the dummy run forwards
its own token count instead of the agreed one, vLLM 25906's bug class): the
check finds it in its default budget, the file records the V1 runner, and
replay (which reads the runner from the file) reproduces it byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import schemas

from dpsim.cli import main
from dpsim.lanes.runner import case as runner_case
from dpsim.targets.cache import ensure_release

pytestmark = pytest.mark.release

#: The lane's real processes give up on a collective after this long.
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """check --lane runner --runner v1 on 0.33.0 with the V1 dummy run
    forwarding its local token count: the summary and the case file written.

    Module-scoped: both tests read the one file (neither writes it), and a
    runner-lane check that finds and shrinks the bug is most of each test's
    cost."""
    package = ensure_release("0.33.0")
    tree = tmp_path_factory.mktemp("tree") / "vllm"
    shutil.copytree(package, tree)
    path = tree / "v1" / "worker" / "gpu_model_runner.py"
    text = path.read_text()
    old = "        num_tokens_padded = batch_desc.num_tokens\n        num_reqs_padded"
    assert text.count(old) == 1
    path.write_text(
        text.replace(
            old,
            "        num_tokens_padded = num_tokens_unpadded\n        num_reqs_padded",
        )
    )
    out = tmp_path_factory.mktemp("out")
    arguments = ["check", "--lane", "runner", "--runner", "v1", "--vllm", str(tree)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*arguments, "--json", "--out", str(out)]) == 1
    summary = json.loads(printed.getvalue())
    return summary, Path(summary["counterexample"])


def test_a_planted_v1_bug_is_found_written_and_replayed(
    found: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    summary, written = found
    assert summary["lane"] == "runner" and summary["verdict"] == "fail"
    assert "(V1 runner)" in summary["target"]
    schemas.assert_valid(written)
    recorded = runner_case.read(written)
    assert recorded.case.runner == "v1"
    assert recorded.target["spec"]["runner"] == "v1"
    # A V1 target's lane files are V1's.
    assert "vllm.v1.worker.gpu_model_runner" in recorded.target["lane_files"]
    assert main(["replay", str(written), "--json"]) == 1
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["status"] == "reproduced"
    # The file says which runner; another one is refused in one line.
    assert main(["replay", str(written), "--runner", "v2"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        "dpsim: error: replay --runner v2: this runner case drives the V1 model "
        "runner (recorded in the file); drop --runner"
    )
    # The unmodified release holds on the same case: how a fix is verified.
    assert main(["replay", str(written), "--vllm", "0.33.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "holds"


@pytest.mark.gloo
def test_a_v1_case_file_replays_on_gloo_and_agrees_with_the_simulator(
    found: tuple[dict[str, Any], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, written = found
    args = ["replay", str(written), "--backend", "gloo", "--timeout", str(TIMEOUT_S)]
    assert main([*args, "--json"]) == 1
    lane = json.loads(capsys.readouterr().out)["lane"]
    assert lane["disagreements"] == []
    assert lane["verdicts"] and lane["verdicts"][0]["property"] == "no-error"


def test_targets_lane_runner_v1_shows_what_runs_for_real(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arguments = ["targets", "--lane", "runner", "--runner", "v1", "--json", "0.33.0"]
    assert main(arguments) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lane"] == "runner" and shown["runner"] == "v1"
    ran = {
        f["function"].split()[-1]: f["executed"]
        for f in shown["functions"]
        if f["executed"]
    }
    for name in (
        "GPUModelRunner._determine_batch_execution_and_padding",
        "GPUModelRunner._dummy_run",
        "Worker.execute_dummy_batch",
        "DPEngineCoreProc.run_busy_loop",
    ):
        assert name in ran, name
    assert any(
        "dpsim.lanes.runner.v1.model_runner" in part for part in shown["stood_in"]
    )


def test_versions_lane_runner_v1_has_the_v1_rows(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    arguments = ["versions", "--lane", "runner", "--runner", "v1", "0.33.0", "0.11.1"]
    main([*arguments, "--examples", "3", "--out", str(tmp_path)])
    report = (tmp_path / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| vllm 0.33.0 (V1 runner)", "v1"],
        ["| 0.11.1", "v1"],
    ]
    assert " | error | runner lane (V1 runner): vLLM 0.11.1 cannot be driven" in rows[1]
