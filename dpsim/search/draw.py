"""Drawing one case from a Hypothesis strategy without Hypothesis' engine.

Hypothesis' :class:`ConjectureData` keeps, for every choice a strategy makes,
a node, a span record, a data-tree observation and a pooled constraints
dict: what its engine needs to mutate and shrink, and most of what a draw
costs. :class:`FastData` keeps only the choices themselves. The values still
come from Hypothesis' own provider with the same constraints, and the same
limits end a draw (the choice buffer's size, the depth bound, an empty
strategy), so Hypothesis' engine replaying the recorded choices draws the
same case: that is what lets a failing case found here be shrunk there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from enum import Enum
from random import Random
from typing import Any, NoReturn, TypeVar

from hypothesis.errors import UnsatisfiedAssumption
from hypothesis.strategies import SearchStrategy, integers, just, one_of, sampled_from

from dpsim.search import blank
from dpsim.search.integers import draw_integer, lean
from dpsim.search.internals import (
    BUFFER_SIZE,
    MAX_DEPTH,
    BuildContext,
    ConjectureData,
    InterestingOrigin,
    Status,
    StopTest,
    choice_size,
    unwrap_strategies,
)

T = TypeVar("T")

#: A recorded choice sequence: what Hypothesis' engine replays.
Choices = tuple[Any, ...]


class FastData(ConjectureData):
    """A ConjectureData that records the choices drawn and nothing else.

    ``replay``: choices taken first, in place of the provider's, as
    Hypothesis' engine does with a prefix (:mod:`dpsim.search.fast` replays an
    earlier case's first part this way). When ``replay`` is exactly what the
    first nested draw took before (drawn or replayed), and what that draw
    gave is immutable, the value is handed back again without drawing it:
    the same strategy given the same choices gives the same value
    (Hypothesis' replay and shrinking rest on that too), and redrawing a
    case's policy cost about a fifth of drawing the case.
    """

    def __init__(self, random: Random, replay: Choices = ()) -> None:
        if blank.READY:
            # What ConjectureData.__init__ sets, from constants made once.
            blank.fill(self, random)
        else:
            super().__init__(random=random)  # pragma: no cover - another Hypothesis
        self.drawn: list[Any] = []
        self.replay = replay
        #: How many choices the first draw nested in the top-level one took
        #: (a case's policy): None until it ends.
        self.first_part: int | None = None
        #: Whether integer choices take the lean path (dpsim.search.integers).
        self.lean = lean(self.provider)

    def draw_integer(
        self,
        min_value: int | None = None,
        max_value: int | None = None,
        *,
        weights: dict[int, float] | None = None,
        shrink_towards: int = 0,
        forced: int | None = None,
        observe: bool = True,
    ) -> int:
        if shrink_towards or forced is not None or not self.lean:
            return super().draw_integer(
                min_value,
                max_value,
                weights=weights,
                shrink_towards=shrink_towards,
                forced=forced,
                observe=observe,
            )
        if observe:
            return self._choose(min_value, max_value, weights)
        # A weighted choice's outcome: drawn, never replayed or recorded.
        return draw_integer(self, min_value, max_value, weights)

    def _choose(
        self,
        min_value: int | None,
        max_value: int | None,
        weights: dict[int, float] | None,
    ) -> int:
        """An observed integer choice, neither forced nor shrinking towards
        anything but 0: the one every ``sampled_from``, ``integers`` and
        ``one_of`` makes, which :meth:`draw` asks for directly."""
        if not self.lean or len(self.drawn) < len(self.replay):
            return super().draw_integer(min_value, max_value, weights=weights)
        # The commonest choice by far: drawn as the provider draws it, and
        # recorded as _draw records it, without building the constraints
        # dict (dpsim.search.integers).
        value = draw_integer(self, min_value, max_value, weights)
        self._record(value)
        return value

    def draw_boolean(
        self,
        p: float = 0.5,
        *,
        forced: bool | None = None,
        observe: bool = True,
    ) -> bool:
        if (
            forced is not None
            or not self.lean
            or (observe and len(self.drawn) < len(self.replay))
        ):
            return super().draw_boolean(p, forced=forced, observe=observe)
        # The provider's own draw, recorded as _draw records it, without the
        # constraints dict and the lookup of the provider's method by name
        # (unobserved: a weighted integer's sampler, never replayed).
        value = self.provider.draw_boolean(p)
        if observe:
            self._record(value)
        return value

    def _pooled_constraints(self, choice_type: Any, constraints: Any) -> Any:
        # Pooling only saves memory across the engine's many stored cases.
        return constraints

    def _draw(
        self,
        choice_type: str,
        constraints: Any,
        *,
        observe: bool,
        forced: Any,
    ) -> Any:
        if observe and len(self.drawn) < len(self.replay):
            # The same choices down the same strategies: the constraints
            # are those the replayed value was drawn under.
            value = self.replay[len(self.drawn)] if forced is None else forced
        elif forced is None:
            value = getattr(self.provider, f"draw_{choice_type}")(**constraints)
        else:
            value = forced
        if observe:
            self._record(value)
        return value

    def _record(self, value: Any) -> None:
        """Keep an observed choice, and overrun where the engine would: past
        this many bytes of choices it draws no case, so neither may this."""
        # Hypothesis' choice_size, worked out here for an integer of under
        # 64 bits (nearly every choice: a byte of metadata, and a byte of
        # size plus the value's whole bytes of bits).
        if type(value) is int and (bits := value.bit_length()) < 64:
            self.length += 2 + bits // 8
        else:
            self.length += choice_size(value)
        if self.length > BUFFER_SIZE:
            self.conclude_test(Status.OVERRUN)
        self.drawn.append(value)

    def start_span(self, label: int) -> None:
        self.depth += 1

    def stop_span(self, *, discard: bool = False) -> None:
        self.depth -= 1

    def draw(
        self,
        strategy: SearchStrategy[T],
        label: int | None = None,
        observe_as: str | None = None,
    ) -> T:
        if self.depth == 1 and not self.drawn and label != _FIRST_PART:
            return self._first_part(strategy)
        # Every draw's body, here rather than in a method of its own: a case
        # draws some forty times, and a call was a tenth of a draw.
        entry = _READY.get(id(strategy))
        if entry is None or entry[0] is not strategy:
            entry = _ready(strategy, self)
        if self.depth >= MAX_DEPTH:
            self.conclude_test(Status.INVALID)
        self.depth += 1
        try:
            how, facts = entry[2], entry[3]
            if how is _BY_INDEX:
                # A sampled_from with no map or filter: what its do_draw
                # comes to when its first index is accepted, as it always
                # is without a filter (one index choice, that element).
                return facts[self._choose(0, len(facts) - 1, None)]
            if how is _BY_BOUNDS:
                # integers: the one choice its do_draw makes, with the
                # bounds and weights it asked for when first drawn.
                return self._choose(*facts)  # type: ignore[return-value]
            if how is _BY_BRANCH:
                return self._branch(facts)
            return entry[1].do_draw(self)
        finally:
            self.depth -= 1
            if self.depth == 1 and self.first_part is None:
                self.first_part = len(self.drawn)

    def _first_part(self, strategy: SearchStrategy[T]) -> T:
        """The first draw nested in the top-level one: a case's first part."""
        if self.replay:
            kept = _FIRST_PARTS.get((id(strategy), self.replay))
            if kept is not None and kept[0] is strategy:
                self.drawn.extend(self.replay)
                self.length += kept[2]
                self.first_part = len(self.replay)
                return kept[1]
        value = self.draw(strategy, _FIRST_PART)
        # Kept whether drawn or replayed: the first replay of a first part
        # drawn anew is as common as any later one.
        first = tuple(self.drawn)
        if (not self.replay or first == self.replay) and _immutable(value):
            if len(_FIRST_PARTS) >= _FIRST_PARTS_MAX:
                _FIRST_PARTS.clear()
            _FIRST_PARTS[(id(strategy), first)] = (strategy, value, self.length)
        return value

    def _branch(self, branches: Sequence[SearchStrategy[T]]) -> T:
        """What ``OneOfStrategy.do_draw`` does with these element
        strategies (none of which can become empty mid-draw): draw the
        branch's index from a sampled_from of them, one level down, then
        the branch; a single branch is drawn without an index."""
        if len(branches) == 1:
            return self.draw(branches[0])
        if self.depth >= MAX_DEPTH:
            self.conclude_test(Status.INVALID)
        return self.draw(branches[self._choose(0, len(branches) - 1, None)])

    def conclude_test(
        self,
        status: Status,
        interesting_origin: InterestingOrigin | None = None,
    ) -> NoReturn:
        self.status = status
        raise StopTest(self.testcounter)


#: The label :meth:`FastData._first_part` draws its strategy with, which no
#: Hypothesis label is (they are never negative): the draw's own body, not
#: the first part again.
_FIRST_PART = -1

#: First parts drawn from replayed choices, by the strategy's id and the
#: choices: the strategy (kept, so that its id cannot be reused while its
#: entry stands), the value, and the buffer length its choices took.
_FIRST_PARTS: dict[tuple[int, Choices], tuple[SearchStrategy[Any], Any, int]] = {}
_FIRST_PARTS_MAX = 1024


def _immutable(value: Any) -> bool:
    """Whether ``value`` is built only of values nobody can change (so one
    can be handed to many cases): None, numbers, strings, enum members, and
    tuples, frozensets and frozen dataclasses of them."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, Enum)):
        return True
    if type(value) in (tuple, frozenset):
        return all(_immutable(item) for item in value)
    params = getattr(type(value), "__dataclass_params__", None)
    if params is not None and params.frozen:
        return all(_immutable(getattr(value, f.name)) for f in fields(value))
    return False


#: The classes of a plain ``sampled_from`` (mapped or filtered or not), of
#: ``just`` (a one-element sampled_from) and of what ``integers`` wraps:
#: tests/test_search_fast.py checks that they validate nothing and are never
#: empty.
SAMPLED_FROM = type(sampled_from((False, True)))
JUST = type(just(None))
INTEGERS = type(unwrap_strategies(integers(0, 1)))
_PLAIN = frozenset((SAMPLED_FROM, JUST, INTEGERS))
ONE_OF = type(one_of(just(False), just(True)))

#: How :meth:`FastData.draw` draws a ready strategy: by one index
#: into its elements (a sampled_from with no map or filter), by one integer
#: choice within its bounds (integers), by a branch of its elements
#: (one_of), or through its own ``do_draw``. Each takes what Hypothesis'
#: ``do_draw`` would take, without the calls in between (a case draws some
#: sixty times, and those calls were a third of a draw).
_BY_INDEX = "index"
_BY_BOUNDS = "bounds"
_BY_BRANCH = "branch"
_BY_DO_DRAW = "do_draw"

#: A ready strategy: the strategy (kept, so that its id cannot be reused
#: while its entry stands), the strategy it unwraps to, how it is drawn and
#: what that needs (the elements, the integer choice's arguments, the
#: branches; None for do_draw).
Entry = tuple[SearchStrategy[Any], SearchStrategy[Any], str, Any]

#: Strategies already validated and found not empty, by id. Hypothesis
#: keeps the same facts on the strategy, but asking it costs a thread
#: lookup, two property calls and an unwrap on every draw (about a quarter
#: of a cached integer draw).
_READY: dict[int, Entry] = {}
#: Entries kept at most: a step's palette is a new strategy every time, so
#: the table is emptied when full rather than left to grow.
_READY_MAX = 4096


def _ready(strategy: SearchStrategy[Any], data: FastData) -> Entry:
    """``strategy`` validated (what Hypothesis' own draw does first), and
    its ``_READY`` entry; an empty strategy ends the draw as invalid."""
    known = _known_ready(strategy)
    if known:
        # Nothing to validate, and never empty (a sampled_from's constructor
        # refuses an empty sequence, and a filter that rejects every element
        # ends the draw itself; integers' bounds are checked when built). A
        # step's palette is a new sampled_from every time, as is the branch
        # chooser of every new one_of, and mid-draw integer bounds give new
        # integers (dpsim.capture.once): working both facts out through
        # Hypothesis' recursive-property machinery cost about four draws,
        # and validating a new one_of of such branches about twenty.
        target: SearchStrategy[Any] = strategy
    else:
        strategy.validate()
        if strategy.is_empty:
            data.conclude_test(Status.INVALID)
        target = unwrap_strategies(strategy)
    how, facts = _how_drawn(target, known)
    if len(_READY) >= _READY_MAX:
        _READY.clear()
    entry = _READY[id(strategy)] = (strategy, target, how, facts)
    return entry


def _how_drawn(target: SearchStrategy[Any], known: bool) -> tuple[str, Any]:
    """How :meth:`FastData.draw` draws ``target`` (an unwrapped,
    validated strategy; ``known``: by :func:`_known_ready`), and what that
    needs."""
    kind = type(target)
    if kind is SAMPLED_FROM and not target._transformations:  # type: ignore[attr-defined]
        return _BY_INDEX, target.elements  # type: ignore[attr-defined]
    if kind is INTEGERS:
        asked = _integer_asked(target)
        if asked is not None:
            return _BY_BOUNDS, asked
    if kind is ONE_OF:
        branches = (
            _known_elements(target) if known else target.element_strategies  # type: ignore[attr-defined]
        )
        # A branch that can become empty mid-draw (a stateful Bundle) makes
        # one_of filter its branches on every draw: left to its do_draw.
        if all(
            type(branch).is_currently_empty is SearchStrategy.is_currently_empty
            for branch in branches
        ):
            return _BY_BRANCH, tuple(branches)
    return _BY_DO_DRAW, None


def _known_elements(one_of: SearchStrategy[Any]) -> list[SearchStrategy[Any]]:
    """``one_of.element_strategies`` for a one_of of known branches
    (:func:`_known_ready`): the same flattening of its branches' branches,
    each once, without asking whether a known one is empty (it is not; a
    nested one_of's branches leave out its empty ones). Asking cost a
    recursive-property walk per branch of each new one_of, about one a
    case."""
    seen: set[SearchStrategy[Any]] = {one_of}
    elements = []
    for branch in one_of.original_strategies:  # type: ignore[attr-defined]
        filtered = type(branch) is ONE_OF
        for element in branch.branches:
            if element not in seen and (
                filtered or type(element) in _PLAIN or not element.is_empty
            ):
                seen.add(element)
                elements.append(element)
    return elements


class _Asked:
    """Stands in for the data object while an integers strategy's
    ``do_draw`` makes its one choice, to keep what it asks for (its bounds,
    and the weights it puts on their ends, built per draw by Hypothesis)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def draw_integer(self, *args: Any, **kwargs: Any) -> int:
        self.calls.append((args, kwargs))
        return 0


def _integer_asked(
    target: SearchStrategy[Any],
) -> tuple[int | None, int | None, dict[int, float] | None] | None:
    """The ``min_value``, ``max_value`` and ``weights`` that ``target``'s
    ``do_draw`` draws its integer with, when that is all it does (one
    choice, by keyword, nothing else); else None, and it is drawn through
    ``do_draw``."""
    asked = _Asked()
    try:
        target.do_draw(asked)  # type: ignore[arg-type]
    except AttributeError:  # pragma: no cover - another Hypothesis' do_draw
        return None
    if len(asked.calls) != 1:  # pragma: no cover - another Hypothesis' do_draw
        return None
    args, kwargs = asked.calls[0]
    if args or not kwargs.keys() <= {"min_value", "max_value", "weights"}:
        return None  # pragma: no cover - another Hypothesis' do_draw
    return kwargs.get("min_value"), kwargs.get("max_value"), kwargs.get("weights")


def _known_ready(strategy: SearchStrategy[Any]) -> bool:
    """Whether ``strategy`` is known valid and not empty without asking
    Hypothesis: a plain one, or a ``one_of`` of known ones. A one_of
    validates by validating its branches, and is empty only when they all
    are (``OneOfStrategy.do_validate`` and ``calc_is_empty``); a branch drawn
    before (so validated then) is known too."""
    kind = type(strategy)
    if kind in _PLAIN:
        return True
    if kind is ONE_OF:
        return all(
            _known_ready(branch) or _READY.get(id(branch), (None,))[0] is branch
            for branch in strategy.original_strategies  # type: ignore[attr-defined]
        )
    return False


def draw(
    strategy: SearchStrategy[T], random: Random, replay: Choices = ()
) -> tuple[T, Choices, FastData] | None:
    """One value of ``strategy``, the choices it took and the data object
    (:func:`context` runs the case's test in it); None when the draw was
    rejected (a filter or ``assume`` gave up, or the choices overran).
    ``replay``'s choices are taken first (:class:`FastData`)."""
    data = FastData(random, replay)
    with context(data):
        drawn = draw_in(data, strategy)
    return None if drawn is None else (drawn[0], drawn[1], data)


def draw_in(data: FastData, strategy: SearchStrategy[T]) -> tuple[T, Choices] | None:
    """One value of ``strategy`` drawn in ``data``, inside its
    :func:`context` (which the case's test may then run in too, as
    Hypothesis runs a draw and its test in one), and the choices it took;
    None when the draw was rejected."""
    try:
        value = data.draw(strategy)
    except StopTest as stop:
        if stop.testcounter != data.testcounter:
            raise
        return None
    except UnsatisfiedAssumption:
        return None
    return value, tuple(data.drawn)


def context(data: ConjectureData) -> BuildContext:
    """What Hypothesis enters around a draw and its test: ``reject()``,
    ``assume()`` and ``note()`` work inside it as inside ``@given``."""
    return BuildContext(data, wrapped_test=None)  # type: ignore[arg-type]
