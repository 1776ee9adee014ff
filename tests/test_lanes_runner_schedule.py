"""The simulator's schedule for real processes: what a rank's looks record.

(The calls' order is recorded through the lane's run; the release-marked
tests in test_lanes_runner_processes.py hold real processes to both.)
"""

from __future__ import annotations

import pytest

from dpsim.lanes.runner.schedule import RelaySchedule, _RecordingMailbox
from dpsim.sim.mailbox import Mailbox


def test_each_look_records_how_many_messages_had_reached_the_mailbox() -> None:
    inner = Mailbox(0, "input queue")
    looks: list[int] = []
    mailbox = _RecordingMailbox(inner, looks)
    assert mailbox.empty()
    inner.put("a")
    inner.put("b")
    assert mailbox.get_nowait() == "a"
    assert not mailbox.empty()
    assert mailbox.get_nowait() == "b"
    with pytest.raises(IndexError):
        mailbox.get_nowait()
    inner.put("c")
    assert mailbox.get() == "c"  # there already: no rank has to park
    assert looks == [0, 2, 2, 2, 2, 3]


def test_a_rank_that_never_looked_has_no_looks() -> None:
    assert RelaySchedule().looks_of(3) == []
