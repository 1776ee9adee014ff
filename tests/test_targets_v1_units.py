"""The V1 targets layer's own logic, with no release: stand-ins, the mapping
of a rank's batch to the caller's arguments, LoRA settings, refusals."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dpsim.errors import TargetError
from dpsim.records.case import RankBatch
from dpsim.targets import cache as cache_module
from dpsim.targets import load_target
from dpsim.targets.v1.api import request_counts
from dpsim.targets.v1.dispatcher import lora_capture_cases, lora_settings
from dpsim.targets.v1.strict import StrictView, view_of_paths


def test_a_strict_view_answers_its_paths_and_names_any_other() -> None:
    view = view_of_paths(
        "GPUModelRunner",
        {("a",): 1, ("b", "c"): {1: None}, ("b", "d", "e"): 3},
        where=lambda dotted: f"read at {dotted}",
    )
    assert (view.a, view.b.c, view.b.d.e) == (1, {1: None}, 3)
    with pytest.raises(AttributeError) as refused:
        _ = view.b.d.f
    assert str(refused.value) == (
        "dpsim's stand-in for GPUModelRunner has no attribute b.d.f (read at b.d.f)"
    )
    with pytest.raises(AttributeError, match=r"read-only \(vLLM set b\.x\)"):
        view.b.x = 1


def test_a_path_cannot_be_both_a_value_and_a_view() -> None:
    with pytest.raises(ValueError, match="a is both"):
        view_of_paths("X", {("a",): 1, ("a", "b"): 2})


def test_a_bare_strict_view_says_nothing_about_where() -> None:
    with pytest.raises(AttributeError) as refused:
        _ = StrictView("VllmConfig", {}).lora_config
    assert str(refused.value) == (
        "dpsim's stand-in for VllmConfig has no attribute lora_config"
    )


@pytest.mark.parametrize(
    ("batch", "counts"),
    [
        (RankBatch(num_reqs=3, num_tokens=6, uniform_token_count=2), [2, 2, 2]),
        (RankBatch(num_reqs=3, num_tokens=20, max_query_len=12), [12, 4, 4]),
        (RankBatch(num_reqs=3, num_tokens=21, max_query_len=12), [12, 4, 5]),
        (RankBatch(num_reqs=3, num_tokens=10), [3, 3, 4]),
        (RankBatch(num_reqs=1, num_tokens=7, max_query_len=7), [7]),
        (RankBatch(num_reqs=0, num_tokens=0), []),
    ],
)
def test_a_batch_becomes_per_request_counts_as_vllm_would_schedule_them(
    batch: RankBatch, counts: list[int]
) -> None:
    assert request_counts(batch) == counts
    assert sum(counts) == batch.num_tokens


@pytest.mark.parametrize(
    ("cases", "settings"),
    [
        (None, None),
        ((0,), None),
        ((0, 1, 2, 3), (2, True, True)),
        ((0, 5), (4, True, False)),
        ((3,), (2, False, False)),
    ],
)
def test_lora_cases_map_to_the_settings_that_make_vllm_capture_them(
    cases: tuple[int, ...] | None, settings: tuple[int, bool, bool] | None
) -> None:
    assert lora_settings(cases) == settings


@pytest.mark.parametrize(
    ("version", "runner"), [("0.11.0", "v1"), ("0.10.2", None), ("0.17.0", "v2")]
)
def test_a_release_no_runner_supports_is_refused_before_any_fetch(
    version: str,
    runner: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DPSIM_CACHE", str(tmp_path / "cache"))

    def no_download(version: str, into: Path) -> Path:
        raise AssertionError("downloaded")

    monkeypatch.setattr(cache_module, "_download", no_download)
    with pytest.raises(TargetError, match="refused without fetching it"):
        load_target(version, runner=runner)
    assert not (tmp_path / "cache").exists()


class _DispatcherWithItsOwnRule:
    """Reads what 0.16+'s ``_get_lora_cases`` reads, and answers from it."""

    def _get_lora_cases(self) -> list[int]:
        config = self.vllm_config.lora_config  # type: ignore[attr-defined]
        counts = [1, 2, config.max_loras + 1] if self.specialize_lora_count else []  # type: ignore[attr-defined]
        counts = counts or [config.max_loras + 1]
        specialize = self.compilation_config.cudagraph_specialize_lora  # type: ignore[attr-defined]
        return [0, *counts] if specialize else counts


class _DispatcherWithTheRuleInline:
    pass


def _lora(max_loras: int, active: bool) -> Any:
    return SimpleNamespace(max_loras=max_loras, specialize_active_lora=active)


def _graphs(specialize: bool) -> Any:
    return SimpleNamespace(cudagraph_specialize_lora=specialize)


def test_v1_lora_cases_come_from_the_dispatchers_own_rule_where_it_has_one() -> None:
    cases = lora_capture_cases(_DispatcherWithItsOwnRule)
    assert cases(_lora(2, True), _graphs(True)) == [0, 1, 2, 3]
    assert cases(_lora(2, False), _graphs(False)) == [3]
    # What the caller profile draws reads back as the configuration it came from.
    assert lora_settings(tuple(cases(_lora(2, True), _graphs(True)))) == (2, True, True)


def test_v1_lora_cases_before_0_16_are_lora_or_not_in_lora_settings_encoding() -> None:
    cases = lora_capture_cases(_DispatcherWithTheRuleInline)
    assert cases(_lora(4, True), _graphs(True)) == [0, 5]
    assert cases(_lora(4, False), _graphs(False)) == [5]
    assert lora_settings((0, 5)) == (4, True, False)


def test_a_v1_lora_rule_reading_anything_else_is_refused_naming_it() -> None:
    class Newer:
        def _get_lora_cases(self) -> list[int]:
            return [self.vllm_config.lora_config.max_cpu_loras]  # type: ignore[attr-defined]

    with pytest.raises(
        AttributeError, match=r"vllm_config\.lora_config\.max_cpu_loras"
    ):
        lora_capture_cases(Newer)(_lora(2, False), _graphs(False))
