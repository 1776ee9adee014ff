"""The safety half of ``dpsim policy validate``: the property suite, policy fixed.

Why a module of its own: a policy is judged under both generator profiles,
and under ``contract`` every release so far fails for a reason that has
nothing to do with the policy (README, "What dpsim found", 1: a 0-token rank
in an eager step hangs). A user comparing policies needs that finding shown,
but told apart from a failure their policy causes; otherwise every policy
looks equally unsafe and the command is useless in CI.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsim.capture.policy import CapturePolicy
from dpsim.check import CheckOptions, CheckReport, Finding, run_check
from dpsim.scenarios import PROFILES
from dpsim.scenarios.generate import scenarios_for
from dpsim.targets.load import Target

__all__ = [
    "KNOWN_FINDING",
    "SafetyRun",
    "check_policy",
    "is_known_finding",
    "scenarios_of",
]

KNOWN_FINDING = (
    "known vLLM finding (README 'What dpsim found' 1): a 0-token rank in an "
    "eager step skips the forward while the others enter MoE collectives; "
    "vLLM's engine never passes 0 tokens, so this is not caused by the policy"
)


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

    @property
    def known(self) -> bool:
        """Every failing scenario shows the known finding, and nothing else."""
        findings = [run.finding for run in self.report.runs if run.finding]
        return bool(findings) and all(
            is_known_finding(self.profile, finding) for finding in findings
        )

    def failing(self) -> dict[str, str]:
        """Scenario -> the property it broke, for every failing scenario."""
        return {
            run.scenario: run.finding.primary.property
            for run in self.report.runs
            if run.finding is not None
        }


def is_known_finding(profile: str, finding: Finding) -> bool:
    """Whether a shrunk counterexample is the idle-rank eager hang.

    Recognised by its shape, not its message: a contract-profile case that
    fails ``no-hang`` with a step where one rank has no tokens and another
    has some. The caller profile never produces 0-token ranks, so it never
    matches there.
    """
    if profile != "contract" or finding.primary.property != "no-hang":
        return False
    return any(
        any(batch.num_tokens == 0 for batch in step)
        and any(batch.num_tokens > 0 for batch in step)
        for step in finding.case.steps
    )


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
