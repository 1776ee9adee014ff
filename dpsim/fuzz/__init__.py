"""``dpsim fuzz``: the property suite run continuously by N processes.

Built on Hypothesis' own machinery: every worker runs the suite's
``@given`` tests (:mod:`dpsim.suite.build`; under ``--lane runner`` the
runner lane's one test, :mod:`dpsim.lanes.runner.suite`) against one shared
example database; see :mod:`dpsim.fuzz.campaign` for the coordinator and
:mod:`dpsim.fuzz.worker` for a worker's loop.
"""

from dpsim.fuzz.campaign import (
    CampaignOptions,
    Failure,
    Tally,
    parse_duration,
    run_campaign,
)

__all__ = ["CampaignOptions", "Failure", "Tally", "parse_duration", "run_campaign"]
