"""Shorter cases from a failing one: a count lowered and as many of what it counted deleted.

Hypothesis' shrinker edits a choice sequence one change at a time. A count a
strategy drew early (dpsim's ranks or steps) decides how many draws of some
kind follow it, so the shrinker cannot lower it alone: with the count one
lower, the last counted draw's choices are read as whatever comes next, or
dropped, and the failure goes with them when that last one was what failed
(it often is: the shrinker makes early choices simplest first). Its own fix-up
tries a lower count with one span or one choice after it deleted, which
cannot drop a rank from each of two steps. So a case of six ranks whose last
rank differs stays at six ranks.

:func:`recounts` proposes the two changes together: an integer choice ``v``
lowered to ``w``, and ``v - w`` occurrences deleted from every run of ``v``
of every label that occurs ``v`` times, or a multiple of ``v``, after it under
one parent span (what that count may have counted: ``v`` ranks a step): the
first ones or the last ones of each run, each as its span alone or as its
whole stretch up to the next occurrence (a step's draws run from one step's
first span to the next's); of all such labels together (a rank drawn once per
step, under a label per kind of step), then of each alone (a label repeated
as often by chance must not spoil the others). Which label is what
is not known here, only that a count and as many repeats go together; a
wrong guess is a case that passes, and costs one call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SpanAt:
    """Where one span of a choice sequence lies, as the engine records it."""

    label: int
    start: int
    end: int
    #: The index, among the case's spans, of the span directly around it.
    parent: int | None


@dataclass(frozen=True)
class Recount:
    """One candidate: the choice at ``index`` set to ``value``, and the
    choices at ``deleted`` removed."""

    index: int
    value: int
    deleted: frozenset[int]


def recounts(
    index: int, value: int, lower: Sequence[int], spans: Sequence[SpanAt]
) -> list[Recount]:
    """Candidates lowering the count ``value`` at ``index`` to each of
    ``lower`` (most reduction first), without repeats."""
    groups = _counted_after(index, value, spans) if value > 0 else []
    if not groups:
        return []
    choosings = (
        [groups, *([group] for group in groups)] if len(groups) > 1 else [groups]
    )
    found: dict[tuple[int, frozenset[int]], None] = {}
    for lowered in lower:
        cut = value - lowered
        if not 0 < cut <= value:
            continue
        for chosen in choosings:
            for deleted in _deletions(chosen, spans, value, cut):
                found.setdefault((lowered, deleted))
    return [Recount(index, lowered, deleted) for lowered, deleted in found]


def _counted_after(index: int, value: int, spans: Sequence[SpanAt]) -> list[list[int]]:
    """For each label seen a multiple of ``value`` times after ``index`` under
    one parent, those spans' positions, in order. Empty spans do not count:
    deleting one deletes nothing."""
    by_place: dict[tuple[int, int | None], list[int]] = defaultdict(list)
    for position, span in enumerate(spans):
        if span.start > index and span.end > span.start:
            by_place[span.label, span.parent].append(position)
    return [found for found in by_place.values() if len(found) % value == 0]


def _deletions(
    groups: list[list[int]], spans: Sequence[SpanAt], value: int, cut: int
) -> list[frozenset[int]]:
    """The choice positions to delete: in every run of ``value`` consecutive
    occurrences of every group (a step's ranks, when each step draws one per
    rank under the same label), the first or the last ``cut``, each as its
    span alone or as its stretch to the next occurrence."""
    found = []
    for first in (True, False):
        for stretch in (False, True):
            deleted: set[int] = set()
            for group in groups:
                for run in range(0, len(group), value):
                    chosen = (
                        range(run, run + cut)
                        if first
                        else range(run + value - cut, run + value)
                    )
                    for order in chosen:
                        span = spans[group[order]]
                        end = span.end
                        if stretch:
                            end = (
                                spans[group[order + 1]].start
                                if order + 1 < len(group)
                                else _parent_end(span, spans)
                            )
                        deleted.update(range(span.start, end))
            found.append(frozenset(deleted))
    return found


def _parent_end(span: SpanAt, spans: Sequence[SpanAt]) -> int:
    return span.end if span.parent is None else spans[span.parent].end
