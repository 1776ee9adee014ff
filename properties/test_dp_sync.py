"""The DP-sync property suite, as Hypothesis tests.

One test per scenario: each draws cases for the configured target and profile,
runs them on the simulator and asserts that every property holds. A failure
shows the shrunk counterexample as a per-rank table, writes it as a file and
names the command that replays it. Configure with ``--dpsim-*`` options or
``DPSIM_*`` variables (see ``dpsim.pytest_plugin``).
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dpsim import cex
from dpsim.properties import PROPERTY_NAMES, judge
from dpsim.properties.base import Evidence
from dpsim.pytest_plugin import SuiteConfig
from dpsim.report import render_case_run
from dpsim.scenarios import SCENARIOS, PolicyRefused, run_case
from dpsim.scenarios.generate import cases, scenarios_for


@pytest.mark.parametrize("scenario", SCENARIOS)
@given(data=st.data())
def test_every_property_holds(
    dpsim_suite: SuiteConfig, scenario: str, data: st.DataObject
) -> None:
    target = dpsim_suite.target
    if scenario not in scenarios_for(target):
        pytest.skip(f"{target.label} has no {scenario} scenario")
    case = data.draw(
        cases(
            target,
            scenario=scenario,
            profile=dpsim_suite.profile,
            ranks=dpsim_suite.ranks,
            policy=dpsim_suite.policy,
        ),
        label="case",
    )
    try:
        result = run_case(target, case)
    except PolicyRefused:
        assume(False)
        return
    verdicts = judge(case, result)
    if verdicts:
        written = cex.write(
            cex.files.build(target, case, result, tuple(verdicts), PROPERTY_NAMES),
            dpsim_suite.out,
        )
        report = render_case_run(
            f"{verdicts[0]} ({target.label})", case, Evidence(case, result)
        )
        pytest.fail(
            f"{report}\n\ncounterexample: {written}\nreplay: dpsim replay {written}",
            pytrace=False,
        )
