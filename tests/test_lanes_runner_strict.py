"""Strict stand-ins: a question dpsim did not model is a logged gap."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsim.lanes.runner import where
from dpsim.lanes.runner.strict import (
    ModelGap,
    StrictObject,
    collect_gaps,
    gap,
    instance,
    standin,
)


def _vllm_code(tmp_path: Path, source: str) -> dict[str, object]:
    """Run ``source`` as if it were a vLLM file (registered with where)."""
    path = tmp_path / "vllm" / "fake.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    where.register_file(path)
    namespace: dict[str, object] = {}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


def test_unknown_attribute_is_a_logged_gap_naming_the_vllm_line(tmp_path: Path) -> None:
    code = _vllm_code(tmp_path, "def ask(config):\n    return config.max_num_seqs\n")
    config = standin("SchedulerConfig", max_model_len=128)
    with collect_gaps() as gaps, pytest.raises(ModelGap, match=r"\.max_num_seqs"):
        code["ask"](config)  # type: ignore[operator]
    assert gaps == ["SchedulerConfig.max_num_seqs read at fake.py:2 in ask"]
    assert config.max_model_len == 128


def test_absent_attribute_takes_getattr_default_and_logs_nothing(
    tmp_path: Path,
) -> None:
    code = _vllm_code(
        tmp_path, "def probe(model):\n    return getattr(model, 'eagle', 'no')\n"
    )
    model = standin("Model", absent=("eagle",))
    with collect_gaps() as gaps:
        assert code["probe"](model) == "no"  # type: ignore[operator]
        with pytest.raises(AttributeError) as raised:
            model.eagle  # noqa: B018
    assert not isinstance(raised.value, ModelGap)
    assert gaps == []


def test_a_gap_swallowed_by_except_exception_is_still_logged(tmp_path: Path) -> None:
    code = _vllm_code(
        tmp_path,
        "def careless(worker):\n"
        "    try:\n"
        "        return worker.profiler.start()\n"
        "    except Exception:\n"
        "        return None\n",
    )
    with collect_gaps() as gaps:
        assert code["careless"](standin("Worker")) is None  # type: ignore[operator]
    assert gaps == ["Worker.profiler read at fake.py:3 in careless"]


def test_getattr_probe_of_an_unlisted_name_is_a_gap(tmp_path: Path) -> None:
    # ModelGap is no AttributeError: the probe's default does not hide it.
    code = _vllm_code(
        tmp_path, "def probe(model):\n    return getattr(model, 'eagle', None)\n"
    )
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        code["probe"](standin("Model"))  # type: ignore[operator]
    assert gaps == ["Model.eagle read at fake.py:2 in probe"]


def test_nested_logs_each_see_the_gap_once() -> None:
    with collect_gaps() as outer:
        with collect_gaps() as inner:
            gap("one")
            gap("one")
        gap("two")
    assert inner == ["one"]
    assert outer == ["one", "two"]
    assert isinstance(gap("outside any log"), ModelGap)


def test_dunder_probes_are_not_gaps() -> None:
    with collect_gaps() as gaps:
        assert not hasattr(standin("X"), "__deepcopy__")
    assert gaps == []


def test_instance_skips_init_and_holds_exactly_its_attributes() -> None:
    class Runner(StrictObject):
        def __init__(self) -> None:
            raise AssertionError("vLLM's __init__ builds GPU state")

    runner = instance(Runner, device="cpu")
    assert runner.device == "cpu"
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        runner.model  # noqa: B018
    assert gaps == ["Runner.model read at (no vLLM frame on the stack)"]


def test_standin_callables_are_called_without_self() -> None:
    executor = standin("Executor", collective_rpc=lambda method: f"ran {method}")
    assert executor.collective_rpc("sample") == "ran sample"


def test_standins_of_one_owner_answer_only_their_own_members() -> None:
    # Stand-ins of one owner share a class (made once): what one holds or
    # lacks must not leak into another.
    first = standin("Config", absent=("eplb",), width=2)
    second = standin("Config", depth=3)
    with collect_gaps() as gaps:
        assert getattr(first, "eplb", None) is None
        with pytest.raises(ModelGap):
            second.eplb  # noqa: B018
        with pytest.raises(ModelGap):
            second.width  # noqa: B018
        with pytest.raises(ModelGap):
            first.depth  # noqa: B018
    assert gaps == [
        "Config.eplb read at (no vLLM frame on the stack)",
        "Config.width read at (no vLLM frame on the stack)",
        "Config.depth read at (no vLLM frame on the stack)",
    ]
    assert type(standin("Config", width=5)) is type(second)
