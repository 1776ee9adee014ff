"""The loader: releases, trees and files; the shim; the adapters; bad input."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed

from dpsim.cli import main
from dpsim.errors import TargetError
from dpsim.records.case import SyncInputs
from dpsim.records.policy import ManagerConfig
from dpsim.targets import cache as cache_module
from dpsim.targets import load as load_module
from dpsim.targets import load_target, runtime
from dpsim.targets.adapters import DISPATCH_AND_SYNC, SYNC_ONLY, describe, dispatch

pytestmark = pytest.mark.release

#: What DESIGN.md's table says each release's API looks like.
EXPECTED_API = {
    "0.18.0": (SYNC_ONLY, 3, None, "torch.distributed.all_reduce"),
    "0.20.0": (DISPATCH_AND_SYNC, 3, None, "torch.distributed.all_reduce"),
    "0.28.0": (DISPATCH_AND_SYNC, 4, None, "torch.distributed.all_reduce"),
    "0.29.0": (DISPATCH_AND_SYNC, 4, "dp_sync", "torch.distributed.all_reduce"),
    "0.30.0": (DISPATCH_AND_SYNC, 6, "dp_sync", "torch.distributed.all_reduce"),
    "0.32.0": (DISPATCH_AND_SYNC, 6, "dp_sync_state", "torch.distributed.all_reduce"),
    "0.33.0": (
        DISPATCH_AND_SYNC,
        7,
        "dp_sync_state",
        "get_dp_group().cpu_all_reduce_",
    ),
}
SMALL_TABLE = ManagerConfig(
    capture_sizes=(1, 2, 4, 8, 16),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=8,
)


@pytest.mark.parametrize("version", sorted(EXPECTED_API))
def test_each_release_loads_and_is_adapted_by_introspection(version: str) -> None:
    target = load_target(version)
    entry, rows, reuse, collective = EXPECTED_API[version]
    assert target.version == version
    assert target.api.entry == entry
    assert target.api.tensor_rows == rows
    assert target.api.reuse_parameter == reuse
    assert target.api.collective.startswith(collective)
    assert {loaded.module for loaded in target.files} >= {
        "vllm.v1.worker.gpu.dp_utils",
        "vllm.v1.worker.gpu.cudagraph_utils",
        "vllm.config.compilation",
    }


@pytest.mark.parametrize("version", sorted(EXPECTED_API))
def test_real_manager_dispatches_to_a_covering_graph(version: str) -> None:
    target = load_target(version)
    manager = target.build_manager(SMALL_TABLE)
    chosen = describe(dispatch(manager, 3, 5))
    assert chosen.cg_mode == "PIECEWISE"
    assert chosen.num_tokens == 8
    too_big = describe(dispatch(manager, 3, 17))
    assert too_big.cg_mode == "NONE"
    assert too_big.num_tokens == 17


def test_dp_size_one_runs_without_any_collective() -> None:
    target = load_target("0.29.0")
    manager = target.build_manager(SMALL_TABLE)
    descriptor, agreement = target.api.call(
        manager, SyncInputs(num_reqs=2, num_tokens=3), dp_size=1, dp_rank=0
    )
    assert agreement is None
    assert describe(descriptor).num_tokens == 4


def test_dp_sync_outside_any_world_refuses_clearly() -> None:
    target = load_target("0.29.0")
    manager = target.build_manager(SMALL_TABLE)
    with pytest.raises(runtime.NoDPGroupError, match="outside a run"):
        target.api.call(manager, SyncInputs(2, 3), dp_size=2, dp_rank=0)


def test_versions_load_side_by_side_and_leave_the_interpreter_as_it_was() -> None:
    modules_before = set(sys.modules)
    all_reduce_before = torch.distributed.all_reduce
    old = load_target("0.20.0")
    new = load_target("0.33.0")
    assert old.CUDAGraphMode is not new.CUDAGraphMode
    assert old.BatchExecutionDescriptor is not new.BatchExecutionDescriptor
    assert "num_ubatches" in new.api.descriptor_fields
    assert "num_ubatches" not in old.api.descriptor_fields
    # Each keeps working with its own classes after the other loaded.
    assert describe(dispatch(old.build_manager(SMALL_TABLE), 1, 1)).num_tokens == 1
    assert describe(dispatch(new.build_manager(SMALL_TABLE), 1, 3)).num_tokens == 4
    assert not {name for name in set(sys.modules) - modules_before if "vllm" in name}
    assert torch.distributed.all_reduce is all_reduce_before
    assert runtime.current() is runtime.NO_WORLD


def test_a_single_file_runs_against_a_release(
    tmp_path: Path, release_file: Callable[[str, str], Path]
) -> None:
    # Derived at test time from the cached release; never committed.
    original = release_file("0.29.0", "v1/worker/gpu/dp_utils.py")
    copy = tmp_path / "my_dp_utils.py"
    shutil.copy(original, copy)
    target = load_target("0.29.0", copy)
    assert target.label == "my_dp_utils.py on vllm 0.29.0"
    assert target.files[0].path == str(copy)
    assert target.api.entry == DISPATCH_AND_SYNC
    # Editing the file is seen on the next load, not served from memory.
    copy.write_text(copy.read_text().replace("torch.zeros(4,", "torch.zeros(5,"))
    assert load_target("0.29.0", copy).api.tensor_rows == 5


def test_a_source_tree_and_an_installed_package_dir_load(
    tmp_path: Path, release_file: Callable[[str, str], Path]
) -> None:
    package = release_file("0.29.0", "")
    tree = tmp_path / "checkout"
    shutil.copytree(package, tree / "vllm")
    (tree / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.29.0.dev7'\n"
    )
    (tree / "vllm" / "__init__.py").write_text("")
    from_tree = load_target(str(tree))
    assert from_tree.version == "0.29.0.dev7"
    from_package_dir = load_target(str(tree / "vllm"))
    assert from_package_dir.api.entry == DISPATCH_AND_SYNC
    assert from_package_dir is not load_target("0.29.0")


def test_loaded_loops_tick_the_installed_world(
    write_module: Callable[..., Path],
) -> None:
    looping = write_module(
        "dp_utils_looping.py",
        """
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

        def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens,
                                    uniform_token_count, dp_size, dp_rank):
            for _ in range(3):
                pass
            return cudagraph_manager.dispatch(num_reqs, num_tokens, None), None
        """,
    )
    target = load_target("0.20.0", looping)

    class CountingWorld(runtime.NoWorld):
        ticks = 0

        def tick(self) -> None:
            CountingWorld.ticks += 1

    manager = target.build_manager(SMALL_TABLE)
    with runtime.installed(CountingWorld()):
        target.api.call(manager, SyncInputs(1, 1), dp_size=2, dp_rank=0)
    # Three in the target's loop, plus the real manager's own candidate loop.
    assert CountingWorld.ticks >= 3


def test_targets_command_prints_each_api(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets", "0.29.0", "0.33.0"]) == 0
    out = capsys.readouterr().out
    assert "vllm 0.29.0" in out and "dp_sync)" in out
    assert "vllm 0.33.0" in out and "cpu_all_reduce_" in out
    assert main(["targets", "--json", "0.30.0"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["tensor_rows"] == 6
    assert "allow_ubatching" in described["features"]


# -- bad input -----------------------------------------------------------------


def test_unknown_release_is_one_line_exit_2_and_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path))
    assert main(["targets", "0.99.7"]) == 2
    error_lines = [
        line for line in capsys.readouterr().err.splitlines() if "error" in line
    ]
    assert (
        error_lines
        == [
            "dpsim: error: vllm 0.99.7 is not a release on the package index "
            "(newest there: 0.33.0)"
        ]
        or "not a release" in error_lines[0]
    )
    assert _entries(tmp_path) == []


def test_no_network_and_no_cache_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path))
    # An index on a closed loopback port and no other source: as offline.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    assert main(["targets", "0.28.0"]) == 2
    err = capsys.readouterr().err
    assert "cannot fetch vllm 0.28.0" in err
    assert "not in the dpsim cache" in err
    assert _entries(tmp_path) == []


def test_an_interrupted_fetch_leaves_no_entry_that_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/v1/worker/gpu/dp_utils.py", "X = 1\n")
        archive.writestr("vllm/v1/worker/gpu/cudagraph_utils.py", "Y = 2\n")

    def fake_download(version: str, into: Path) -> Path:
        return Path(shutil.copy(wheel, into))

    def interrupted_extract(
        wheel_path: Path, into: Path, wanted: tuple[str, ...]
    ) -> dict[str, str]:
        (into / "vllm").mkdir()
        (into / "vllm" / "partial.py").write_text("half")
        raise KeyboardInterrupt

    cache = tmp_path / "cache"
    monkeypatch.setattr(cache_module, "_download", fake_download)
    monkeypatch.setattr(cache_module, "_extract", interrupted_extract)
    with pytest.raises(KeyboardInterrupt):
        cache_module.ensure_release("9.9.9", cache)
    assert _entries(cache) == []
    assert cache_module.cached_releases(cache) == []

    monkeypatch.undo()
    monkeypatch.setattr(cache_module, "_download", fake_download)
    package = cache_module.ensure_release("9.9.9", cache)
    assert (package / "v1" / "worker" / "gpu" / "dp_utils.py").read_text() == "X = 1\n"
    assert cache_module.cached_releases(cache) == ["9.9.9"]
    manifest = json.loads((package.parent / cache_module.MANIFEST).read_text())
    assert set(manifest["files"]) == {
        "vllm/v1/worker/gpu/dp_utils.py",
        "vllm/v1/worker/gpu/cudagraph_utils.py",
    }
    assert not list(cache.joinpath("releases").glob("vllm-9.9.9/*.whl"))


def test_a_wheel_without_dp_utils_is_refused_and_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "vllm-0.99.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/config/compilation.py", "Z = 3\n")
    monkeypatch.setattr(
        cache_module, "_download", lambda version, into: Path(shutil.copy(wheel, into))
    )
    with pytest.raises(TargetError, match=r"has no vllm/v1/worker/gpu/dp_utils\.py"):
        cache_module.ensure_release("0.99.1", tmp_path / "cache")
    assert _entries(tmp_path / "cache") == []


def test_a_file_that_is_not_a_dp_utils_module_is_refused(
    write_module: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_module("other.py", "def helper():\n    return 1\n")
    assert main(["targets", "--target", str(other), "--vllm", "0.29.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("not a vLLM dp_utils module")
    assert len(err.splitlines()) == 1


def test_a_file_that_does_not_parse_names_its_line(
    write_module: Callable[..., Path],
) -> None:
    broken = write_module("broken.py", "def dispatch_cg_and_sync_dp(:\n")
    with pytest.raises(TargetError, match=r"broken.py:1: cannot parse"):
        load_target("0.29.0", broken)


def test_an_api_no_adapter_supports_is_refused(
    write_module: Callable[..., Path],
) -> None:
    legacy = write_module(
        "legacy.py",
        "def get_cudagraph_and_dp_padding(num_tokens, dp_size, dp_rank):\n"
        "    return num_tokens, None\n",
    )
    with pytest.raises(TargetError, match=r"0\.15-0\.17 API"):
        load_target("0.29.0", legacy)
    odd = write_module(
        "odd.py",
        "def dispatch_cg_and_sync_dp(manager, tokens):\n    return None, None\n",
    )
    with pytest.raises(TargetError, match="signature no dpsim adapter supports"):
        load_target("0.29.0", odd)


def test_a_real_legacy_release_is_refused_with_the_reason() -> None:
    # Refused by version, before its cache entry (or the index) is consulted;
    # 0.17 has only the V1 runner's sync, which is what it loads by default.
    with pytest.raises(TargetError, match=r"0\.15-0\.17 API"):
        load_target("0.17.0", runner="v2")


def test_a_path_that_is_neither_release_nor_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="neither a vLLM release"):
        load_target(str(tmp_path / "missing"))
    with pytest.raises(TargetError, match="not a vLLM source tree"):
        load_target(str(tmp_path))


def _entries(cache: Path) -> list[str]:
    releases = cache / "releases"
    if not releases.exists():
        return []
    return sorted(p.name for p in releases.iterdir() if not p.name.endswith(".lock"))


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("X = 1\nreturn X\n", "'return' outside function"),
        ("X = 1\nnonlocal Y\n", "nonlocal declaration not allowed at module level"),
        ("yield 1\n", "'yield' outside function"),
    ],
)
def test_a_file_that_parses_but_does_not_compile_is_one_line(
    source: str,
    reason: str,
    write_module: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = write_module("dp_utils.py", source)
    line = source.count("\n")
    assert main(["targets", "--target", str(broken), "--vllm", "0.29.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dpsim: error: {broken}:{line}: cannot compile ({reason}")
    assert len(err.splitlines()) == 1


def test_an_edited_release_in_the_cache_never_runs_under_its_name(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    release_file: Callable[[str, str], Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    real_entry = release_file("0.29.0", "").parent
    copy = tmp_path / "cache" / "releases" / real_entry.name
    shutil.copytree(real_entry, copy)
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_module, "_download", _no_download)
    assert load_target("0.29.0").package_dir == copy / "vllm"
    # One real line changed: a bug planted in the release's own file.
    dp_utils = copy / "vllm" / "v1" / "worker" / "gpu" / "dp_utils.py"
    dp_utils.write_text(
        dp_utils.read_text().replace("torch.zeros(4,", "torch.zeros(5,")
    )
    # A fresh process: what this one loaded before is memoised.
    monkeypatch.setattr(load_module, "_loaded", {})
    assert main(["targets", "0.29.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "dpsim: error: the cached vllm 0.29.0 is damaged "
        "(vllm/v1/worker/gpu/dp_utils.py differs from the release: not the "
        "manifest's SHA-256) and will not run under that name; repair it with "
        f"`dpsim targets --refetch 0.29.0` or remove {copy}"
    )


def _no_download(version: str, into: Path) -> Path:
    raise AssertionError(f"vllm {version} must not be downloaded here")


def test_a_tree_whose_lenient_module_does_not_compile_is_refused(
    tmp_path: Path, release_file: Callable[[str, str], Path]
) -> None:
    # Lenient loading forgives missing dependencies, not a file that is no module.
    tree = tmp_path / "checkout"
    shutil.copytree(release_file("0.29.0", ""), tree / "vllm")
    compilation = tree / "vllm" / "config" / "compilation.py"
    source = compilation.read_text()
    compilation.write_text(source + "return None\n")
    line = source.count("\n") + 1
    with pytest.raises(TargetError) as refused:
        load_target(str(tree))
    assert str(refused.value) == (
        f"{compilation}:{line}: cannot compile ('return' outside function)"
    )


def test_a_module_that_exits_while_loading_is_one_line_not_the_end_of_dpsim(
    tmp_path: Path,
    release_file: Callable[[str, str], Path],
    write_module: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The file under test (run strictly), and a lenient module of a tree.
    exits = write_module("dp_utils.py", "import sys\nsys.exit(0)\n")
    assert main(["targets", "--target", str(exits), "--vllm", "0.29.0"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"dpsim: error: {exits}:2: raised SystemExit(0) while loading: "
        "dpsim cannot run it"
    )
    tree = tmp_path / "checkout"
    shutil.copytree(release_file("0.29.0", ""), tree / "vllm")
    compilation = tree / "vllm" / "config" / "compilation.py"
    source = compilation.read_text()
    compilation.write_text(source + "raise SystemExit(3)\n")
    with pytest.raises(TargetError) as refused:
        load_target(str(tree))
    line = source.count("\n") + 1
    assert str(refused.value) == (
        f"{compilation}:{line}: raised SystemExit(3) while loading: dpsim cannot run it"
    )
