"""What the suite runs against: the user's spelling, and what it resolves to.

Kept apart from the tests themselves, and free of heavy imports, because the
pytest plugin imports it in every pytest session of an environment that has
dpsim; torch and the target are loaded only when a suite test first runs.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpsim.errors import UsageError
from dpsim.lanes import LANES
from dpsim.options import lane_runner, parse_ranks, parse_runner
from dpsim.records.case import PROFILES

if TYPE_CHECKING:
    from dpsim.records.policy import CapturePolicy
    from dpsim.targets.load import Target

#: Bumped when the meaning of a stored example changes, so old ones are not
#: replayed as unrelated cases.
KEY_VERSION = 1

#: The attribute that marks a function as one of the suite's scenario tests,
#: which dpsim's pytest plugin runs in a child process.
SUITE_TEST = "_dpsim_suite_test"


@dataclass(frozen=True)
class SuiteConfig:
    """What the property suite runs against, resolved once per process."""

    target: Target
    policy: CapturePolicy | None
    profile: str
    ranks: tuple[int, int]
    out: Path
    #: ``sync`` (the scenario tests run) or ``runner`` (the runner lane's test).
    lane: str = "sync"


@dataclass(frozen=True)
class SuiteOptions:
    """The suite's settings as a user spells them (flags or environment)."""

    vllm: str | None = None
    target: str | None = None
    #: ``v1`` or ``v2``; None: the target's default runner.
    runner: str | None = None
    #: V1 only: a ``gpu_model_runner.py`` whose caller method runs.
    caller_file: str | None = None
    policy: str | None = None
    profile: str = "caller"
    ranks: str = "2..16"
    out: str = "dpsim-out"
    #: ``sync`` or ``runner`` (see :mod:`dpsim.lanes`).
    lane: str = "sync"

    def validate(self) -> None:
        """Refuse a bad profile, runner or lane when the session starts; the
        ranks are parsed when the suite first resolves (:func:`resolve`)."""
        parse_runner(self.runner, "runner")
        if self.lane not in LANES:
            raise UsageError(f"lane {self.lane!r}: expected one of {', '.join(LANES)}")
        if self.lane == "runner" and self.target:
            raise UsageError("--dpsim-lane runner: --dpsim-target is the sync lane's")
        if self.profile not in PROFILES:
            raise UsageError(
                f"profile {self.profile!r}: expected one of {', '.join(PROFILES)}"
            )

    def database_key(self, scenario: str) -> bytes:
        """The example-database key of one scenario's test.

        The target is left out on purpose: a failure found on one tree must be
        replayed on the next (a fix deletes it). What shapes the generated
        cases is kept in, so one configuration never replays, and then
        deletes as stale, another's counterexamples. A V1 runner named
        explicitly adds a part (its cases are other calls); V2's keys, and a
        default runner's, stay as they were before dpsim knew V1.
        """
        low, high = parse_ranks(self.ranks)
        policy = "any"
        if self.policy:
            try:
                content = Path(self.policy).read_bytes()
            except OSError:
                content = self.policy.encode()
            policy = hashlib.sha256(content).hexdigest()[:16]
        runner = "/runner-v1" if self.runner == "v1" else ""
        return (
            f"dpsim-suite/v{KEY_VERSION}/{scenario}/{self.profile}/"
            f"{low}..{high}/{policy}{runner}"
        ).encode()


@functools.lru_cache(maxsize=8)
def resolve(options: SuiteOptions) -> SuiteConfig:
    """Load the target and policy once per process and configuration."""
    from dpsim.capture.policy_files import load_policy
    from dpsim.targets import load_target

    options.validate()
    return SuiteConfig(
        target=load_target(
            options.vllm,
            options.target,
            runner=lane_runner(options.lane, options.runner),
            caller_file=options.caller_file,
        ),
        policy=load_policy(Path(options.policy)) if options.policy else None,
        profile=options.profile,
        ranks=parse_ranks(options.ranks),
        out=Path(options.out),
        lane=options.lane,
    )
