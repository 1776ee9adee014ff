"""The V1 runner's targets: real releases load and their coordination runs.

Each release below sits on one side of an API drift (see
``shared/research/V1_RUNNER.md``): 0.11.1 (the sync inside ``_prepare_inputs``,
a modelled caller), 0.12.0 (the caller method appears, ubatch slices), 0.13.0
(the cudagraph-mode row), 0.17.0 (no ``allow_dp_padding``), 0.20.0 (no
per-request counts), 0.33.0 (``skip_dp_coordination``).
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dpsim.errors import TargetError
from dpsim.records.case import RankBatch
from dpsim.records.policy import CudagraphMode, ManagerConfig, Microbatching
from dpsim.records.sync import Agreement
from dpsim.sim import simulate
from dpsim.targets import load_target
from dpsim.targets.v1.caller import CALLER_METHOD
from dpsim.targets.v1.load import V1Target

pytestmark = pytest.mark.release

SPREAD = ("0.11.1", "0.12.0", "0.13.0", "0.17.0", "0.20.0", "0.33.0")
#: Rows of the all-reduced tensor, per the release's own source.
ROWS = {"0.11.1": 4, "0.12.0": 4, "0.13.0": 5, "0.17.0": 4, "0.20.0": 4, "0.33.0": 4}
TABLE = ManagerConfig(
    capture_sizes=(1, 2, 4, 8, 16, 32),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=16,
)
#: Rank 0 decodes three requests (a FULL graph of 4 on its own), rank 1 runs
#: a 20-token mixed batch (a PIECEWISE graph of 32): the ranks must agree on 32.
BATCHES = (
    RankBatch(num_reqs=3, num_tokens=3, uniform_token_count=1, uniform_decode=True),
    RankBatch(num_reqs=2, num_tokens=20, max_query_len=12),
)


def _v1(version: str, **options: Any) -> V1Target:
    target = load_target(version, runner="v1", **options)
    assert isinstance(target, V1Target)
    return target


def _run(target: V1Target, batches: tuple[RankBatch, ...] = BATCHES) -> Any:
    table = target.build_manager(TABLE)

    def program(rank: int) -> Any:
        config = target.parallel_config(len(batches), rank, None)
        native, agreed = target.api.call(
            table, batches[rank], len(batches), rank, parallel_config=config
        )
        agreement = target.api.agreement(agreed)
        return [
            target.api.describe(native).to_json(),
            None if agreement is None else agreement.to_json(),
        ]

    return simulate(program, ranks=len(batches))


@pytest.mark.parametrize("version", SPREAD)
def test_a_v1_release_loads_and_two_ranks_agree_through_its_real_code(
    version: str,
) -> None:
    target = _v1(version)
    assert target.runner == "v1"
    assert target.label == f"vllm {version} (V1 runner)"
    assert target.caller_modelled == version.startswith("0.11")
    result = _run(target)
    assert result.outcome.value == "ok", [rank.error for rank in result.ranks]
    synced = None if version in ("0.11.1", "0.12.0") else CudagraphMode.PIECEWISE
    for trace in result.ranks:
        descriptor, agreement = trace.returned
        assert descriptor["cg_mode"] == "PIECEWISE"
        assert descriptor["num_tokens"] == 32
        assert Agreement.from_json(agreement) == Agreement(
            num_tokens_across_dp=(32, 32), cg_mode=synced, ubatch=False
        )
        [collective] = trace.collectives
        assert collective.group == "dp_device"
        assert collective.signature.shape == (ROWS[version], 2)
    assert target.api.tensor_rows == ROWS[version]


def test_one_rank_does_not_sync_and_agrees_nothing() -> None:
    target = _v1("0.33.0")
    table = target.build_manager(TABLE)
    config = target.parallel_config(1, 0, None)
    native, agreed = target.api.call(table, BATCHES[1], 1, 0, parallel_config=config)
    assert agreed is None and target.api.agreement(agreed) is None
    assert target.api.describe(native).num_tokens == 32


@pytest.mark.parametrize("version", ["0.12.0", "0.33.0"])
def test_an_eager_rank_next_to_a_graph_rank(version: str) -> None:
    # 0.12 pads the eager rank's peers to its unpadded count, then the peers'
    # re-dispatch pads past it and vLLM's own assertion fires; 0.13 and later
    # sync the mode (NONE wins), so nobody pads for DP: each rank runs eagerly
    # at its own count, and every rank agrees on those counts.
    batches = (
        RankBatch(num_reqs=3, num_tokens=3, uniform_token_count=1, uniform_decode=True),
        RankBatch(num_reqs=2, num_tokens=20, need_eager=True),
    )
    result = _run(_v1(version), batches)
    if version == "0.12.0":
        assert result.outcome.value == "crash"
        error = result.ranks[0].error
        assert error.type == "AssertionError"
        assert error.where.startswith("gpu_model_runner.py:")
        assert error.where.endswith(f"in {CALLER_METHOD}")
    else:
        assert result.outcome.value == "ok"
        modes = [trace.returned[0]["cg_mode"] for trace in result.ranks]
        counts = [trace.returned[0]["num_tokens"] for trace in result.ranks]
        agreed = [trace.returned[1]["num_tokens_across_dp"] for trace in result.ranks]
        assert (modes, counts, agreed) == (["NONE"] * 2, [4, 20], [[4, 20]] * 2)


def test_the_0_30_skip_switch_is_the_worlds_for_v1_too() -> None:
    target = _v1("0.33.0")
    assert target.skips_coordination
    table = target.build_manager(TABLE)

    def program(rank: int) -> Any:
        config = target.parallel_config(2, rank, None)
        _, agreed = target.api.call(
            table, BATCHES[rank], 2, rank, parallel_config=config
        )
        return list(target.api.agreement(agreed).num_tokens_across_dp)

    result = simulate(program, ranks=2, skip_dp_coordination=(0, 1))
    assert [trace.returned for trace in result.ranks] == [[4, 4], [32, 32]]
    assert all(trace.collectives == () for trace in result.ranks)
    assert not _v1("0.20.0").skips_coordination


def test_what_loaded_names_the_sync_the_caller_and_the_dispatcher() -> None:
    loaded = _v1("0.33.0").what_loaded()
    assert loaded["sync"]["entry"] == "coordinate_batch_across_dp"
    assert loaded["sync"]["parameters"][:2] == [
        "num_tokens_unpadded",
        "allow_microbatching",
    ]
    assert loaded["caller"]["method"] == f"GPUModelRunner.{CALLER_METHOD}"
    assert loaded["caller"]["lines"] == [3684, 3786]
    assert loaded["caller"]["not_modelled"] == []
    assert loaded["dispatcher"].startswith("CudagraphDispatcher (")
    assert loaded["group"] == "get_dp_group().device_group"
    assert _v1("0.11.1").what_loaded()["caller"] == "modelled"


def _with_line_in_caller(tmp_path: Path, version: str, line: str) -> tuple[Path, int]:
    """The release's gpu_model_runner.py with ``line`` first in the caller
    method, and the line number it lands on."""
    source = _v1(version).caller
    assert source is not None
    text = source.path.read_text()
    tree = ast.parse(text)
    method = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == CALLER_METHOD
    )
    first = method.body[0].lineno
    lines = text.splitlines(keepends=True)
    indent = " " * method.body[0].col_offset
    lines.insert(first - 1, f"{indent}{line}\n")
    derived = tmp_path / "gpu_model_runner.py"
    derived.write_text("".join(lines))
    return derived, first


@pytest.mark.parametrize(
    ("read", "named"),
    [
        ("self.made_up_attribute", "made_up_attribute"),
        ("self.model_config.made_up", "model_config.made_up"),
    ],
)
def test_the_stand_in_self_refuses_what_it_was_not_written_for(
    tmp_path: Path, read: str, named: str
) -> None:
    derived, line = _with_line_in_caller(tmp_path, "0.33.0", f"_ = {read}")
    target = _v1("0.33.0", caller_file=derived)
    assert target.label.endswith("with caller gpu_model_runner.py (V1 runner)")
    assert target.what_loaded()["caller"]["not_modelled"] == [named]
    table = target.build_manager(TABLE)
    config = target.parallel_config(1, 0, None)
    with pytest.raises(AttributeError) as refused:
        target.api.call(table, BATCHES[0], 1, 0, parallel_config=config)
    assert str(refused.value) == (
        f"dpsim's stand-in for GPUModelRunner has no attribute {named} (vLLM "
        f"0.33.0 reads it in GPUModelRunner.{CALLER_METHOD}, "
        f"gpu_model_runner.py:{line})"
    )


def test_a_caller_file_without_the_caller_method_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "gpu_model_runner.py"
    other.write_text("class GPUModelRunner:\n    pass\n")
    with pytest.raises(TargetError, match=f"GPUModelRunner has no {CALLER_METHOD}"):
        _v1("0.33.0", caller_file=other)


def test_a_v1_target_file_replaces_the_releases_sync(tmp_path: Path) -> None:
    # The release's own file, with its padding decision inverted: the ranks
    # then run unpadded (rank 0 on its graph of 4, rank 1 on its 32).
    real = Path(_v1("0.33.0").dp_utils.__file__ or "")
    text = real.read_text()
    assert text.count("should_dp_pad = synced_cudagraph_mode != 0 or") == 1
    mutant = tmp_path / "dp_utils.py"
    mutant.write_text(
        text.replace(
            "should_dp_pad = synced_cudagraph_mode != 0 or",
            "should_dp_pad = synced_cudagraph_mode == 0 and",
        )
    )
    target = load_target("0.33.0", mutant)
    assert target.runner == "v1"
    result = _run(target)
    assert result.outcome.value == "ok"
    counts = [trace.returned[0]["num_tokens"] for trace in result.ranks]
    agreed = [trace.returned[1]["num_tokens_across_dp"] for trace in result.ranks]
    assert (counts, agreed) == ([4, 32], [[4, 32]] * 2)


def test_a_tree_without_v1s_sync_is_refused_for_v1(tmp_path: Path) -> None:
    (tmp_path / "vllm" / "v1" / "worker" / "gpu").mkdir(parents=True)
    (tmp_path / "vllm" / "v1" / "worker" / "gpu" / "dp_utils.py").write_text(
        "def dispatch_cg_and_sync_dp(m, n):\n    pass\n"
    )
    with pytest.raises(TargetError, match="the V1 runner's DP sync is not there"):
        load_target(str(tmp_path), runner="v1")


def test_the_dispatchers_config_view_refuses_what_it_was_not_written_for(
    tmp_path: Path,
) -> None:
    # A tree copied from the release, its dispatcher reading one more setting.
    release = _v1("0.33.0")
    tree = tmp_path / "vllm"
    shutil.copytree(release.package_dir, tree)
    dispatcher = tree / "v1" / "cudagraph_dispatcher.py"
    text = dispatcher.read_text()
    anchor = "        self.compilation_config = vllm_config.compilation_config\n"
    assert text.count(anchor) == 1
    dispatcher.write_text(
        text.replace(anchor, f"{anchor}        _ = vllm_config.made_up_setting\n")
    )
    line = text[: text.index(anchor)].count("\n") + 2
    target = _v1(str(tmp_path))
    assert target.version == "0.33.0"
    with pytest.raises(AttributeError) as refused:
        target.build_manager(TABLE)
    assert str(refused.value) == (
        "dpsim's stand-in for VllmConfig (as the V1 CudagraphDispatcher reads it) "
        f"has no attribute made_up_setting (vLLM reads it at "
        f"cudagraph_dispatcher.py:{line})"
    )


@pytest.mark.parametrize(
    ("version", "agreed"),
    [("0.11.1", [20, 20]), ("0.12.0", [20, 20]), ("0.33.0", [3, 20])],
)
def test_a_profile_run_is_eager_everywhere_and_pads_only_before_0_13(
    version: str, agreed: list[int]
) -> None:
    # Up to 0.12 DP padding follows the compilation config, not the step's
    # mode (0.11.x: the modelled _dummy_run; 0.12: the real caller); from 0.13
    # the synced runtime mode NONE turns it off.
    batches = tuple(
        RankBatch(num_reqs=1, num_tokens=count, need_eager=True, kind="profile")
        for count in (3, 20)
    )
    result = _run(_v1(version), batches)
    assert result.outcome.value == "ok", [rank.error for rank in result.ranks]
    for rank, trace in enumerate(result.ranks):
        descriptor, agreement = trace.returned
        assert descriptor["cg_mode"] == "NONE"
        assert descriptor["num_tokens"] == agreed[rank]
        assert agreement["num_tokens_across_dp"] == agreed


@pytest.mark.parametrize("version", ["0.11.1", "0.12.0", "0.33.0"])
def test_microbatching_is_agreed_by_every_rank_or_by_none(version: str) -> None:
    target = _v1(version)
    ubatch = Microbatching(2, decode_token_threshold=4, prefill_token_threshold=16)
    table = target.build_manager(replace(TABLE, microbatching=ubatch))
    decode = RankBatch(
        num_reqs=8,
        num_tokens=8,
        uniform_token_count=1,
        uniform_decode=True,
        allow_ubatching=True,
    )
    small = RankBatch(num_reqs=2, num_tokens=3, allow_ubatching=True)
    for batches, split in (((decode, decode), 2), ((decode, small), 1)):

        def program(rank: int, batches: tuple[RankBatch, ...] = batches) -> Any:
            config = target.parallel_config(2, rank, ubatch)
            native, agreed = target.api.call(
                table, batches[rank], 2, rank, parallel_config=config
            )
            return [
                target.api.describe(native).num_ubatches,
                target.api.agreement(agreed).ubatch,
            ]

        result = simulate(program, ranks=2)
        assert [trace.returned for trace in result.ranks] == [[split, split > 1]] * 2


@pytest.mark.parametrize(
    ("version", "mode", "sizes"),
    [
        ("0.12.0", "FULL_AND_PIECEWISE", [2, 4, 6, 8]),
        ("0.12.0", "FULL", [1, 2, 3, 5, 8]),  # one routine: 0.11-0.19 keep them
        ("0.33.0", "FULL", [2, 4, 6, 8]),  # 0.20 rounds for any FULL decode
        ("0.33.0", "PIECEWISE", [1, 2, 3, 5, 8]),
    ],
)
def test_capture_sizes_are_rounded_for_spec_decode_where_the_release_does(
    version: str, mode: str, sizes: list[int]
) -> None:
    table = ManagerConfig(
        capture_sizes=(1, 2, 3, 5, 8),
        cudagraph_mode=mode,
        max_num_seqs=8,
        decode_query_len=2,
    )
    dispatcher = _v1(version).build_manager(table)
    assert dispatcher.compilation_config.cudagraph_capture_sizes == sizes
