"""``dpsim targets``' compatibility report, on releases and on drifted copies.

The drifted copies are made at test time from the cached 0.33.0 release's own
files, each with one change of the kind vLLM makes between releases.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.targets import load_target
from dpsim.targets.cache import ensure_release
from dpsim.targets.compat import Misfit, fits

pytestmark = pytest.mark.release

BASE = "0.33.0"
SYNC = "v1/worker/gpu/dp_utils.py"
MANAGER = "v1/worker/gpu/cudagraph_utils.py"


@pytest.mark.parametrize("version", ["0.18.0", "0.29.0", "0.33.0", "0.34.0"])
def test_every_name_of_a_release_dpsim_was_built_for_fits(version: str) -> None:
    assert fits(load_target(version)) == ()


def _drifted(tmp_path: Path, relative: str, before: str, after: str) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ensure_release(BASE), tree / "vllm")
    path = tree / "vllm" / relative
    text = path.read_text()
    assert text.count(before) == 1, f"{BASE}'s {relative} changed: {before!r}"
    path.write_text(text.replace(before, after))
    return tree


def test_a_new_sync_parameter_and_field_are_named_with_what_dpsim_does(
    tmp_path: Path,
) -> None:
    tree = _drifted(
        tmp_path,
        SYNC,
        "    skip_drafts: bool = False\n",
        "    skip_drafts: bool = False\n    draft_budget: int = 0\n",
    )
    path = tree / "vllm" / SYNC
    path.write_text(
        path.read_text().replace(
            "    dp_sync_state: DPSyncState | None = None,\n",
            "    dp_sync_state: DPSyncState | None = None,\n    draft_budget: int = 0,\n",
            1,
        )
    )
    misfits = fits(load_target(str(tree)))
    assert [(m.part, m.name) for m in misfits] == [
        ("sync", "draft_budget"),
        ("agreement", "draft_budget"),
    ]
    assert misfits[0].consequence == (
        "a parameter of dispatch_cg_and_sync_dp() dpsim never passes; "
        "left at its default"
    )


def test_a_config_attribute_the_manager_newly_reads_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _drifted(
        tmp_path,
        MANAGER,
        "        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs\n",
        "        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs\n"
        "        self.split = vllm_config.compilation_config.split_decode_graphs\n",
    )
    target = load_target(str(tree))
    assert fits(target) == (
        Misfit(
            "config",
            "compilation_config.split_decode_graphs",
            "read by the manager; dpsim's config view has it off",
        ),
    )
    assert main(["targets", str(tree / "vllm")]) == 0
    out = capsys.readouterr().out
    assert (
        "  unknown:    config compilation_config.split_decode_graphs: read by the "
        "manager; dpsim's config view has it off"
    ) in out.splitlines()
