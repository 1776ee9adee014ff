"""Marking a line or branch of the target unreachable, with the reason why.

An entry names what it marks by text, not by line number, since lines move
between releases: the file (as reports name it), the enclosing function, the
stripped text of the branch's line and of the line it would go to ("exit" for
leaving the function). A release range (a PEP 440 specifier on the target's
version) says where the reason holds. Reports list a matched branch apart,
with its reason, and do not count it as missing; an entry whose branch the
run did take is reported as reached (the reason is wrong there), and one that
matches nothing in a measured file as stale (the code moved on).

A mark may hold for some profiles only (``profiles``): a branch vLLM's own
callers never reach is unreachable under the caller profile, which draws only
what they pass, but the contract profile must reach it. Such a mark applies to
a set of cases only when every case was drawn under one of its profiles, so
a run of both profiles together reports the branch missing unless the
contract's cases took it.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from dpsim.errors import UsageError

from .scope import EXIT, Arc, ScopeAnalysis


@dataclass(frozen=True)
class Unreachable:
    """One line or branch the target cannot run, and why."""

    #: PEP 440 specifier on the target's version (">=0.26,<0.30"); "" for
    #: every target, a tree without a known version included.
    releases: str
    file: str
    function: str
    #: The branch's line (or the unreachable line), stripped.
    source: str
    #: The destination line, stripped; "exit" for leaving the function; None
    #: marks the line ``source`` itself.
    to: str | None
    reason: str
    #: The profiles whose cases cannot reach it (``("caller",)``); empty for
    #: every profile.
    profiles: tuple[str, ...] = ()

    def applies_to(self, version: str | None) -> bool:
        if not self.releases:
            return True
        if version is None:
            return False
        try:
            return Version(version) in SpecifierSet(self.releases)
        except (InvalidSpecifier, InvalidVersion) as error:
            raise UsageError(f"unreachable mark {self.shown}: {error}") from error

    def holds_for(self, profiles: tuple[str, ...]) -> bool:
        """Whether the mark explains a miss by cases of ``profiles`` (every
        profile the cases were drawn under)."""
        if not self.profiles:
            return True
        return bool(profiles) and all(name in self.profiles for name in profiles)

    @property
    def shown(self) -> str:
        where = f"{self.file} {self.function}: {self.source!r}"
        where = where if self.to is None else f"{where} -> {self.to!r}"
        if self.profiles:
            return f"{where} (profile {', '.join(self.profiles)})"
        return where


@dataclass(frozen=True)
class Marked:
    """What the marks that apply to one file matched in it."""

    #: Missing lines and branches a mark explains, with its reason.
    lines: dict[int, str]
    branches: dict[Arc, str]
    #: Marks whose line or branch the run did reach.
    reached: tuple[Unreachable, ...]
    #: Marks that match no line or branch of the file.
    stale: tuple[Unreachable, ...]


def match(
    analysis: ScopeAnalysis,
    marks: tuple[Unreachable, ...],
    version: str | None,
    executed_lines: frozenset[int],
    executed_branches: frozenset[Arc],
    profiles: tuple[str, ...] = (),
) -> Marked:
    """Which of ``analysis``' lines and branches ``marks`` explain, for cases
    drawn under ``profiles`` (a profile-bound mark applies only where it
    holds for all of them)."""
    lines: dict[int, str] = {}
    branches: dict[Arc, str] = {}
    reached: list[Unreachable] = []
    stale: list[Unreachable] = []
    for mark in marks:
        if mark.file != analysis.scope.display or not mark.applies_to(version):
            continue
        if not mark.holds_for(profiles):
            continue
        hit = False
        if mark.to is None:
            for line in sorted(analysis.statements):
                if _is(analysis, line, mark) and analysis.text(line) == mark.source:
                    hit = True
                    if line in executed_lines:
                        reached.append(mark)
                    else:
                        lines[line] = mark.reason
        else:
            for arc in sorted(analysis.branches):
                start, end = arc
                if (
                    _is(analysis, start, mark)
                    and analysis.text(start) == mark.source
                    and analysis.text(end) == mark.to
                ):
                    hit = True
                    if arc in executed_branches:
                        reached.append(mark)
                    else:
                        branches[arc] = mark.reason
        if not hit:
            stale.append(mark)
    return Marked(lines, branches, tuple(dict.fromkeys(reached)), tuple(stale))


def _is(analysis: ScopeAnalysis, line: int, mark: Unreachable) -> bool:
    return line != EXIT and analysis.function_at(line) == mark.function
