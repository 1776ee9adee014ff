"""Shared test helpers.

Real vLLM source is never committed: tests that need it load releases from
the dpsim cache (``make test`` fetches them first) or derive files from a
cached release's own sources at test time.
"""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from faults import VOTING

from dpsim.targets import Target, load_target
from dpsim.targets.cache import ensure_release


def pytest_configure(config: pytest.Config) -> None:
    """Python's own Ctrl-C handler, wherever the run was started from.

    A process started with SIGINT ignored (``make test &`` from a script,
    some CI runners) keeps it ignored, and so does every process it starts.
    The tests that send Ctrl-C (to dpsim in this process or to a child) and
    check which handler dpsim puts back need the handler an interactive start
    gives; a Python handler, unlike an ignored signal, is not inherited across
    exec, so the children they start get their default back as well.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def release() -> Callable[[str], Target]:
    """Load a release from the dpsim cache (fetching it if it is missing)."""
    return load_target


@pytest.fixture
def release_file() -> Callable[[str, str], Path]:
    """The path of one source file inside a cached release."""

    def locate(version: str, relative: str) -> Path:
        return ensure_release(version) / relative

    return locate


@pytest.fixture
def write_module(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a hand-written module (dedented) and return its path."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture
def per_rank_padding(write_module: Callable[[str, str], Path]) -> Path:
    """A dp_utils (0.20 API) whose ranks each pad to their own count: a bug."""
    return write_module("per_rank_padding.py", VOTING.replace("PAD_FROM", "num_tokens"))


@pytest.fixture
def agreed_padding(write_module: Callable[[str, str], Path]) -> Path:
    """The same dp_utils padding every rank to the agreed maximum: correct."""
    return write_module(
        "agreed_padding.py", VOTING.replace("PAD_FROM", "int(counts.max())")
    )
