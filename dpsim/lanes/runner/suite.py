"""The runner lane's test in the pytest suite (``--dpsim-lane runner``).

One Hypothesis test, drawn like ``dpsim check --lane runner``'s cases
(:func:`~dpsim.lanes.runner.check.runner_cases`), under the suite's settings
and example database; on Hypothesis' final run a failing case is written as a
runner case file and the message names the replay command. Under the sync
lane (the default) it skips, as the scenario tests skip under the runner lane.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context

from dpsim.boundary import SearchStopped
from dpsim.errors import BoundaryError
from dpsim.properties import RUNNER_LANE_PROPERTIES, judge
from dpsim.scenarios.generate import seeded_draws_only
from dpsim.suite.build import Observer, PropertyFailed
from dpsim.suite.config import SUITE_TEST, SuiteConfig

from .case import RunnerCaseFile
from .check import runner_cases
from .run import run_runner_case

#: The runner lane's one test, as ``dpsim fuzz`` names it beside the
#: scenarios, and the suite's database key names it.
RUNNER_LANE_TEST = "runner-lane"


def runner_lane_test(
    config: settings,
    suite: Callable[[], SuiteConfig],
    key: bytes,
    *,
    on_failure: Callable[[PropertyFailed], None] | None = None,
    observe: Observer | None = None,
) -> Callable[..., None]:
    """The test; ``on_failure`` turns a PropertyFailed into the runner's own
    failure (without it the exception propagates, as ``dpsim fuzz`` wants),
    ``observe`` is told each case's verdicts under the name ``runner-lane``
    (``dpsim fuzz`` counts cases and stops between them with it)."""

    @config
    @given(data=st.data())
    def test(data: st.DataObject) -> None:
        configured = suite()
        if configured.lane != "runner":
            import pytest

            pytest.skip("the runner lane's test; run it with --dpsim-lane runner")
        if configured.policy is not None:
            from .commands import refuse_unmodelled

            refuse_unmodelled(configured.policy, "--dpsim-policy")
        with seeded_draws_only():
            cases = runner_cases(
                ranks=configured.ranks,
                policy=configured.policy,
                runner=configured.target.runner,
            )
            case = data.draw(cases, label="case")
        try:
            run = run_runner_case(configured.target, case)
        except BoundaryError as error:
            # The lane could not drive the case: out of the search at once,
            # neither shrunk nor saved (dpsim.boundary), an error not a failure.
            raise SearchStopped(error) from None
        properties = tuple(RUNNER_LANE_PROPERTIES.values())
        verdicts = tuple(judge(case, run.result, properties))
        if observe is not None:
            observe(RUNNER_LANE_TEST, verdicts)
        if not verdicts:
            return
        if not current_build_context().is_final:
            raise PropertyFailed(str(verdicts[0]), verdicts, None)
        from .commands import render_case, target_record

        written = RunnerCaseFile(
            target=target_record(configured.target),
            case=case,
            properties=tuple(prop.name for prop in properties),
            verdicts=tuple(verdict.to_dict() for verdict in verdicts),
            outcome=run.result.outcome.value,
            trace=run.result.to_dict(),
        ).write(configured.out)
        failure = PropertyFailed(
            f"{render_case(str(verdicts[0]), case, run)}\n\n"
            f"counterexample: {written}\nreplay: dpsim replay {written}",
            verdicts,
            written,
        )
        if on_failure is None:
            raise failure
        on_failure(failure)

    test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    setattr(test, SUITE_TEST, True)
    test.__name__ = test.__qualname__ = "test_runner_lane"
    test.__doc__ = "Every runner-lane property holds on vLLM's real callers."
    return test
