"""real_class: a vLLM class rebuilt from chosen methods, on real lines."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpsim.errors import TargetError
from dpsim.lanes.runner.extract import (
    class_methods,
    class_node,
    find_class,
    real_class,
    supply,
)
from dpsim.lanes.runner.strict import ModelGap, StrictObject, collect_gaps, instance

# A hand-written stand-in for a vLLM file (not vLLM's text).
FAKE = """\
import functools


class Base:
    def hello(self) -> str:
        return "base"


def tag(label):
    def wrap(function):
        function.label = label
        return function
    return wrap


class Runner(Base):
    limit: int = 3
    modes = ("a", "b")
    computed = limit + 1

    def __init__(self) -> None:
        raise RuntimeError("builds GPU state")

    @torch.inference_mode()
    @tag("real")
    def step(self, n: int) -> list[int]:
        total: list[int] = []
        for index in range(n):
            total.append(index * self.scale)
        return [value + OFFSET for value in total]

    def hello(self) -> str:
        return "runner+" + super().hello()

    @functools.cached_property
    def width(self) -> int:
        return self.scale * 2

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        self._mode = value

    @staticmethod
    def twice(x: int) -> int:
        return 2 * x

    @classmethod
    def named(cls) -> str:
        return cls.__name__

    def fails(self) -> None:
        helper = lambda: self.scale / 0
        helper()

    def uses_missing(self) -> int:
        try:
            return MISSING_HELPER(self.scale)
        except Exception:
            return -1

    def scoped(self) -> int:
        def local_only():
            SHADOWED = 1
            return SHADOWED

        counter = 0

        def bump():
            nonlocal counter
            counter += local_only()

        bump()
        return counter + SHADOWED

    def probes(self) -> object:
        return getattr(self, "drafter", None)

    def not_kept(self) -> None:
        pass


class OnlyCapture(Base):
    def capture(self) -> None:
        raise RuntimeError("runs the model on a GPU")
"""


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "vllm" / "v1" / "fake_runner.py"
    path.parent.mkdir(parents=True)
    path.write_text(FAKE)
    return path


def _line(path: Path, text: str) -> int:
    return next(
        number
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if text in line
    )


def _runner(path: Path, methods: list[str], **options: Any) -> type:
    base = type("Base", (StrictObject,), {"hello": lambda self: "base"})
    settings: dict[str, Any] = {
        "version": "9.9.9",
        "globals_": {"functools": functools, "OFFSET": 100, "tag": _tag},
        "bases": (base,),
        "decorators": {"torch.inference_mode()": None},
    }
    settings.update(options)
    return real_class(path, "Runner", methods, **settings)


def _tag(label: str) -> Callable[[Any], Any]:
    def wrap(function: Any) -> Any:
        function.label = label
        return function

    return wrap


def test_methods_run_with_real_decorators_loops_and_comprehensions(fake: Path) -> None:
    cls = _runner(fake, ["step"])
    runner = instance(cls, scale=2)
    assert runner.step(3) == [100, 102, 104]
    assert cls.step.label == "real"  # the kept decorator ran
    code = cls.step.__code__
    assert code.co_filename == str(fake)
    # As in Python: a decorated function starts at its first decorator kept.
    assert code.co_firstlineno == _line(fake, '@tag("real")')


def test_zero_argument_super_reaches_the_base(fake: Path) -> None:
    runner = instance(_runner(fake, ["hello"]))
    assert runner.hello() == "runner+base"


def test_properties_setters_cached_static_and_class_methods(fake: Path) -> None:
    cls = _runner(fake, ["width", "mode", "twice", "named"])
    runner = instance(cls, scale=5)
    runner.mode = "decode"
    assert (runner.mode, runner.width, cls.twice(4), cls.named()) == (
        "decode",
        10,
        8,
        "Runner",
    )


def test_a_decorator_can_be_replaced(fake: Path) -> None:
    cls = _runner(
        fake,
        ["step"],
        decorators={"torch.inference_mode()": None, 'tag("real")': _tag("dpsim")},
    )
    assert cls.step.label == "dpsim"


def test_an_undropped_unsupplied_decorator_is_a_gap(fake: Path) -> None:
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        _runner(fake, ["step"], decorators={})
    assert gaps == [
        f"name torch read at v1/fake_runner.py:{_line(fake, '@torch')} in Runner "
        "is not supplied"
    ]


def test_a_traceback_names_the_real_lines(fake: Path) -> None:
    runner = instance(_runner(fake, ["fails"]), scale=1)
    with pytest.raises(ZeroDivisionError) as raised:
        runner.fails()
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [(f.filename, f.lineno) for f in frames[-2:]] == [
        (str(fake), _line(fake, "helper()")),
        (str(fake), _line(fake, "self.scale / 0")),
    ]


def test_an_unsupplied_global_is_a_gap_even_when_caught(fake: Path) -> None:
    runner = instance(_runner(fake, ["uses_missing"]), scale=1)
    with collect_gaps() as gaps:
        assert runner.uses_missing() == -1
    line = _line(fake, "MISSING_HELPER(")
    assert gaps == [
        f"name MISSING_HELPER read at v1/fake_runner.py:{line} in uses_missing "
        "is not supplied"
    ]


def test_a_global_read_shadowed_elsewhere_is_still_a_gap(fake: Path) -> None:
    runner = instance(_runner(fake, ["scoped"]))
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        runner.scoped()
    line = _line(fake, "return counter + SHADOWED")
    assert gaps == [
        f"name SHADOWED read at v1/fake_runner.py:{line} in scoped is not supplied"
    ]
    supplied = _runner(fake, ["scoped"], globals_={"SHADOWED": 10, "tag": _tag})
    assert instance(supplied).scoped() == 11  # nonlocal and nested scopes run


def test_a_global_can_be_supplied_after_the_class_is_built(fake: Path) -> None:
    cls = _runner(fake, ["uses_missing"])
    supply(cls, MISSING_HELPER=lambda scale: scale * 7)
    with collect_gaps() as gaps:
        assert instance(cls, scale=2).uses_missing() == 14
    assert gaps == []


def test_a_method_not_kept_is_a_gap_and_absent_is_a_probe(fake: Path) -> None:
    runner = instance(_runner(fake, ["probes"], absent=("drafter",)))
    with collect_gaps() as gaps:
        assert runner.probes() is None
        with pytest.raises(ModelGap, match=r"Runner\.not_kept read at"):
            runner.not_kept()
    assert gaps == ["Runner.not_kept read at (no vLLM frame on the stack)"]


def test_class_attributes_are_supplied(fake: Path) -> None:
    cls = _runner(fake, ["step"], class_attributes={"scale": 10, "limit": 4})
    assert instance(cls).step(2) == [100, 110]
    assert (cls.limit, cls.modes) == (4, ("a", "b"))  # literal settings kept
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        instance(cls).computed  # noqa: B018 - not a literal: not kept
    assert gaps == ["Runner.computed read at (no vLLM frame on the stack)"]


def test_a_missing_method_or_class_is_one_line(fake: Path) -> None:
    with pytest.raises(TargetError) as raised:
        _runner(fake, ["step", "sample_tokens"])
    assert str(raised.value) == (
        "runner lane: vLLM 9.9.9's v1/fake_runner.py has no Runner.sample_tokens"
    )
    with pytest.raises(TargetError, match=r"has no class Missing$"):
        real_class(fake, "Missing", ["x"], version=None, globals_={})


def test_class_methods_lists_the_body_in_order(fake: Path) -> None:
    names = class_methods(fake, "Runner", version=None)
    assert names[:4] == ("__init__", "step", "hello", "width")
    assert names.count("mode") == 1
    with pytest.raises(
        TargetError, match=r"9\.9\.9's v1/fake_runner\.py has no class X"
    ):
        class_methods(fake, "X", version="9.9.9")


def test_a_class_with_nothing_kept_is_its_bases(fake: Path) -> None:
    base = type("Base", (StrictObject,), {"hello": lambda self: "base"})
    cls = real_class(fake, "OnlyCapture", [], version=None, globals_={}, bases=(base,))
    assert cls.__mro__[1] is base
    assert instance(cls).hello() == "base"
    assert "capture" not in cls.__dict__
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        instance(cls).capture()
    assert gaps == ["OnlyCapture.capture read at (no vLLM frame on the stack)"]
    assert list(cls.DPSIM_ORIGIN.codes()) == []


def test_class_node_is_the_files_class_statement(fake: Path) -> None:
    node = class_node(fake, "Runner", version="9.9.9")
    assert node.name == "Runner"
    assert node.lineno == _line(fake, "class Runner(Base):")
    assert [base.id for base in node.bases] == ["Base"]  # type: ignore[attr-defined]
    assert find_class(fake, "Missing") is None
    with pytest.raises(TargetError) as raised:
        class_node(fake, "Missing", version="9.9.9")
    assert str(raised.value) == (
        "runner lane: vLLM 9.9.9's v1/fake_runner.py has no class Missing"
    )


def test_loops_tick(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsim.targets import runtime

    ticks: list[None] = []
    monkeypatch.setitem(runtime.TICKS.__dict__, "tick", lambda: ticks.append(None))
    runner = instance(_runner(fake, ["step"]), scale=1)
    runner.step(4)
    assert len(ticks) == 4


@pytest.mark.release
@pytest.mark.parametrize(
    ("version", "relative"),
    [
        ("0.29.0", "v1/worker/gpu/model_runner.py"),
        ("0.33.0", "v1/worker/gpu/model_runner.py"),
        ("0.34.0", "v1/worker/gpu/model_runner.py"),
    ],
)
def test_real_model_runner_methods_carry_real_lines(
    version: str, relative: str, release_file: Callable[[str, str], Path]
) -> None:
    import torch

    path = release_file(version, relative)
    methods = ["execute_model", "sample_tokens", "_dummy_run"]
    cls = real_class(
        path,
        "GPUModelRunner",
        methods,
        version=version,
        globals_={"torch": torch, "functools": functools},
        decorators={
            "torch.inference_mode()": None,
            "step_eplb_after()": None,
            "step_eplb_after(is_dummy=True)": None,
        },
    )
    lines = path.read_text().splitlines()
    for name in methods:
        code = getattr(cls, name).__code__
        assert code.co_filename == str(path)
        assert lines[code.co_firstlineno - 1].lstrip().startswith(f"def {name}(")
    with collect_gaps() as gaps, pytest.raises(ModelGap):
        instance(cls).execute_model(None)
    assert gaps and gaps[0].startswith("GPUModelRunner.")
    assert "v1/worker/gpu/model_runner.py:" in gaps[0]
