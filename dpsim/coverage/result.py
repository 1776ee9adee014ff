"""What a measured run covered of the target: in total, per profile, per context.

:class:`CoverageResult` holds, per context and scoped file, the executed
lines and branches (already restricted to the scope); everything else (what
could run, what is missing, what the unreachable marks explain) is derived
from the source on demand, so a result crosses a process boundary as a small
JSON object (:meth:`CoverageResult.to_json`) and comes back whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .marks import Marked, Unreachable, match
from .scope import Arc, Scope, ScopeAnalysis, analyse

#: (scenario, profile) -> scoped file path -> (executed lines, executed branches).
Contexts = dict[tuple[str, str], dict[str, tuple[frozenset[int], frozenset[Arc]]]]


@dataclass(frozen=True)
class FileCoverage:
    """One scoped file: what could run, what ran, what never did."""

    analysis: ScopeAnalysis
    executed_lines: frozenset[int]
    executed_branches: frozenset[Arc]
    marked: Marked

    @property
    def scope(self) -> Scope:
        return self.analysis.scope

    @property
    def display(self) -> str:
        return self.analysis.scope.display

    @property
    def executable_lines(self) -> frozenset[int]:
        return self.analysis.statements

    @property
    def branches(self) -> frozenset[Arc]:
        return self.analysis.branches

    @property
    def unreachable_lines(self) -> dict[int, str]:
        """Lines never run that a mark explains, with its reason."""
        return self.marked.lines

    @property
    def unreachable_branches(self) -> dict[Arc, str]:
        return self.marked.branches

    @property
    def missing_lines(self) -> frozenset[int]:
        """Lines never run and not marked unreachable."""
        return self.executable_lines - self.executed_lines - self.marked.lines.keys()

    @property
    def missing_branches(self) -> frozenset[Arc]:
        """Branches never taken, not marked unreachable, from lines that ran (a
        line that never ran is missing already; its branches say no more)."""
        return frozenset(
            arc
            for arc in self.branches - self.executed_branches
            if arc not in self.marked.branches and arc[0] in self.executed_lines
        )

    @property
    def unrun_branches(self) -> frozenset[Arc]:
        """Branches of lines that never ran (not marked unreachable)."""
        return frozenset(
            arc
            for arc in self.branches - self.executed_branches
            if arc not in self.marked.branches and arc[0] not in self.executed_lines
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.display,
            "path": self.scope.path,
            "functions": [function.name for function in self.analysis.functions],
            "lines": len(self.executable_lines),
            "lines_executed": len(self.executed_lines),
            "branches": len(self.branches),
            "branches_executed": len(self.executed_branches),
            "missing_lines": sorted(self.missing_lines),
            "missing_branches": [list(arc) for arc in sorted(self.missing_branches)],
            "unrun_branches": [list(arc) for arc in sorted(self.unrun_branches)],
            "unreachable_lines": {
                str(line): reason
                for line, reason in sorted(self.unreachable_lines.items())
            },
            "unreachable_branches": {
                f"{start}->{end}": reason
                for (start, end), reason in sorted(self.unreachable_branches.items())
            },
            "marked_but_reached": [mark.shown for mark in self.marked.reached],
            "stale_marks": [mark.shown for mark in self.marked.stale],
        }


@dataclass(frozen=True)
class CoverageResult:
    """Target coverage of one run: per (scenario, profile) and in total."""

    scopes: tuple[Scope, ...]
    version: str | None
    contexts: Contexts
    #: The unreachable marks applied (None: :data:`~dpsim.coverage.unreachable.UNREACHABLE`).
    marks: tuple[Unreachable, ...] | None = None

    @classmethod
    def of(
        cls,
        scopes: tuple[Scope, ...],
        version: str | None,
        contexts: Contexts,
        marks: tuple[Unreachable, ...] | None = None,
    ) -> CoverageResult:
        return cls(scopes, version, contexts, marks)

    @cached_property
    def files(self) -> tuple[FileCoverage, ...]:
        """Every scoped file over the whole run, in scope order (a mark bound
        to profiles applies only if it holds for every profile run; cases
        counted to no profile do not restrict the marks)."""
        return self._files(self.contexts.values(), self.profiles)

    def context(self, scenario: str, profile: str) -> tuple[FileCoverage, ...]:
        """Every scoped file over one (scenario, profile)'s cases."""
        return self._files([self.contexts.get((scenario, profile), {})], (profile,))

    def profile(self, name: str) -> tuple[FileCoverage, ...]:
        """Every scoped file over one profile's cases, every scenario's."""
        return self._files(
            [files for (_, profile), files in self.contexts.items() if profile == name],
            (name,),
        )

    @property
    def context_keys(self) -> tuple[tuple[str, str], ...]:
        """The (scenario, profile) pairs measured (not the unnamed one)."""
        return tuple(key for key in self.contexts if key != ("", ""))

    @property
    def profiles(self) -> tuple[str, ...]:
        """The profiles measured, in the order first run (not the unnamed one)."""
        return tuple({profile: None for _, profile in self.context_keys if profile})

    def _files(
        self,
        contexts: Iterable[dict[str, tuple[frozenset[int], frozenset[Arc]]]],
        profiles: tuple[str, ...],
    ) -> tuple[FileCoverage, ...]:
        chosen = list(contexts)
        marks = self._marks()
        found = []
        for scope in self.scopes:
            lines: set[int] = set()
            arcs: set[Arc] = set()
            for files in chosen:
                ran, taken = files.get(scope.path, (frozenset(), frozenset()))
                lines |= ran
                arcs |= taken
            analysis = analyse(scope)
            executed_lines, executed_arcs = frozenset(lines), frozenset(arcs)
            found.append(
                FileCoverage(
                    analysis,
                    executed_lines,
                    executed_arcs,
                    match(
                        analysis,
                        marks,
                        self.version,
                        executed_lines,
                        executed_arcs,
                        profiles,
                    ),
                )
            )
        return tuple(found)

    def _marks(self) -> tuple[Unreachable, ...]:
        if self.marks is not None:
            return self.marks
        from .unreachable import UNREACHABLE

        return UNREACHABLE

    def merged(self, other: CoverageResult) -> CoverageResult:
        """Both runs' executed lines and branches together (same target)."""
        contexts: Contexts = {key: dict(files) for key, files in self.contexts.items()}
        for key, files in other.contexts.items():
            mine = contexts.setdefault(key, {})
            for path, (lines, arcs) in files.items():
                had_lines, had_arcs = mine.get(path, (frozenset(), frozenset()))
                mine[path] = (had_lines | lines, had_arcs | arcs)
        scopes = tuple(dict.fromkeys(self.scopes + other.scopes))
        return CoverageResult(scopes, self.version, contexts, self.marks)

    def to_json(self) -> dict[str, Any]:
        """Totals, each profile's files in full (what it reached, what its
        marks explain, what is missing), per-context figures (what
        ``--json`` prints) plus the raw executed sets (what :meth:`from_json`
        reads back)."""
        return {
            "version": self.version,
            "files": [file.to_json() for file in self.files],
            "profiles": [
                {
                    "profile": profile,
                    "files": [file.to_json() for file in self.profile(profile)],
                }
                for profile in self.profiles
            ],
            "contexts": [
                {
                    "scenario": scenario,
                    "profile": profile,
                    "files": [
                        {
                            "file": file.display,
                            "lines_executed": len(file.executed_lines),
                            "branches_executed": len(file.executed_branches),
                            "missing_lines": sorted(file.missing_lines),
                            "missing_branches": [
                                list(arc) for arc in sorted(file.missing_branches)
                            ],
                        }
                        for file in self.context(scenario, profile)
                    ],
                }
                for scenario, profile in self.context_keys
            ],
            "raw": {
                "scopes": [
                    {
                        "path": scope.path,
                        "display": scope.display,
                        "functions": list(scope.functions)
                        if scope.functions is not None
                        else None,
                    }
                    for scope in self.scopes
                ],
                "contexts": [
                    {
                        "scenario": scenario,
                        "profile": profile,
                        "files": {
                            path: {
                                "lines": sorted(lines),
                                "arcs": [list(arc) for arc in sorted(arcs)],
                            }
                            for path, (lines, arcs) in sorted(files.items())
                        },
                    }
                    for (scenario, profile), files in self.contexts.items()
                ],
            },
        }

    @classmethod
    def from_json(
        cls, data: dict[str, Any], marks: tuple[Unreachable, ...] | None = None
    ) -> CoverageResult:
        raw = data["raw"]
        scopes = tuple(
            Scope(
                item["path"],
                item["display"],
                tuple(item["functions"]) if item["functions"] is not None else None,
            )
            for item in raw["scopes"]
        )
        contexts: Contexts = {
            (item["scenario"], item["profile"]): {
                path: (
                    frozenset(files["lines"]),
                    frozenset((start, end) for start, end in files["arcs"]),
                )
                for path, files in item["files"].items()
            }
            for item in raw["contexts"]
        }
        return cls(scopes, data["version"], contexts, marks)
