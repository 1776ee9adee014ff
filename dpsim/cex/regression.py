"""A standalone pytest file beside each counterexample, for users' regression suites.

The test asserts that the properties *hold* on the recorded case, so it fails
while the bug is there and passes once it is fixed: dropped into a suite, it
guards the fix from then on (a test asserting that the failure reproduces
would instead break the day the bug is fixed). It replays through
``dpsim.replay.assert_holds``, on the target the file records unless
``DPSIM_VLLM`` / ``DPSIM_TARGET`` point it elsewhere (a user's own tree), and
on the runner it records unless ``DPSIM_RUNNER`` names the other.
On a vLLM that cannot run the case at all (a drafter or ubatch counterexample
against a release without that scenario, or an input its sync does not take)
the test is skipped with that reason: such a version cannot have the bug, and
an error there would fail a suite for nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import dpsim

_TEMPLATE = '''\
"""Regression test for a vLLM DP-sync counterexample found by `dpsim check`.

Fails while the bug is there, passes once the properties hold on this case.
It replays the counterexample beside it,
    {json_name}
on the target that file records. Run it against your own vLLM with
DPSIM_VLLM=SPEC (a release or source tree), plus DPSIM_TARGET=FILE for a
single dp_utils.py; a vLLM without the case's scenario or inputs skips it,
saying why. `dpsim replay FILE` shows the same run as a table.
Written by dpsim {version}.
"""

from pathlib import Path

from dpsim.cex.regression import assert_holds_or_skip

COUNTEREXAMPLE = Path(__file__).with_name({json_name!r})


def test_{identifier}() -> None:
    assert_holds_or_skip(COUNTEREXAMPLE)
'''


def regression_test_path(counterexample_path: Path) -> Path:
    stem = re.sub(r"\W", "_", counterexample_path.stem)
    return counterexample_path.with_name(f"test_{stem}.py")


def write_regression_test(counterexample_path: Path) -> Path:
    """Write ``test_<stem>.py`` next to the counterexample file; return its path."""
    path = regression_test_path(counterexample_path)
    path.write_text(
        _TEMPLATE.format(
            json_name=counterexample_path.name,
            identifier=path.stem.removeprefix("test_"),
            version=dpsim.__version__,
        )
    )
    return path


def assert_holds_or_skip(counterexample_path: str | Path) -> None:
    """What a written regression test calls: :func:`dpsim.replay.assert_holds`,
    or ``pytest.skip`` with the reason where the target cannot run the case."""
    import pytest

    from dpsim.cex import files
    from dpsim.replay.simulated import assert_holds, target_for_tests
    from dpsim.scenarios.run import why_not_runnable

    counterexample = files.read(Path(counterexample_path))
    target = target_for_tests(counterexample).target
    reason = why_not_runnable(target, counterexample.case)
    if reason is not None:
        pytest.skip(f"{target.label} cannot run this counterexample: {reason}")
    assert_holds(counterexample_path)
