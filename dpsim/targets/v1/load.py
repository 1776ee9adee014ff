"""Loading a V1-runner target (placeholder while the loader lands)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dpsim.errors import TargetError

if TYPE_CHECKING:
    from dpsim.targets.load import Target
    from dpsim.targets.spec import TargetSpec


def load_v1(spec: TargetSpec, package_dir: Path, version: str | None) -> Target:
    raise TargetError(f"{spec}: the V1 runner's loader is not there yet")
