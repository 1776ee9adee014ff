"""What a target spec names, before anything is fetched or loaded.

A spec is one of: a vLLM release (``0.29.0``), a vLLM source tree or an
installed ``vllm`` package directory (a path), or a single ``dp_utils.py``
(a file path) that is run against the rest of vLLM from a release or tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import TargetError

RELEASE_PATTERN = re.compile(r"^\d+\.\d+(\.\d+)?([.-]?(post|rc|dev)\d*)?$")
DEFAULT_RELEASE = "0.33.0"
#: The oldest (major, minor) whose DP-sync API dpsim adapts. vLLM 0.15-0.17
#: expose only ``get_cudagraph_and_dp_padding`` (no capture manager) and older
#: releases have no ``gpu/dp_utils.py`` at all; this one boundary decides both
#: the refusal before a fetch and the releases the cross-version report runs.
OLDEST_SUPPORTED = (0, 18)
OLDEST_RELEASE = f"{OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]}.0"

#: Where the sync file lives in a vLLM checkout, and in the ``vllm`` package.
DP_UTILS_IN_PACKAGE = "v1/worker/gpu/dp_utils.py"
DP_UTILS_IN_CHECKOUT = f"vllm/{DP_UTILS_IN_PACKAGE}"


@dataclass(frozen=True)
class ReleaseSpec:
    version: str

    def __str__(self) -> str:
        return self.version


@dataclass(frozen=True)
class TreeSpec:
    """A directory holding ``vllm/`` (a checkout) or being ``vllm/`` itself."""

    package_dir: Path

    def __str__(self) -> str:
        return str(self.package_dir)


BaseSpec = ReleaseSpec | TreeSpec


@dataclass(frozen=True)
class TargetSpec:
    """Where each piece of a target comes from.

    ``base`` supplies vLLM's manager and enums; ``dp_utils_file``, when given,
    replaces the base's own ``dp_utils.py``.
    """

    base: BaseSpec
    dp_utils_file: Path | None = None

    def __str__(self) -> str:
        if self.dp_utils_file is None:
            return str(self.base)
        return f"{self.dp_utils_file} (on vllm {self.base})"

    def to_dict(self) -> dict[str, str | None]:
        kind = "release" if isinstance(self.base, ReleaseSpec) else "tree"
        return {
            "kind": kind,
            "base": str(self.base),
            "dp_utils_file": str(self.dp_utils_file) if self.dp_utils_file else None,
        }


def check_release(version: str) -> str:
    """``version`` itself when dpsim can run that release; otherwise a one-line
    :class:`TargetError`, so a release that would be refused anyway is refused
    before its ~300 MB wheel is downloaded (or its cache entry is read)."""
    if not RELEASE_PATTERN.match(version):
        raise TargetError(
            f"{version!r} is not a vLLM release version (e.g. {DEFAULT_RELEASE})"
        )
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    if (major, minor) < OLDEST_SUPPORTED:
        raise TargetError(
            f"vllm {version} is older than dpsim supports ({OLDEST_RELEASE} and "
            "later): the vLLM 0.15-0.17 API (get_cudagraph_and_dp_padding, no "
            "capture manager) and anything before it are not adapted; "
            "refused without fetching it"
        )
    return version


def parse_base(text: str) -> BaseSpec:
    """A release version or a directory; anything else is a clear error."""
    text = text.strip()
    if RELEASE_PATTERN.match(text):
        return ReleaseSpec(text)
    path = Path(text).expanduser()
    if path.is_dir():
        return TreeSpec(_package_dir(path))
    if path.is_file():
        raise TargetError(
            f"{text} is a file: pass a single dp_utils.py with --target FILE "
            "and the vLLM it runs against with --vllm SPEC"
        )
    raise TargetError(
        f"{text!r} is neither a vLLM release (e.g. 0.29.0) nor an existing directory"
    )


def _package_dir(path: Path) -> Path:
    path = path.resolve()
    if (path / "vllm" / "__init__.py").is_file() or (path / "vllm" / "v1").is_dir():
        return path / "vllm"
    if path.name == "vllm" and (path / "v1").is_dir():
        return path
    raise TargetError(
        f"{path} is not a vLLM source tree or installed vllm package "
        "(no vllm/v1 directory in it)"
    )


def parse_target(vllm: str | None, target_file: str | Path | None = None) -> TargetSpec:
    """Combine ``--vllm`` and ``--target`` into one spec."""
    base = parse_base(vllm or DEFAULT_RELEASE)
    if target_file is None:
        return TargetSpec(base)
    path = Path(target_file).expanduser()
    if path.is_dir():
        raise TargetError(
            f"--target {target_file} is a directory; expected a dp_utils.py file "
            f"(did you mean --vllm {target_file}, or --target "
            f"{_dp_utils_inside(path, str(target_file))}?)"
        )
    if not path.is_file():
        raise TargetError(f"--target {target_file}: no such file")
    if path.suffix != ".py":
        raise TargetError(f"--target {target_file}: expected a Python file (.py)")
    return TargetSpec(base, path.resolve())


def _dp_utils_inside(directory: Path, shown: str) -> str:
    """The ``dp_utils.py`` a user probably meant inside ``directory``: the one
    that exists there, else where a vLLM checkout keeps it."""
    layouts = (DP_UTILS_IN_CHECKOUT, DP_UTILS_IN_PACKAGE, "dp_utils.py")
    found = next(
        (layout for layout in layouts if (directory / layout).is_file()),
        DP_UTILS_IN_CHECKOUT,
    )
    return f"{shown.rstrip('/')}/{found}"
