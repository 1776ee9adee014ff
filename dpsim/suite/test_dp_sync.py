"""The DP-sync property suite: one Hypothesis test per scenario.

Each test draws cases for the configured target and profile, runs them on
the simulator and asserts that every property holds. A failure shows the
shrunk counterexample as a per-rank table, writes it as a file and names the
command that replays it. Configure with ``--dpsim-*`` options or ``DPSIM_*``
variables (see :mod:`dpsim.pytest_plugin`). These are plain ``@given``
functions without fixtures, so HypoFuzz runs them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dpsim.pytest_plugin import current_suite, suite_options, suite_settings
from dpsim.suite.build import PropertyFailed, scenario_test


def _fail(failure: PropertyFailed) -> None:
    # The message is the per-rank table, the file and the replay command; a
    # traceback through the harness would only bury it.
    pytest.fail(str(failure), pytrace=False)


def _test(scenario: str) -> Callable[..., None]:
    return scenario_test(
        scenario,
        suite_settings(),
        current_suite,
        suite_options().database_key(scenario),
        on_failure=_fail,
    )


# One name per scenario of dpsim.scenarios.SCENARIOS (tests check the two agree).
test_step = _test("step")
test_drafter = _test("drafter")
test_profile = _test("profile")
test_ubatch = _test("ubatch")
