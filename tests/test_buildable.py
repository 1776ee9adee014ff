"""dpsim.targets.buildable: the tables a release's own config code builds.

Unit tests run against hand-written config files in a throwaway package
directory (no vLLM code); the release tests read the cached releases.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dpsim.errors import TargetError
from dpsim.records.policy import Microbatching
from dpsim.targets.buildable import captured_lora_counts, rules_for

#: A ParallelConfig with one threshold rule, written for these tests.
_PARALLEL = """
class ParallelConfig:
    def validate(self):
        if self.use_ubatching and (
            min(self.dbo_decode_token_threshold, self.dbo_prefill_token_threshold)
            < self.num_ubatches
        ):
            raise ValueError("thresholds below the microbatch count")
        if self.data_parallel_size < 1:
            raise ValueError("unrelated: not about thresholds")
"""

#: LoRA cases as a release's lora_utils states them, written for these tests.
_LORA_UTILS = """
from vllm.lora.utils import get_captured_lora_counts

def get_lora_capture_cases(lora_config, compilation_config):
    if lora_config is None:
        return [0]
    if compilation_config.cudagraph_specialize_lora:
        counts = get_captured_lora_counts(
            lora_config.max_loras, lora_config.specialize_active_lora
        )
        return [0, *counts]
    return [0, lora_config.max_loras + 1]

def get_num_active_loras_for_dispatch(lora_config, lora_state, req_ids, dummy_run):
    return lora_config.max_loras + 1 if dummy_run else 0
"""


#: Speculators as a release writes their manager calls, written for these tests.
_SPECULATOR = """
class Speculator:
    def __init__(self, config, device, mode, steps):
        self.prefill = SpeculatorCudaGraphManager(config, device, mode, steps + 1)
        self.decode = SpeculatorCudaGraphManager(
            config, device, mode, decode_query_len=1
        )
"""
_PARAMETERS = ("vllm_config", "device", "cudagraph_mode", "decode_query_len")


class _Manager:
    def __init__(
        self,
        vllm_config,
        device,
        cudagraph_mode,
        decode_query_len,
        lora_capture_cases=None,
        varlen_decode=False,
        ubatch_runner=None,
    ) -> None: ...


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "vllm"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_captured_lora_counts_follow_vllms_documented_rule() -> None:
    assert captured_lora_counts(4, specialize=False) == [5]
    assert captured_lora_counts(4, specialize=True) == [1, 2, 4, 5]
    assert captured_lora_counts(3, specialize=True) == [1, 2, 4]
    assert captured_lora_counts(8, specialize=True) == [1, 2, 4, 8, 9]


def test_threshold_rules_come_from_the_releases_parallel_config(
    tmp_path: Path,
) -> None:
    rules = rules_for(_package(tmp_path, {"config/parallel.py": _PARALLEL}), None)
    assert len(rules.threshold_checks) == 1
    assert not rules.accepts_thresholds(Microbatching(2, 0, 512))
    assert rules.accepts_thresholds(Microbatching(2, 2, 512))
    assert rules.fit_thresholds(Microbatching(3, 0, 1)) == Microbatching(3, 3, 3)
    assert rules.fit_thresholds(Microbatching(2, 32, 512)) == Microbatching(2, 32, 512)


def test_without_the_rule_a_release_builds_thresholds_of_zero(tmp_path: Path) -> None:
    rules = rules_for(_package(tmp_path, {"config/parallel.py": "x = 1\n"}), None)
    assert rules.threshold_checks == ()
    assert rules.fit_thresholds(Microbatching(2, 0, 0)) == Microbatching(2, 0, 0)


def test_a_threshold_rule_dpsim_cannot_evaluate_is_refused(tmp_path: Path) -> None:
    odd = _PARALLEL.replace("< self.num_ubatches", "< current_platform.floor")
    with pytest.raises(TargetError, match=r"parallel\.py:\d+: cannot evaluate") as err:
        rules_for(_package(tmp_path, {"config/parallel.py": odd}), None)
    assert "\n" not in str(err.value)


def test_lora_cases_are_the_releases_own(tmp_path: Path) -> None:
    rules = rules_for(
        _package(tmp_path, {"v1/worker/gpu/lora_utils.py": _LORA_UTILS}), None
    )
    assert rules.lora_cases(4, True, True) == (0, 1, 2, 4, 5)
    assert rules.lora_cases(4, True, False) == (0, 5)
    assert rules.lora_cases(4, False, True) == (0, 5)
    assert rules.max_loras((0, 1, 2, 4, 8, 9)) == 8
    assert rules.max_loras((1,)) is None
    assert rules.dummy_batch_loras((0, 5)) == 5
    # A table no configuration gives (a --policy file): no LoRA for the dummy.
    assert rules.dummy_batch_loras((1,)) == 0


def test_without_lora_utils_there_are_no_lora_cases(tmp_path: Path) -> None:
    rules = rules_for(_package(tmp_path, {}), None)
    assert rules.lora_cases(4, True, True) is None
    assert rules.dummy_batch_loras((0, 5)) == 0


def test_drafter_tables_get_only_what_the_speculators_pass(tmp_path: Path) -> None:
    from dpsim.records.policy import CapturePolicy

    spec = {"v1/worker/gpu/spec_decode/ar/speculator.py": _SPECULATOR}
    rules = rules_for(_package(tmp_path, spec), None, _Manager)
    assert rules.drafter_arguments == frozenset(_PARAMETERS)
    drafter = CapturePolicy(
        capture_sizes=(1, 2),
        lora_capture_cases=(0, 5),
        varlen_decode=True,
        microbatching=Microbatching(),
    )
    assert rules.drafter_table(drafter) == CapturePolicy(capture_sizes=(1, 2))


def test_a_speculator_call_that_hides_its_arguments_keeps_the_drafter(
    tmp_path: Path,
) -> None:
    from dpsim.records.policy import CapturePolicy

    hidden = _SPECULATOR.replace("mode, steps + 1)", "*arguments)")
    spec = {"v1/worker/gpu/spec_decode/ar/speculator.py": hidden}
    rules = rules_for(_package(tmp_path, spec), None, _Manager)
    assert rules.drafter_arguments is None
    drafter = CapturePolicy(capture_sizes=(1,), lora_capture_cases=(0, 5))
    assert rules.drafter_table(drafter) == drafter


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.29.0", "0.30.0", "0.33.0"])
def test_releases_rules(version: str, release) -> None:
    from dpsim.targets.buildable import rules_of

    rules = rules_of(release(version))
    assert rules.lora_cases(8, True, True) == (0, 1, 2, 4, 8, 9)
    assert rules.dummy_batch_loras((0, 9)) == 9
    # The threshold check came with microbatched graphs (0.30).
    assert rules.accepts_thresholds(Microbatching(2, 0, 0)) == (version == "0.29.0")
    # post_init_cudagraph_sizes pins the ceiling to the largest size.
    assert rules.accepts_ceiling((1, 2, 4), 4)
    assert not rules.accepts_ceiling((1, 2, 4), 3)
    assert not rules.accepts_ceiling((1, 2, 4), 8)
    # No speculator passes LoRA cases, varlen decode or a ubatch runner.
    assert rules.drafter_arguments is not None
    assert not rules.drafter_arguments & {
        "lora_capture_cases",
        "varlen_decode",
        "ubatch_runner",
    }


@pytest.mark.release
def test_the_false_alarms_policy_is_named_unbuildable(release) -> None:
    from dpsim.records.policy import CapturePolicy
    from dpsim.targets.buildable import rules_of

    rules = rules_of(release("0.33.0"))
    # The policy of the no-hang false alarm that the caller profile once drew.
    alarm = CapturePolicy(
        capture_sizes=(1, 3),
        cudagraph_mode="FULL_DECODE_ONLY",
        max_num_seqs=1,
        decode_query_len=2,
        lora_capture_cases=(1,),
        microbatching=Microbatching(2, 0, 0),
    )
    assert rules.unbuildable(alarm) == "LoRA cases [1] are no LoRA configuration's"
    fixed_lora = CapturePolicy(
        capture_sizes=(1, 3),
        lora_capture_cases=(0, 1, 2),
        microbatching=Microbatching(2, 0, 0),
    )
    assert rules.unbuildable(fixed_lora) == (
        "microbatching thresholds 0/0 are refused by ParallelConfig for 2 microbatches"
    )
    tight = CapturePolicy(capture_sizes=(1, 3), max_capture_size=2)
    assert "max_capture_size 2 is not the largest" in str(rules.unbuildable(tight))
    drafted = CapturePolicy(
        capture_sizes=(1,),
        decode_query_len=2,
        drafter=CapturePolicy(capture_sizes=(1,), lora_capture_cases=(0, 2)),
    )
    assert str(rules.unbuildable(drafted)).startswith("drafter has LoRA cases")
    assert rules.unbuildable(CapturePolicy(capture_sizes=(1, 3))) is None
