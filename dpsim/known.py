"""What dpsim found in real vLLM, as data: which failures are known bugs.

docs/findings.md ("What dpsim found in real vLLM") examines each failing property
that unmodified releases show. A report that judges something else (a
capture policy, in ``dpsim policy validate``) uses this list to say when a
failure is one of those bugs of the chosen version rather than news about the
thing judged. Only an unmodified release matches: a source tree or a
``--target`` file may have fixed the bug, or added another with the same
symptom, so its failures are never excused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsim.targets.load import Target
from dpsim.targets.spec import ReleaseSpec

__all__ = ["KNOWN_FINDINGS", "KnownFinding", "known_finding"]


@dataclass(frozen=True)
class KnownFinding:
    """One examined bug of real releases, and the failures it shows as."""

    #: Its number in docs/findings.md.
    number: int
    summary: str
    #: Releases (major.minor) that have it.
    releases: tuple[str, ...]
    #: Properties it breaks.
    properties: tuple[str, ...]
    #: Scenarios it shows in; empty: any.
    scenarios: tuple[str, ...] = ()
    #: Generator profiles it shows under; empty: any.
    profiles: tuple[str, ...] = ()

    def describe(self, target: Target) -> str:
        return (
            f"known bug {self.number} of {target.label}: {self.summary} "
            f"(docs/findings.md, finding {self.number})"
        )


_V30_TO_V34 = ("0.30", "0.31", "0.32", "0.33", "0.34")

KNOWN_FINDINGS: tuple[KnownFinding, ...] = (
    KnownFinding(
        1,
        "need_eager is ignored when every rank votes to microbatch",
        _V30_TO_V34,
        ("eager-contagion",),
    ),
    KnownFinding(
        2,
        "vLLM 57020, a rank with an empty last microbatch replays a FULL "
        "microbatched graph",
        _V30_TO_V34,
        ("ubatch-split",),
    ),
    KnownFinding(
        3,
        "the drafter's reuse path re-dispatches with each rank's own request count",
        ("0.29", *_V30_TO_V34),
        ("no-hang", "eager-contagion"),
        scenarios=("drafter",),
        profiles=("contract",),
    ),
)


def known_finding(
    target: Target, scenario: str, profile: str, prop: str
) -> KnownFinding | None:
    """The known bug that failing ``prop`` in ``scenario`` is, on ``target``, or None."""
    if not isinstance(target.spec.base, ReleaseSpec) or target.spec.dp_utils_file:
        return None
    release = ".".join((target.version or "").split(".")[:2])
    for finding in KNOWN_FINDINGS:
        if (
            release in finding.releases
            and prop in finding.properties
            and (not finding.scenarios or scenario in finding.scenarios)
            and (not finding.profiles or profile in finding.profiles)
        ):
            return finding
    return None
