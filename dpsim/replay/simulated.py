"""Rerun a counterexample in the simulator, exactly as it was found.

The recorded scheduling choices are replayed (``ReplayChooser``), so on the
recorded target the rerun's outcome, verdicts and trace are the file's, byte
for byte. On another target (a fix, a newer release) the same case runs and
the verdicts say whether the bug is still there; if that target takes other
paths, the recorded choices may not fit, and the case reruns in the default
order instead (said, never hidden).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsim.cex import files
from dpsim.cex.files import Counterexample
from dpsim.errors import UsageError
from dpsim.options import parse_runner
from dpsim.properties import Verdict, judge, select
from dpsim.records.case import Case
from dpsim.records.trace import SimResult
from dpsim.replay.sources import (
    PROCEED,
    Chosen,
    SourcesChanged,
    check_recorded_sources,
    choose,
)
from dpsim.scenarios import PolicyRefused, run_case
from dpsim.scenarios.run import why_not_runnable
from dpsim.sim import ReplayChooser, ReplayDivergedError
from dpsim.targets import load_spec
from dpsim.targets.load import Target
from dpsim.terminal import printable

#: How a rerun compares with the recorded run.
REPRODUCED = "reproduced"  # same outcome, verdicts and trace, byte for byte
SAME_VERDICTS = (
    "same-verdicts"  # the same verdicts; the trace differs (another version)
)
FAILS_DIFFERENTLY = "fails-differently"  # some property still fails, not the same way
HOLDS = "holds"  # every property holds now


@dataclass(frozen=True)
class Rerun:
    """One rerun of a counterexample's case, judged by the file's properties."""

    target: Target
    case: Case
    result: SimResult
    verdicts: tuple[Verdict, ...]
    #: The recorded choices did not fit this target; it ran in the default order.
    diverged: bool

    @property
    def holds(self) -> bool:
        return not self.verdicts

    def as_rerun_dict(self) -> dict[str, Any]:
        return files.rerun_dict(
            self.result, [verdict.to_dict() for verdict in self.verdicts]
        )


@dataclass(frozen=True)
class ResolvedTarget:
    target: Target
    #: One line per recorded source file whose hash differs, or that is gone
    #: (only ever non-empty on a target the user named).
    drift: tuple[str, ...]
    #: The recorded target was replaced by ``--vllm`` / ``--target``.
    overridden: bool


def resolve_target(
    counterexample: Counterexample,
    vllm: str | None = None,
    target_file: str | Path | None = None,
    runner: str | None = None,
    caller_file: str | Path | None = None,
) -> ResolvedTarget:
    """Load the target to rerun on: the recorded one unless the options say.

    ``target_file`` (or ``runner``, ``caller_file``) alone keeps the recorded
    vLLM under it (see :func:`~dpsim.replay.sources.choose`). The recorded
    target is held to its record: its sources are hashed before it loads, and
    any difference is a :class:`~dpsim.replay.sources.SourcesChanged`.
    """
    chosen = choose(counterexample, vllm, target_file, runner, caller_file)
    check_recorded_sources(counterexample, chosen)
    return load_chosen(counterexample, chosen)


def load_chosen(counterexample: Counterexample, chosen: Chosen) -> ResolvedTarget:
    """Load a target whose recorded sources ``check_recorded_sources`` passed."""
    target = load_spec(chosen.spec())
    drift = source_drift(counterexample, target)
    if drift and not chosen.overridden:
        # The hashes matched, yet loading ran a module the file does not
        # record: refuse before any case runs on it.
        raise SourcesChanged(
            f"the counterexample's target changed: {printable(drift[0])}; {PROCEED}"
        )
    return ResolvedTarget(target, drift, chosen.overridden)


def source_drift(counterexample: Counterexample, target: Target) -> tuple[str, ...]:
    recorded: dict[str, str] = counterexample.target["files"]
    loaded = {item.module: item.sha256 for item in target.files}
    lines = []
    for module, digest in sorted(recorded.items()):
        now = loaded.get(module)
        if now is None:
            lines.append(f"{module}: recorded, not loaded now")
        elif now != digest:
            lines.append(f"{module}: sha256 {now[:12]} now, {digest[:12]} recorded")
    lines.extend(
        f"{module}: loaded now, not recorded"
        for module in sorted(set(loaded) - set(recorded))
    )
    return tuple(lines)


def replay_in_sim(counterexample: Counterexample, target: Target) -> Rerun:
    case = counterexample.case
    reason = why_not_runnable(target, case)
    if reason is not None:
        raise UsageError(
            f"cannot replay this case on {printable(target.label)}: {reason}"
        )
    properties = select(counterexample.properties)
    diverged = False
    try:
        try:
            result = run_case(
                target, case, chooser=ReplayChooser(counterexample.choices)
            )
        except ReplayDivergedError:
            diverged = True
            result = run_case(target, case)
    except PolicyRefused as error:
        raise UsageError(
            printable(f"{target.label} refuses the case's capture policy ({error})")
        ) from error
    verdicts = _in_recorded_order(
        judge(case, result, properties), counterexample.verdicts
    )
    return Rerun(target, case, result, verdicts, diverged)


def _in_recorded_order(
    verdicts: list[Verdict], recorded: tuple[dict[str, Any], ...]
) -> tuple[Verdict, ...]:
    # dpsim check lists the property it chased first; keep that order so the
    # rerun's verdict list can match the file's exactly.
    rank = {item["property"]: index for index, item in enumerate(recorded)}
    return tuple(
        sorted(verdicts, key=lambda verdict: rank.get(verdict.property, len(rank)))
    )


def compare(counterexample: Counterexample, rerun: Rerun) -> str:
    """REPRODUCED, SAME_VERDICTS, FAILS_DIFFERENTLY or HOLDS."""
    if rerun.holds:
        return HOLDS
    now = rerun.as_rerun_dict()
    if files.canonical(now) == files.canonical(files.recorded_rerun(counterexample)):
        return REPRODUCED
    if now["verdicts"] == list(counterexample.verdicts):
        return SAME_VERDICTS
    return FAILS_DIFFERENTLY


def target_for_tests(counterexample: Counterexample) -> ResolvedTarget:
    """The target a regression test replays on: the recorded one, or
    ``$DPSIM_VLLM`` (and ``$DPSIM_TARGET``, ``$DPSIM_RUNNER``) when set."""
    return resolve_target(
        counterexample,
        os.environ.get("DPSIM_VLLM") or None,
        os.environ.get("DPSIM_TARGET") or None,
        parse_runner(os.environ.get("DPSIM_RUNNER"), "DPSIM_RUNNER"),
    )


def assert_holds(path: str | Path) -> None:
    """Replay ``path`` in the simulator; fail (AssertionError) while a property fails.

    What regression tests written by ``dpsim check --out`` call. The target is
    the recorded one, or ``$DPSIM_VLLM`` (and ``$DPSIM_TARGET``,
    ``$DPSIM_RUNNER``) when set; a recorded target whose sources changed is
    refused (``SourcesChanged``).
    """
    from dpsim.properties import Evidence
    from dpsim.report import render_case_run

    counterexample = files.read(Path(path))
    resolved = target_for_tests(counterexample)
    rerun = replay_in_sim(counterexample, resolved.target)
    if rerun.holds:
        return
    headline = "; ".join(str(verdict) for verdict in rerun.verdicts)
    raise AssertionError(
        printable(f"{resolved.target.label}: {headline}")
        + "\n\n"
        + render_case_run(
            f"{Path(path).name} on {resolved.target.label}",
            rerun.case,
            Evidence(rerun.case, rerun.result),
        )
    )
