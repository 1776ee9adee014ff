"""The DP-sync property suite, collected from this checkout.

The tests live in the package (:mod:`dpsim.suite.test_dp_sync`) so that any
vLLM checkout can run them with ``pytest --pyargs dpsim.suite``; this module
only makes ``pytest properties`` collect the same functions here.
"""

from dpsim.suite.test_dp_sync import test_drafter, test_profile, test_step, test_ubatch

__all__ = ["test_drafter", "test_profile", "test_step", "test_ubatch"]
