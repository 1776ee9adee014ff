"""The two sides of a diff, each a target spec as ``dpsim check`` takes it.

A side is written as one word: a release (``0.29.0``), a source tree or
installed ``vllm`` package directory, or a ``.py`` file, which is then a sync
file (``--target``) run against the rest of vLLM named by ``--vllm`` (or
``--base-vllm`` / ``--new-vllm`` where the sides differ). Each side's runner is
``--base-runner`` / ``--new-runner``, else ``--runner``, else the side's own
default. Everything is resolved by :func:`dpsim.targets.parse_target`, so a
side is refused exactly as ``check`` would refuse it, with the side named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import TargetError, UsageError
from dpsim.targets.spec import TargetSpec, parse_target
from dpsim.terminal import printable


@dataclass(frozen=True)
class Sides:
    base: TargetSpec
    new: TargetSpec


def parse_side(
    name: str,
    given: str,
    vllm: str | None,
    runner: str | None,
) -> TargetSpec:
    """One side's spec; ``name`` ("base"/"new") prefixes any refusal."""
    try:
        if Path(given).expanduser().is_file() or given.endswith(".py"):
            if not Path(given).expanduser().is_file():
                raise TargetError(f"{given}: no such file")
            if vllm is None:
                raise TargetError(
                    f"{given} is a file: name the vLLM it runs against with "
                    f"--vllm SPEC (or --{name}-vllm SPEC)"
                )
            return parse_target(vllm, given, runner=runner)
        if vllm is not None and vllm != given:
            # --vllm is the rest of vLLM for a file side only; said, not ignored.
            raise TargetError(
                f"--{name}-vllm {vllm} applies to a .py side only, and {given} "
                "is a whole vLLM"
            )
        return parse_target(given, None, runner=runner)
    except UsageError as error:
        raise type(error)(f"{name} side: {printable(error)}") from error


def parse_sides(
    base: str,
    new: str,
    *,
    vllm: str | None = None,
    base_vllm: str | None = None,
    new_vllm: str | None = None,
    runner: str | None = None,
    base_runner: str | None = None,
    new_runner: str | None = None,
) -> Sides:
    """Both sides resolved before anything is fetched or run.

    ``vllm`` serves a ``.py`` side that has no ``base_vllm`` / ``new_vllm`` of
    its own, and is ignored by a side that is a whole vLLM.
    """

    def rest(side: str, own: str | None) -> str | None:
        if own is not None:
            return own
        return vllm if side.endswith(".py") or Path(side).is_file() else None

    return Sides(
        parse_side("base", base, rest(base, base_vllm), base_runner or runner),
        parse_side("new", new, rest(new, new_vllm), new_runner or runner),
    )
