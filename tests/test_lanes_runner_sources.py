"""RunnerSources: which files the runner lane reads, and loading them."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from dpsim.errors import TargetError
from dpsim.lanes.runner import where
from dpsim.lanes.runner.sources import (
    RUNNER_LANE_MODULES,
    RunnerSources,
    check_runner_lane_release,
    wheel_prefixes,
)
from dpsim.targets import cache as cache_module
from dpsim.targets.spec import TargetSpec, TreeSpec


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A hand-written miniature ``vllm/`` (not vLLM's text)."""
    package = tmp_path / "vllm"
    files = {
        "_version.py": "__version__ = version = '9.8.7'\n",
        # Never executed here: the sync lane's target supplies these modules.
        "v1/worker/gpu/cudagraph_utils.py": "raise SystemExit\n",
        "config/compilation.py": "raise SystemExit\n",
        "v1/engine/__init__.py": "from enum import Enum\n\n\nclass Kind(Enum):\n    ADD = 1\n",
        "v1/engine/core.py": (
            "from vllm.v1.engine import Kind\n\n\ndef kind():\n    return Kind.ADD\n"
        ),
        "v1/outputs.py": (
            "import msgspec_missing_here\nfrom vllm.v1.engine import Kind\n"
            "EMPTY = ()\nBROKEN = undefined_name\n"
        ),
    }
    for relative, text in files.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def _sources(tree: Path) -> RunnerSources:
    """Sources of the miniature tree, with a stand-in for the sync lane's
    target (the tree has no sync files to load one from)."""
    modules = {
        name: types.ModuleType(name)
        for name in ("dp_utils", "cudagraph_utils", "compilation")
    }
    target: Any = types.SimpleNamespace(files=(), **modules)
    return RunnerSources(tree, "9.8.7", loaded_target=target)


def test_wheel_prefixes_cover_files_packages_and_subtrees() -> None:
    prefixes = wheel_prefixes(("vllm.v1.engine", "vllm.v1.worker.gpu.spec_decode.*"))
    assert prefixes == (
        "vllm/v1/engine.py",
        "vllm/v1/engine/__init__.py",
        "vllm/v1/worker/gpu/spec_decode/",
    )
    assert "vllm/v1/engine/core.py" in wheel_prefixes(RUNNER_LANE_MODULES)


def test_has_and_path_and_the_refusal_for_a_missing_module(tree: Path) -> None:
    sources = RunnerSources.for_tree(tree)
    assert sources.version == "9.8.7"
    assert sources.has("vllm.v1.engine.core")
    assert sources.path("vllm.v1.engine") == tree / "v1/engine/__init__.py"
    assert not sources.has("vllm.v1.worker.gpu_worker")
    with pytest.raises(TargetError) as refused:
        sources.path("vllm.v1.worker.gpu_worker")
    assert str(refused.value) == (
        "runner lane: vLLM 9.8.7 has no v1/worker/gpu_worker.py "
        "(vllm.v1.worker.gpu_worker), which the runner lane needs"
    )


def test_a_strict_load_runs_the_file_and_registers_it_as_vllm(tree: Path) -> None:
    sources = _sources(tree)
    engine = sources.load_module("vllm.v1.engine", lenient=False)
    core = sources.load_module("vllm.v1.engine.core", lenient=False)
    assert core.kind() is engine.Kind.ADD
    assert sources.load_module("vllm.v1.engine.core", lenient=False) is core
    assert engine.core is core  # a strict package finds its submodules
    assert where.is_vllm_file(str(tree / "v1/engine/core.py"))


def test_a_strict_load_that_fails_is_one_line(tree: Path) -> None:
    with pytest.raises(TargetError, match=r"v1/outputs\.py:4: executing it failed"):
        _sources(tree).load_module("vllm.v1.outputs", lenient=False)


def test_a_lenient_load_leaves_failed_names_inert(tree: Path) -> None:
    outputs = _sources(tree).load_module("vllm.v1.outputs", lenient=True)
    assert outputs.EMPTY == ()
    assert repr(outputs.BROKEN) == "<inert stub vllm.v1.outputs.BROKEN>"


def test_a_module_loaded_in_another_mode_is_refused(tree: Path) -> None:
    sources = _sources(tree)
    sources.load_module("vllm.v1.engine.core", lenient=True)
    with pytest.raises(TargetError, match="already loaded lenient, not strict"):
        sources.load_module("vllm.v1.engine.core", lenient=False)
    # Imported first by the core: an inert stub already, not the file.
    sources.loader.module("vllm.v1.engine")
    with pytest.raises(TargetError, match="already loaded as an inert stub"):
        sources.load_module("vllm.v1.engine", lenient=False)


def test_the_loader_shares_the_sync_lanes_modules(tree: Path) -> None:
    sources = _sources(tree)
    shared = sources.load_module("vllm.v1.worker.gpu.cudagraph_utils", lenient=False)
    assert shared is sources.target.cudagraph_utils
    assert sources.loader.module("vllm.config.compilation") is (
        sources.target.compilation
    )
    with pytest.raises(TargetError, match="already loaded lenient, not strict"):
        sources.load_module("vllm.config.compilation", lenient=False)


def test_the_target_file_replaces_the_sync_file(tree: Path, tmp_path: Path) -> None:
    mine = tmp_path / "my_dp_utils.py"
    mine.write_text("X = 1\n")
    spec = TargetSpec(TreeSpec(tree), dp_utils_file=mine)
    sources = RunnerSources.for_spec(spec)
    assert sources.path("vllm.v1.worker.gpu.dp_utils") == mine


def test_old_releases_are_refused_before_any_fetch() -> None:
    with pytest.raises(TargetError) as refused:
        check_runner_lane_release("0.25.1")
    assert str(refused.value) == (
        "runner lane: vLLM 0.25.1 cannot be driven: its V2 model runner has no "
        "sort_batch_req_ids (0.26 added it; before, prepare_inputs orders the "
        "batch's requests inline), which the lane's stood-in prepare_inputs "
        "takes from the release; its speculators have no "
        "SpeculatorCudaGraphManager (0.26 added it), from which the lane builds "
        "the drafter's graphs; the runner lane drives 0.26.0 and later; refused "
        "without fetching it"
    )
    with pytest.raises(TargetError) as refused:
        check_runner_lane_release("0.20.2")
    said = str(refused.value)
    assert "no target-dependent autoregressive speculator" in said
    # The engine drives has_unfinished_dp (before 0.21) too: not a reason.
    assert "sync_dp_state" not in said
    # Before the sync lane's V2 range: the sync lane's own refusal, unfetched.
    with pytest.raises(TargetError, match=r"0\.15-0\.17 API"):
        check_runner_lane_release("0.17.0")
    check_runner_lane_release("0.26.0")  # the oldest the lane drives


def _top_level(path: Path, name: str) -> bool:
    """Whether the file at ``path`` defines a top-level function ``name``."""
    import ast

    return any(
        isinstance(node, ast.FunctionDef) and node.name == name
        for node in ast.parse(path.read_text()).body
    )


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.20.0", "0.22.0", "0.25.0", "0.26.0"])
def test_the_refusals_before_the_runner_lane_name_what_the_release_lacks(
    version: str,
) -> None:
    """The pre-fetch refusal's facts, read off the release's own files (the
    lane's cache of it): what each release lacks is named, and nothing else."""
    package = cache_module.ensure_release(version, runner="v2", extra=wheel_prefixes())
    spec_decode = package / "v1/worker/gpu/spec_decode"
    lacks = {
        "no sort_batch_req_ids": not _top_level(
            package / "v1/worker/gpu/model_runner.py", "sort_batch_req_ids"
        ),
        "no SpeculatorCudaGraphManager": not any(
            "class SpeculatorCudaGraphManager" in path.read_text()
            for path in spec_decode.rglob("*.py")
        ),
        "no target-dependent autoregressive speculator": not (
            spec_decode / "autoregressive"
        ).is_dir(),
    }
    if not any(lacks.values()):
        check_runner_lane_release(version)
        assert version == "0.26.0"
        return
    with pytest.raises(TargetError) as refused:
        check_runner_lane_release(version)
    said = str(refused.value)
    assert {what: what in said for what in lacks} == lacks
    assert "sync_dp_state" not in said  # the engine drives either DP-state sync


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.29.0", "0.33.0", "0.34.0"])
def test_a_release_keeps_the_runner_lane_files(version: str) -> None:
    sources = RunnerSources.for_release(version)
    entry = cache_module.release_dir(version)
    manifest = json.loads((entry / cache_module.MANIFEST).read_text())
    # Each prefix extracted, itself or under a folder the fetch extracted.
    folders = tuple(p for p in manifest["wanted"] if p.endswith("/"))
    assert all(
        prefix in manifest["wanted"] or prefix.startswith(folders)
        for prefix in wheel_prefixes()
    )
    assert cache_module._extracted(entry, wheel_prefixes())
    for module in (
        "vllm.v1.engine.core",
        "vllm.v1.engine",
        "vllm.v1.worker.gpu_worker",
        "vllm.v1.worker.gpu.model_runner",
        "vllm.v1.core.sched.output",
        "vllm.v1.outputs",
        "vllm.config.parallel",
        "vllm.forward_context",
    ):
        assert sources.has(module), module
    renamed = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"
    assert sources.has(renamed) == (version != "0.29.0")
    # 0.34 put a new autoregressive package under it, with the graph manager.
    shared = "vllm.v1.worker.gpu.spec_decode.autoregressive.cudagraph_utils"
    assert sources.has(shared) == (version != "0.33.0")
