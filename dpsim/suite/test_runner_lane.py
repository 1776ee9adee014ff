"""The runner lane's property test (``--dpsim-lane runner``; skipped otherwise).

vLLM's real engine loop, worker, model runner and speculators per virtual
rank, over generated request streams (:mod:`dpsim.lanes.runner.suite`).
"""

from __future__ import annotations

import pytest

from dpsim.lanes.runner.suite import runner_lane_test
from dpsim.pytest_plugin import current_suite, suite_options, suite_settings
from dpsim.suite.build import PropertyFailed


def _fail(failure: PropertyFailed) -> None:
    pytest.fail(str(failure), pytrace=False)


test_runner_lane = runner_lane_test(
    suite_settings(),
    current_suite,
    suite_options().database_key("runner-lane"),
    on_failure=_fail,
)
