"""A counterexample's target, checked before any of it runs.

A counterexample file names the code it was found on (a release, a source
tree, a ``dp_utils.py`` by path) and the SHA-256 of every source file that
ran. Replaying it executes that code, so the files are first read as bytes
and hashed (nothing imported, nothing executed) and compared with the record:
a file that changed since is refused, unless the user names the target on the
command line (``--vllm`` / ``--target``), which is how a fix is verified. A
path the file names that the user did not give is worth saying before it
runs: a file from someone else must not quietly run whatever it points at.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from dpsim.cex.files import Counterexample
from dpsim.errors import UsageError
from dpsim.targets.load import (
    COMPILATION_MODULE,
    CUDAGRAPH_MODULE,
    DP_UTILS_MODULE,
    source_paths,
)
from dpsim.targets.spec import RELEASE_PATTERN, TargetSpec, parse_target
from dpsim.terminal import printable

#: Modules every target executes: a record must hash them.
ALWAYS_LOADED = (DP_UTILS_MODULE, CUDAGRAPH_MODULE, COMPILATION_MODULE)

#: How to go on when the recorded sources differ: said in every refusal.
PROCEED = (
    "pass --vllm/--target explicitly to run it anyway: that is how a fix is verified"
)


class SourcesChanged(UsageError):
    """The recorded target's sources are not the ones the file records."""


@dataclass(frozen=True)
class Chosen:
    """What a replay runs: the recorded target, or the one the user named."""

    vllm: str
    target_file: str | None
    #: ``--vllm`` or ``--target`` was given: the record is not binding.
    overridden: bool
    #: Paths the counterexample names, not the user, that will be executed.
    unasked: tuple[str, ...]


def recorded_spec(counterexample: Counterexample) -> tuple[str, str | None]:
    """``(--vllm, --target)`` as the file records them."""
    spec = counterexample.target["spec"]
    return str(spec["base"]), spec.get("dp_utils_file")


def choose(
    counterexample: Counterexample,
    vllm: str | None = None,
    target_file: str | Path | None = None,
) -> Chosen:
    """The recorded target unless ``vllm``/``target_file`` say; ``target_file``
    alone keeps the recorded vLLM underneath it."""
    recorded_vllm, recorded_file = recorded_spec(counterexample)
    overridden = vllm is not None or target_file is not None
    unasked = []
    # Whatever kind the file claims, a base that is not a release number is
    # read as a path (see parse_base), so that is what decides.
    if vllm is None and not RELEASE_PATTERN.match(recorded_vllm.strip()):
        unasked.append(recorded_vllm)
    if not overridden:
        if recorded_file is not None:
            unasked.append(recorded_file)
        return Chosen(recorded_vllm, recorded_file, False, tuple(unasked))
    return Chosen(
        vllm if vllm is not None else recorded_vllm,
        str(target_file) if target_file is not None else None,
        True,
        tuple(unasked),
    )


def check_recorded_sources(counterexample: Counterexample, chosen: Chosen) -> None:
    """Refuse (:class:`SourcesChanged`) when a recorded source file differs now.

    Reads and hashes only; a user-named target (``chosen.overridden``) is
    not held to the record and is not read here.
    """
    if chosen.overridden:
        return
    recorded: dict[str, str] = counterexample.target["files"]
    spec = _recorded(chosen)
    # Every target executes these; a record without them checks nothing.
    changed = [
        f"{module}: executed by every target, not recorded"
        for module in ALWAYS_LOADED
        if module not in recorded
    ]
    for module, path in sorted(source_paths(spec, recorded).items()):
        if path is None:
            changed.append(f"{module}: recorded, but {spec} has no such file now")
            continue
        now = _sha256(path)
        if now != recorded[module]:
            changed.append(
                f"{path}: sha256 {now[:12]} now, {recorded[module][:12]} recorded"
            )
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise SourcesChanged(
            f"the counterexample's target changed: {printable(changed[0])}{more}; "
            + PROCEED
        )


def _recorded(chosen: Chosen) -> TargetSpec:
    try:
        return parse_target(chosen.vllm, chosen.target_file)
    except UsageError as error:
        raise UsageError(
            f"the counterexample's recorded target: {printable(error)}; {PROCEED}"
        ) from error


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        raise UsageError(f"cannot read {printable(path)}: {error.strerror}") from error
