"""pytest integration: run dpsim's property suite under pytest (and pytest-xdist).

Options (each also read from an environment variable, so CI can set them once):

  --dpsim-vllm SPEC       DPSIM_VLLM       release, source tree or package dir
  --dpsim-target FILE     DPSIM_TARGET     a dp_utils.py run against --dpsim-vllm
  --dpsim-policy FILE     DPSIM_POLICY     fix the capture policy (JSON/TOML)
  --dpsim-profile NAME    DPSIM_PROFILE    caller (default) or contract
  --dpsim-ranks LO..HI    DPSIM_RANKS      DP sizes (default 2..16)
  --dpsim-out DIR         DPSIM_OUT        where counterexample files go
  --dpsim-db DIR          DPSIM_HYPOTHESIS_DB  a shared Hypothesis example database

Hypothesis settings profiles ``dev`` (fast), ``ci`` and ``nightly`` are
registered; pick one with Hypothesis' own ``--hypothesis-profile`` (default
``ci`` under CI=true, else ``dev``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from dpsim.capture.policy import CapturePolicy, load_policy
from dpsim.targets import load_target
from dpsim.targets.load import Target

_BASE = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", parent=_BASE, max_examples=40)
settings.register_profile("ci", parent=_BASE, max_examples=150)
settings.register_profile("nightly", parent=_BASE, max_examples=5000)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

_OPTIONS = (
    ("vllm", "DPSIM_VLLM", "release, source tree or vllm package dir to test"),
    ("target", "DPSIM_TARGET", "a dp_utils.py run against --dpsim-vllm"),
    ("policy", "DPSIM_POLICY", "capture policy file (JSON/TOML) to fix"),
    ("profile", "DPSIM_PROFILE", "generator profile: caller (default) or contract"),
    ("ranks", "DPSIM_RANKS", "DP sizes as LO..HI (default 2..16)"),
    ("out", "DPSIM_OUT", "directory for counterexample files (default dpsim-out)"),
    ("db", "DPSIM_HYPOTHESIS_DB", "directory of a shared Hypothesis example database"),
)


@dataclass(frozen=True)
class SuiteConfig:
    """What the property suite runs against, resolved once per session."""

    target: Target
    policy: CapturePolicy | None
    profile: str
    ranks: tuple[int, int]
    out: Path


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dpsim", "dpsim property suite")
    for name, variable, text in _OPTIONS:
        group.addoption(
            f"--dpsim-{name}", default=None, help=f"{text} (env {variable})"
        )


def _option(config: pytest.Config, name: str, variable: str) -> str | None:
    value = config.getoption(f"--dpsim-{name}")
    return value if value is not None else os.environ.get(variable) or None


def pytest_configure(config: pytest.Config) -> None:
    database_dir = _option(config, "db", "DPSIM_HYPOTHESIS_DB")
    if database_dir:
        # Every worker reading and writing one directory is how CI runners share
        # what they found: a failure saved by one is replayed first by the rest.
        current = settings()
        settings.register_profile(
            "dpsim-shared-db",
            parent=current,
            database=DirectoryBasedExampleDatabase(database_dir),
        )
        settings.load_profile("dpsim-shared-db")


@pytest.fixture(scope="session")
def dpsim_suite(pytestconfig: pytest.Config) -> SuiteConfig:
    from dpsim.cli.check import parse_ranks

    values = {
        name: _option(pytestconfig, name, variable) for name, variable, _ in _OPTIONS
    }
    policy_file = values["policy"]
    return SuiteConfig(
        target=load_target(values["vllm"], values["target"]),
        policy=load_policy(Path(policy_file)) if policy_file else None,
        profile=values["profile"] or "caller",
        ranks=parse_ranks(values["ranks"] or "2..16"),
        out=Path(values["out"] or "dpsim-out"),
    )
