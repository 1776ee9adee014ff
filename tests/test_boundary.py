"""Whose an exception is: vLLM's own (a finding) or dpsim's (a refusal)."""

from __future__ import annotations

from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import find, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

from dpsim import boundary
from dpsim.boundary import (
    SearchStopped,
    collect_gaps,
    fault_of,
    gap,
    refusal,
    searching,
    stops_the_search,
)
from dpsim.errors import BoundaryError
from dpsim.records.policy import CapturePolicy, CudagraphMode
from dpsim.targets.manager import ParallelConfigStandIn, build_manager


def _vllm(tmp_path: Path, source: str) -> dict[str, Any]:
    """Run ``source`` (written here, no vLLM code) as if it were a vLLM file."""
    path = tmp_path / "vllm" / "v1" / "worker" / "fake.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    boundary.register_file(path)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


def _raised(call: Any, *args: Any) -> BaseException:
    with pytest.raises(BaseException) as raised:
        call(*args)
    return raised.value


def test_vllms_own_assertion_is_vllms(tmp_path: Path) -> None:
    code = _vllm(tmp_path, "def sync(n):\n    assert n > 0, 'no tokens'\n")
    assert fault_of(_raised(code["sync"], 0)) is None


def test_a_constructor_that_takes_a_new_argument_is_dpsims_call_naming_both_sides(
    tmp_path: Path,
) -> None:
    # A release's manager that grew a required argument dpsim does not pass.
    code = _vllm(
        tmp_path,
        "class CudaGraphManager:\n"
        "    def __init__(self, vllm_config, device, cudagraph_mode, graph_pool):\n"
        "        pass\n",
    )
    config = CapturePolicy(capture_sizes=(1, 2)).manager_config(2)
    modes = {mode: mode for mode in CudagraphMode}
    error = _raised(build_manager, code["CudaGraphManager"], modes, config)
    fault = fault_of(error)
    assert fault is not None
    assert fault.error.startswith("TypeError: CudaGraphManager.__init__() missing 1")
    assert "dpsim's call at dpsim/targets/manager.py:" in fault.how
    assert "into vLLM's v1/worker/fake.py:2 CudaGraphManager.__init__" in fault.how


def test_vllm_calling_a_stand_in_with_a_keyword_it_does_not_take_is_dpsims(
    tmp_path: Path,
) -> None:
    from dpsim.lanes.runner.strict import standin

    code = _vllm(
        tmp_path, "def sync(group, t):\n    return group.reduce(t, op='max')\n"
    )
    group = standin("GroupCoordinator", reduce=lambda tensor: tensor)
    fault = fault_of(_raised(code["sync"], group, 1))
    assert fault is not None
    assert "vLLM's call at v1/worker/fake.py:2 in sync" in fault.how


def test_vllm_calling_its_own_function_wrongly_is_vllms(tmp_path: Path) -> None:
    code = _vllm(
        tmp_path,
        "def helper(a, b):\n    return a + b\n\ndef sync(n):\n    return helper(n)\n",
    )
    assert fault_of(_raised(code["sync"], 1)) is None


def test_a_config_switch_a_stand_in_lacks_is_dpsims(tmp_path: Path) -> None:
    code = _vllm(tmp_path, "def sync(config):\n    return config.enable_elastic_ep\n")
    fault = fault_of(_raised(code["sync"], ParallelConfigStandIn()))
    assert fault is not None
    assert "enable_elastic_ep" in fault.error
    assert "vLLM reads it at v1/worker/fake.py:2 in sync" in fault.how


def test_an_attribute_vllms_own_object_lacks_is_vllms(tmp_path: Path) -> None:
    code = _vllm(
        tmp_path,
        "class State:\n    pass\n\ndef sync():\n    return State().missing\n",
    )
    assert fault_of(_raised(code["sync"])) is None


def test_a_gap_and_an_import_are_dpsims_even_under_vllms_except(
    tmp_path: Path,
) -> None:
    code = _vllm(
        tmp_path,
        "def careless(ask):\n"
        "    try:\n"
        "        ask()\n"
        "    except Exception as error:\n"
        "        raise RuntimeError('engine died') from error\n"
        "def moved():\n"
        "    import dpsim_no_such_module\n",
    )

    def ask() -> None:
        raise gap("Config.flag read at fake.py:3 in careless")

    with collect_gaps():
        fault = fault_of(_raised(code["careless"], ask))
    assert fault is not None and fault.how.startswith("a gap: Config.flag")
    fault = fault_of(_raised(code["moved"]))
    assert fault is not None and "a module dpsim could not import" in fault.how


def test_dpsims_own_error_is_dpsims_unless_it_models_the_real_thing(
    tmp_path: Path,
) -> None:
    from dpsim.lanes.runner.strict import standin

    code = _vllm(tmp_path, "def probe(model):\n    return model.eagle\n")
    # The real model lacks the attribute too: what dpsim raises is vLLM's doing.
    model = standin("Model", absent=("eagle",))
    assert fault_of(_raised(code["probe"], model)) is None
    # A bug in dpsim's own code (here: a mode it was given no member for).
    config = CapturePolicy(capture_sizes=(1,)).manager_config(2)
    fault = fault_of(_raised(build_manager, object, {}, config))
    assert fault is not None
    assert fault.error.startswith("KeyError:")
    assert fault.how.startswith("raised in dpsim's own code; dpsim at ")


def test_a_refusal_is_one_line_naming_the_target(tmp_path: Path) -> None:
    code = _vllm(tmp_path, "def sync(config):\n    return config.new_switch\n")
    error = _raised(code["sync"], ParallelConfigStandIn())
    refused = refusal("vllm 9.9.9", error, "building its CudaGraphManager")
    text = str(refused)
    assert isinstance(refused, BoundaryError) and "\n" not in text
    assert text.startswith(
        "dpsim cannot drive vllm 9.9.9: building its CudaGraphManager: AttributeError:"
    )


def test_a_dpsim_error_stops_a_search_at_once_and_is_never_saved() -> None:
    database = InMemoryExampleDatabase()
    tried: list[int] = []

    def fails(value: int) -> bool:
        tried.append(value)
        if value > 3:
            raise BoundaryError("dpsim cannot drive it")
        return False

    with pytest.raises(BoundaryError, match="cannot drive it"), searching():
        find(
            st.integers(0, 100),
            stops_the_search(fails),
            settings=settings(database=database, max_examples=200),
            database_key=b"key",
            random=Random(0),
        )
    # Not shrunk: the first case over 3 was the last one tried.
    assert tried[-1] > 3 and sum(value > 3 for value in tried) == 1
    assert list(database.fetch(b"key")) == []
    assert issubclass(SearchStopped, KeyboardInterrupt)
