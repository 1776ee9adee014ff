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
from dpsim.targets.load import required_modules, source_paths
from dpsim.targets.spec import RELEASE_PATTERN, TargetSpec, parse_target
from dpsim.terminal import printable

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
    #: ``--vllm``, ``--target``, ``--runner`` or ``--caller-file`` was given:
    #: the record is not binding.
    overridden: bool
    #: Paths the counterexample names, not the user, that will be executed.
    unasked: tuple[str, ...]
    #: The model runner whose sync runs: the recorded one unless ``--runner``.
    runner: str = "v2"
    #: V1 only: the file the caller method comes from (see ``TargetSpec``).
    caller_file: str | None = None

    def spec(self) -> TargetSpec:
        """The target spec this choice names (a one-line error if it names none)."""
        return parse_target(
            self.vllm,
            self.target_file,
            runner=self.runner,
            caller_file=self.caller_file,
        )


@dataclass(frozen=True)
class Recorded:
    """The target a counterexample file records, as the options that name it."""

    vllm: str
    target_file: str | None
    runner: str
    caller_file: str | None


def recorded_spec(counterexample: Counterexample) -> Recorded:
    """The target as the file records it; a file without a runner (every file
    written before dpsim knew the V1 runner) is a V2 one."""
    spec = counterexample.target["spec"]
    return Recorded(
        str(spec["base"]),
        spec.get("dp_utils_file"),
        spec.get("runner") or "v2",
        spec.get("caller_file"),
    )


def choose(
    counterexample: Counterexample,
    vllm: str | None = None,
    target_file: str | Path | None = None,
    runner: str | None = None,
    caller_file: str | Path | None = None,
) -> Chosen:
    """The recorded target unless the options say otherwise.

    ``vllm`` replaces the recorded base and drops its recorded files;
    ``target_file``, ``caller_file`` or ``runner`` alone keep the recorded
    vLLM under them; the runner is the recorded one unless ``runner``.
    """
    recorded = recorded_spec(counterexample)
    overridden = any(
        option is not None for option in (vllm, target_file, runner, caller_file)
    )
    unasked = []
    # Whatever kind the file claims, a base that is not a release number is
    # read as a path (see parse_base), so that is what decides.
    if vllm is None and not RELEASE_PATTERN.match(recorded.vllm.strip()):
        unasked.append(recorded.vllm)
    if not overridden:
        unasked.extend(
            path
            for path in (recorded.target_file, recorded.caller_file)
            if path is not None
        )
        return Chosen(
            recorded.vllm,
            recorded.target_file,
            False,
            tuple(unasked),
            recorded.runner,
            recorded.caller_file,
        )
    return Chosen(
        vllm if vllm is not None else recorded.vllm,
        str(target_file) if target_file is not None else None,
        True,
        tuple(unasked),
        runner if runner is not None else recorded.runner,
        str(caller_file) if caller_file is not None else None,
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
    # Every target of the runner executes these; a record without them
    # checks nothing.
    changed = [
        f"{module}: executed by every {spec.runner.upper()} target, not recorded"
        for module in required_modules(spec.runner)
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
        return chosen.spec()
    except UsageError as error:
        raise UsageError(
            f"the counterexample's recorded target: {printable(error)}; {PROCEED}"
        ) from error


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        raise UsageError(f"cannot read {printable(path)}: {error.strerror}") from error
