"""The safety half of ``dpsim policy validate``: the property suite, policy fixed.

Why a module of its own: a policy is judged under both generator profiles, in
the scenarios the policy itself turns on, which is not what ``dpsim check``
runs by default (it fits every scenario to a policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpsim.check import CheckOptions, CheckReport, Finding, run_check
from dpsim.known import KnownFinding, known_finding
from dpsim.records.case import PROFILES
from dpsim.records.policy import CapturePolicy
from dpsim.scenarios.generate import scenarios_for
from dpsim.targets.load import Target

__all__ = [
    "SafetyRun",
    "check_policy",
    "scenarios_of",
    "unsafe_policies",
]


@dataclass(frozen=True)
class SafetyRun:
    """One profile's check of one policy."""

    policy: str
    profile: str
    report: CheckReport

    @property
    def finding(self) -> Finding | None:
        failed = self.report.first_failure
        return failed.finding if failed is not None else None

    def failing(self) -> dict[str, str]:
        """Scenario -> the property it broke, for every failing scenario."""
        return {
            run.scenario: run.finding.primary.property
            for run in self.report.runs
            if run.finding is not None
        }

    def known(self) -> dict[str, KnownFinding]:
        """Failing scenario -> the known bug of the target it is, where it is one."""
        found = {}
        for scenario, prop in self.failing().items():
            finding = known_finding(self.report.target, scenario, self.profile, prop)
            if finding is not None:
                found[scenario] = finding
        return found

    @property
    def only_known(self) -> bool:
        """It failed, and every failure is a known bug of the target."""
        failing = self.failing()
        return bool(failing) and failing.keys() == self.known().keys()


def unsafe_policies(runs: Sequence[SafetyRun]) -> tuple[str, ...]:
    """The policies that broke a property under some profile, in order.

    A known bug of the target counts: the policy is unsafe on that version.
    """
    return tuple(dict.fromkeys(run.policy for run in runs if run.failing()))


def scenarios_of(target: Target, policy: CapturePolicy) -> tuple[str, ...]:
    """The scenarios a deployment with ``policy`` runs, that the target supports.

    ``dpsim check`` fits a fixed policy to every scenario (a drafter gets a
    decode length, ``ubatch`` gets microbatching), which tests settings the
    user did not choose. Here only what the policy turns on is run: drafter
    syncs when it speculates (decode length > 1), microbatched steps when it
    microbatches.
    """
    wanted = {"step", "profile"}
    if policy.decode_query_len > 1:
        wanted.add("drafter")
    if policy.microbatching is not None:
        wanted.add("ubatch")
    return tuple(name for name in scenarios_for(target) if name in wanted)


def check_policy(
    target: Target,
    name: str,
    policy: CapturePolicy,
    *,
    profiles: tuple[str, ...] = PROFILES,
    ranks: tuple[int, int],
    examples: int,
    seed: int,
) -> tuple[SafetyRun, ...]:
    """Run the suite once per profile with ``policy`` fixed."""
    return tuple(
        SafetyRun(
            name,
            profile,
            run_check(
                target,
                CheckOptions(
                    scenarios=scenarios_of(target, policy),
                    profile=profile,
                    ranks=ranks,
                    policy=policy,
                    examples=examples,
                    seed=seed,
                ),
            ),
        )
        for profile in profiles
    )
