"""The suite's tests, built once here for every runner that executes them.

pytest (through ``dpsim.suite.test_dp_sync``), ``dpsim fuzz`` and HypoFuzz all
run the same Hypothesis test per scenario, under the same example-database
key, so a counterexample one of them saves is replayed first by the others.
The tests take no pytest fixtures (HypoFuzz does not collect tests that do):
what they run against comes from a callable, resolved on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context

from dpsim import cex
from dpsim.boundary import SearchStopped
from dpsim.coverage import suite as coverage_suite
from dpsim.errors import BoundaryError
from dpsim.properties import PROPERTY_NAMES, Verdict, judge
from dpsim.properties.base import Evidence
from dpsim.report import render_case_run
from dpsim.scenarios import PolicyRefused, run_case
from dpsim.scenarios.generate import cases, scenarios_for, seeded_draws_only
from dpsim.suite.config import SUITE_TEST, SuiteConfig


class PropertyFailed(AssertionError):
    """A case broke a property. On Hypothesis' final run it carries the report
    and the counterexample file; on the runs before it only the verdicts."""

    def __init__(
        self, message: str, verdicts: tuple[Verdict, ...], written: Path | None
    ) -> None:
        super().__init__(message)
        self.verdicts = verdicts
        self.written = written


#: Called after each judged case with its verdicts (empty when it held).
Observer = Callable[[str, tuple[Verdict, ...]], None]


def check_drawn_case(
    suite: SuiteConfig,
    scenario: str,
    data: st.DataObject,
    observe: Observer | None = None,
) -> None:
    """Draw one case of ``scenario``, run it, and raise PropertyFailed if broken."""
    target = suite.target
    if suite.lane != "sync":
        import pytest

        pytest.skip(
            f"a sync-lane scenario; --dpsim-lane {suite.lane} runs its own test"
        )
    if scenario not in scenarios_for(target):
        import pytest

        pytest.skip(f"{target.label} has no {scenario} scenario")
    case = data.draw(
        cases(
            target,
            scenario=scenario,
            profile=suite.profile,
            ranks=suite.ranks,
            policy=suite.policy,
        ),
        label="case",
    )
    try:
        with coverage_suite.running(scenario, suite.profile):
            result = run_case(target, case)
    except PolicyRefused:
        assume(False)
        return
    verdicts = tuple(judge(case, result))
    if observe is not None:
        observe(scenario, verdicts)
    if not verdicts:
        return
    if not current_build_context().is_final:
        # Shrinking runs the body hundreds of times; only the minimal case,
        # which Hypothesis runs last, is worth a file and a rendered table.
        raise PropertyFailed(str(verdicts[0]), verdicts, None)
    written = cex.save(target, case, result, verdicts, PROPERTY_NAMES, suite.out)
    report = render_case_run(
        f"{verdicts[0]} ({target.label})", case, Evidence(case, result)
    )
    raise PropertyFailed(
        f"{report}\n\ncounterexample: {written}\nreplay: dpsim replay {written}",
        verdicts,
        written,
    )


def scenario_test(
    scenario: str,
    config: settings,
    suite: Callable[[], SuiteConfig],
    key: bytes,
    *,
    on_failure: Callable[[PropertyFailed], None] | None = None,
    observe: Observer | None = None,
) -> Callable[..., None]:
    """One scenario's Hypothesis test: a plain ``@given`` function.

    ``on_failure`` turns a PropertyFailed into the runner's own failure (pytest
    shows the message alone); without it the exception propagates. A case
    dpsim cannot drive ends the test with
    :class:`~dpsim.boundary.SearchStopped`, carrying the one-line refusal.
    """

    @config
    @given(data=st.data())
    def test(data: st.DataObject) -> None:
        try:
            # The case is drawn in here: see seeded_draws_only.
            with seeded_draws_only():
                check_drawn_case(suite(), scenario, data, observe)
        except BoundaryError as error:
            # dpsim could not drive the case: out of the search at once,
            # neither shrunk nor saved (dpsim.boundary), an error not a failure.
            raise SearchStopped(error) from None
        except PropertyFailed as failure:
            if on_failure is None:
                raise
            caught = failure
        else:
            return
        # Outside the except block, so the runner's failure is not shown as
        # raised "during handling of" the first one.
        on_failure(caught)

    # Hypothesis derives a key from the function's source, identical for every
    # scenario built here, and pytest would add a path-dependent node id; a
    # fixed key is what lets every runner and checkout share one database.
    test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    setattr(test, SUITE_TEST, True)
    test.__name__ = test.__qualname__ = f"test_{scenario}"
    test.__doc__ = f"Every property holds in the {scenario} scenario."
    return test
