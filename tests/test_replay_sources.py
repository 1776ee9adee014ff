"""A counterexample's target is checked before any of it runs (dpsim.replay.sources).

Most of the refusals are exercised through ``dpsim replay`` in test_cex.py;
here, what ``choose`` says will be executed, whatever the file claims.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faults as faulty
import pytest

from dpsim import cex
from dpsim.cli import main
from dpsim.properties import judge
from dpsim.replay import choose
from dpsim.scenarios import run_case
from dpsim.targets import load_target
from dpsim.targets.cache import ensure_release

pytestmark = pytest.mark.release


@pytest.fixture
def idle_file(tmp_path: Path) -> Path:
    """A counterexample found on a hand-written target named by path."""
    source = faulty.write(tmp_path, "idle.py", faulty.IDLE_RETURNS_EARLY)
    target = load_target(faulty.BASE, source)
    case = faulty.step_case(1, 0)
    result = run_case(target, case)
    verdicts = tuple(judge(case, result))
    built = cex.files.build(target, case, result, verdicts, ("no-hang",))
    return cex.write(built, tmp_path / "out")


def test_what_the_user_names_is_not_said_and_what_the_file_names_is(
    idle_file: Path, tmp_path: Path
) -> None:
    recorded = cex.read(idle_file)
    source = str(tmp_path / "idle.py")
    assert choose(recorded).unasked == (source,)
    assert choose(recorded, target_file=source).unasked == ()
    assert choose(recorded, vllm="0.33.0").unasked == ()
    assert choose(recorded, vllm="0.33.0").target_file is None


def test_a_tree_recorded_as_a_release_is_still_said_before_it_runs(
    idle_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ensure_release(faulty.BASE), tree / "vllm")
    data = json.loads(idle_file.read_text())
    data["target"]["spec"]["base"] = str(tree)  # "kind" still says "release"
    idle_file.write_text(json.dumps(data))
    assert main(["replay", str(idle_file)]) == 1
    notice = capsys.readouterr().err.splitlines()[0]
    assert notice == (
        f"dpsim: replay will execute {tree} and {tmp_path / 'idle.py'}, named by "
        "the counterexample, not on this command line"
    )
