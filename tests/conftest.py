"""Shared test helpers.

Real vLLM source is never committed: tests that need it load releases from
the dpsim cache (``make test`` fetches them first) or derive files from a
cached release's own sources at test time.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from faults import VOTING

from dpsim.targets import Target, load_target
from dpsim.targets.cache import ensure_release


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
