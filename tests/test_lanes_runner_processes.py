"""The runner lane on real processes (gloo), and the relay between them.

The fast tests drive the relay's two ends over one in-process pipe, with the
lane's own coordinator model behind the parent's end. The release-marked ones
run 0.33.0 cases on two real processes each: a passing case (through
``dpsim replay --backend gloo`` of a case file) and one with a drafter agree
with the simulator collective for collective; an engine bug planted in a
copied tree hangs them as it hangs the simulator (a rank's gloo group gives
up after the lane's 1 s timeout; a rank idle on its input is stopped there).
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import dpsim
from dpsim.cli import main
from dpsim.lanes.runner.case import RunnerCase, RunnerCaseFile
from dpsim.lanes.runner.commands import target_record
from dpsim.lanes.runner.coordinator import REQUEST_TYPES, Coordinator
from dpsim.lanes.runner.processes import (
    GROUP_NAMES,
    _Relay,
    lane_differences,
    run_runner_lane,
)
from dpsim.lanes.runner.relay import (
    ACK,
    OUTPUT,
    PARKED,
    REQUEST,
    RankLink,
    RelayCoordinator,
    RelayMailbox,
    Stopped,
    handle,
)
from dpsim.lanes.runner.run import run_runner_case
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.properties import RUNNER_LANE_PROPERTIES, judge
from dpsim.records.groups import ENGINE_DP_GROUP
from dpsim.records.policy import CapturePolicy
from dpsim.records.trace import Outcome, RankState
from dpsim.sim.mailbox import PARKED_EVENT

TIMEOUT_S = 1.0


# -- the relay, in one process ------------------------------------------------------


@pytest.fixture
def pipe() -> Iterator[tuple[Connection, Connection]]:
    parent, child = multiprocessing.Pipe(duplex=True)
    yield parent, child
    parent.close()
    child.close()


def _answer(link: RankLink, coordinator: Any, messages: int) -> threading.Thread:
    """The parent's side, answering ``messages`` messages from the child."""

    def serve() -> None:
        for _ in range(messages):
            handle(link, link.connection.recv(), coordinator)

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_a_request_comes_back_stamped_with_the_wave_before_the_call_returns(
    pipe: tuple[Connection, Connection],
) -> None:
    """0.29-0.32's front-end wakes the engines on a first request: the
    coordinator model puts the request and then START_DP_WAVE into the
    rank's queue, and both are there when the child's call returns."""
    parent, child = pipe
    link = RankLink(0, parent)
    coordinator = Coordinator([link], front_end_wakes=True)  # type: ignore[list-item]
    mailbox = RelayMailbox(child, "input queue")
    relayed = RelayCoordinator(mailbox, front_end_wakes=True)
    request = object()  # stays in the child: only its number travels
    server = _answer(link, coordinator, 1)
    relayed.send_request(0, request)
    server.join()
    assert mailbox.get_nowait() == (REQUEST_TYPES.ADD, (request, 0))
    assert mailbox.get_nowait() == (REQUEST_TYPES.START_DP_WAVE, (0, 0))
    assert mailbox.empty()
    assert coordinator.log == [("start", 0, 0)]


def test_a_rank_is_parked_only_with_nothing_in_flight_to_it(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    link = RankLink(0, parent)
    mailbox = RelayMailbox(child, "input queue")
    link.put((REQUEST_TYPES.WAKEUP, None))
    assert mailbox.get() == (REQUEST_TYPES.WAKEUP, None)
    assert not parent.poll(0)  # a message was there: the rank never blocked

    parked: list[bool] = []

    def wake_when_parked() -> None:
        handle(link, parent.recv(), None)
        parked.append(link.parked)
        link.put((REQUEST_TYPES.START_DP_WAVE, (1, None)))
        parked.append(link.parked)

    server = threading.Thread(target=wake_when_parked)
    server.start()
    assert mailbox.get() == (REQUEST_TYPES.START_DP_WAVE, (1, None))
    server.join()
    # Parked after taking 1 message of the 1 sent; not once another is sent.
    assert parked == [True, False]
    assert link.sent == 2 and link.parked_at == 1
    # A "parked" that crossed a message in flight does not park the rank.
    link.put((REQUEST_TYPES.WAKEUP, None))
    child.send((PARKED, 2))
    handle(link, parent.recv(), None)
    assert not link.parked


def test_a_shutdown_reaches_the_engine_before_the_wakeup_after_it(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    link = RankLink(0, parent)
    mailbox = RelayMailbox(child, "input queue")
    asked: list[str] = []
    RelayCoordinator(mailbox, front_end_wakes=False).attach(
        0, lambda: asked.append("shutdown")
    )
    link.shutdown()
    link.put((REQUEST_TYPES.WAKEUP, None))
    assert mailbox.get() == (REQUEST_TYPES.WAKEUP, None)
    assert asked == ["shutdown"]


def test_stop_ends_a_parked_rank_past_vllms_except_exception(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    link = RankLink(0, parent)
    mailbox = RelayMailbox(child, "input queue")
    assert not issubclass(Stopped, Exception)

    said: list[Any] = []

    def stop_when_parked() -> None:
        said.append(parent.recv())
        link.stop()

    server = threading.Thread(target=stop_when_parked)
    server.start()
    with pytest.raises(Stopped):
        mailbox.get()
    server.join()
    assert said == [(PARKED, 0)]
    assert not link.parked


def test_a_message_neither_side_was_written_for_is_an_error(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    mailbox = RelayMailbox(child, "input queue")
    parent.send(("gossip",))
    with pytest.raises(RuntimeError, match="gossip"):
        mailbox.empty()
    with pytest.raises(RuntimeError, match="rank 0 sent"):
        handle(RankLink(0, parent), ("gossip",), None)


def test_a_shutdown_before_the_engine_attached_is_an_error(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    RankLink(0, parent).shutdown()
    with pytest.raises(RuntimeError, match="not attached"):
        RelayMailbox(child, "input queue").empty()


def test_only_wave_outputs_reach_the_coordinator(
    pipe: tuple[Connection, Connection],
) -> None:
    """Per-request outputs (another client index, another type) stay in the
    child, as the coordinator model drops them."""
    _, child = pipe
    relayed = RelayCoordinator(
        RelayMailbox(child, "input queue"), front_end_wakes=False
    )
    relayed.output(0, (0, object()))
    relayed.output(0, (-1, object()))
    assert not child.poll(0)


def test_a_look_sees_what_the_simulated_rank_saw_and_no_more(
    pipe: tuple[Connection, Connection],
) -> None:
    """The simulated rank found its queue empty, then took one message: the
    child does too, though the message was there from the start."""
    parent, child = pipe
    link = RankLink(0, parent)
    mailbox = RelayMailbox(child, "input queue", looks=(0, 1))
    link.put((REQUEST_TYPES.WAKEUP, None))
    assert mailbox.empty()
    assert mailbox.get() == (REQUEST_TYPES.WAKEUP, None)
    # Past the simulator's looks: what has arrived.
    assert mailbox.empty()


def test_a_look_waits_for_a_message_the_simulated_rank_had(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    link = RankLink(0, parent)
    mailbox = RelayMailbox(child, "input queue", looks=(1,))
    said: list[Any] = []

    def put_when_parked() -> None:
        said.append(parent.recv())
        link.put((REQUEST_TYPES.START_DP_WAVE, (2, 1)))

    server = threading.Thread(target=put_when_parked)
    server.start()
    assert not mailbox.empty()  # the simulated rank's queue was not
    server.join()
    assert said == [(PARKED, 0)]
    assert mailbox.get_nowait() == (REQUEST_TYPES.START_DP_WAVE, (2, 1))


def test_a_get_the_simulated_rank_never_made_is_an_error(
    pipe: tuple[Connection, Connection],
) -> None:
    parent, child = pipe
    RankLink(0, parent).put((REQUEST_TYPES.WAKEUP, None))
    with pytest.raises(RuntimeError, match="left the simulator's schedule"):
        RelayMailbox(child, "input queue", looks=(0,)).get()


class _Calls:
    """A coordinator model that notes the calls made on it."""

    def __init__(self) -> None:
        self.made: list[tuple[str, int]] = []

    def send_request(self, rank: int, request: Any) -> None:
        self.made.append(("request", rank))

    def output(self, rank: int, item: Any) -> None:
        self.made.append(("output", rank))


def _relay(calls: list[tuple[int, str]]) -> tuple[_Relay, _Calls, list[Any]]:
    pipes = [multiprocessing.Pipe(duplex=True) for _ in range(2)]
    coordinator = _Calls()
    relay = _Relay(
        [], [], [RankLink(r, p) for r, (p, _) in enumerate(pipes)], coordinator, calls
    )
    return relay, coordinator, pipes


def test_the_parent_makes_calls_in_the_simulators_order() -> None:
    relay, coordinator, pipes = _relay([(1, REQUEST), (0, OUTPUT)])
    relay.waiting[0] = (OUTPUT, None, 0)  # came first
    relay._serve()
    assert coordinator.made == []  # rank 1's request is due first
    relay.waiting[1] = (REQUEST, 0)
    relay._serve()
    assert coordinator.made == [("request", 1), ("output", 0)]
    assert [child.recv() for _, child in pipes] == [(ACK,), (ACK,)]
    assert relay.calls is not None and not relay.calls


def test_a_call_off_the_simulators_order_drops_it() -> None:
    relay, coordinator, _ = _relay([(0, REQUEST), (1, REQUEST)])
    relay.waiting[1] = (REQUEST, 0)
    relay.waiting[0] = (OUTPUT, None, 0)  # the simulated rank 0 requested
    relay._serve()
    assert relay.calls is None
    assert coordinator.made == [("request", 1), ("output", 0)]


# -- real processes (release-marked) ----------------------------------------------------


def _case(speculator: str | None = None, k: int = 0) -> RunnerCase:
    """A busy rank and an idle one (the idle one runs dummy batches)."""
    options = EngineOptions(speculator=speculator, num_speculative_tokens=k)
    policy = CapturePolicy(
        capture_sizes=(1, 2, 4, 8, 16),
        max_num_seqs=options.max_num_seqs,
        decode_query_len=options.decode_query_len,
    )
    busy = RankStream((RequestScript("a", 0, 5, 3),))
    return RunnerCase(policy, options, (busy, RankStream()))


def _both(target: Any, case: RunnerCase) -> tuple[Any, Any, tuple[str, ...]]:
    properties = list(RUNNER_LANE_PROPERTIES.values())
    simulated = run_runner_case(target, case).result
    verdicts = judge(case, simulated, properties)
    lane = run_runner_lane(target, case, properties, timeout_s=TIMEOUT_S)
    return simulated, lane, lane_differences(simulated, verdicts, lane)


@pytest.mark.release
@pytest.mark.gloo
def test_a_runner_case_file_replays_on_gloo_and_agrees_with_the_simulator(
    release: Callable[[str], Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = release("0.33.0")
    case = _case()
    result = run_runner_case(target, case).result
    found = RunnerCaseFile(
        target=target_record(target),
        case=case,
        properties=tuple(RUNNER_LANE_PROPERTIES),
        verdicts=(),
        outcome=result.outcome.value,
        trace=result.to_dict(),
        dpsim_version=dpsim.__version__,
    ).write(tmp_path)
    args = ["replay", str(found), "--backend", "gloo", "--timeout", str(TIMEOUT_S)]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    lane = summary["lane"]
    assert lane["disagreements"] == []
    assert lane["outcome"] == "ok" and lane["verdicts"] == []
    assert [rank["state"] for rank in lane["ranks"]] == ["finished", "finished"]
    assert lane["watchdog_fired"] is False
    # The real processes are the gloo lane's only: NCCL is refused in one line.
    assert main([*args[:2], "--backend", "nccl"]) == 2
    assert "replay --backend nccl: runner case files" in capsys.readouterr().err


@pytest.mark.release
@pytest.mark.gloo
def test_a_drafting_case_on_real_processes_makes_the_simulators_collectives(
    release: Callable[[str], Any],
) -> None:
    simulated, lane, differences = _both(release("0.33.0"), _case("ar", 2))
    assert differences == ()
    assert lane.result.outcome == Outcome.OK and lane.verdicts == ()
    for real, sim in zip(lane.result.ranks, simulated.ranks, strict=True):
        assert real.collectives == sim.collectives
        assert real.events == sim.events  # the sync records and drafter forwards
        assert {record.group for record in real.collectives} >= {
            ENGINE_DP_GROUP,
            "dp_cpu",
            "ep",
        }
    assert GROUP_NAMES[-1] == ENGINE_DP_GROUP


#: A case drawn by ``check --lane runner`` whose trace depends on a race on
#: real processes: whether rank 1's first look at its input finds rank 0's
#: START_DP_WAVE (a dummy batch first) or nothing (its own request first, the
#: lane's arrival rule). Real processes follow the simulator's schedule.
_RACY = RunnerCase.from_dict(
    json.loads(
        """{"dp_size": 2, "lane": "runner", "options": {"async_scheduling": false, "dp_sync_interval": 2, "long_prefill_token_threshold": 0, "max_model_len": 83, "max_num_batched_tokens": 35, "max_num_seqs": 7, "num_speculative_tokens": 0, "prefill_schedule_interval": 2, "speculator": null}, "policy": {"capture_sizes": [1, 2, 4, 8, 16, 32], "cudagraph_mode": "NONE", "decode_query_len": 1, "drafter": null, "lora_capture_cases": null, "max_capture_size": null, "max_num_seqs": 7, "microbatching": null, "varlen_decode": false}, "runner": "v2", "seed": 1, "streams": [{"requests": [{"accepted": [], "arrival": 0, "kv_wait": 1, "output_len": 6, "prompt_len": 72, "req_id": "r0-0"}, {"accepted": [], "arrival": 1, "kv_wait": 1, "output_len": 3, "prompt_len": 8, "req_id": "r0-1"}, {"accepted": [], "arrival": 4, "kv_wait": 0, "output_len": 4, "prompt_len": 72, "req_id": "r0-2"}, {"accepted": [], "arrival": 5, "kv_wait": 0, "output_len": 4, "prompt_len": 81, "req_id": "r0-3"}]}, {"requests": [{"accepted": [], "arrival": 1, "kv_wait": 1, "output_len": 6, "prompt_len": 80, "req_id": "r1-0"}, {"accepted": [], "arrival": 4, "kv_wait": 3, "output_len": 2, "prompt_len": 70, "req_id": "r1-1"}]}]}"""
    )
)


@pytest.mark.release
@pytest.mark.gloo
def test_real_processes_follow_the_simulators_schedule_through_a_race(
    release: Callable[[str], Any],
) -> None:
    simulated, lane, differences = _both(release("0.33.0"), _RACY)
    assert differences == ()
    assert lane.result.outcome == Outcome.OK
    assert lane.result.to_dict()["ranks"] == simulated.to_dict()["ranks"]


#: Engine bugs planted in a copied 0.33.0 tree (old text, new text), and
#: where each rank then stands: the group it waits in, or None for a rank
#: idle in its input queue.
_PLANTED = {
    # An engine with no local requests skips its dummy batch: the busy rank
    # waits in the model runner's DP sync, the idle one in the engines'
    # all-reduce; each rank's gloo group gives up after the lane's timeout.
    "skipped-dummy": (
        "elif not self.model_executor.is_sleeping:",
        "elif local_unfinished_reqs and not self.model_executor.is_sleeping:",
        ["dp_cpu", ENGINE_DP_GROUP],
    ),
    # The first request's engine never asks the coordinator to start a wave
    # (its output goes to a client that is not the coordinator): the idle
    # rank stays parked on its input while the busy one waits in its sync;
    # the parent stops the parked rank once the busy one's group gave up.
    "wave-never-started": (
        "(-1, EngineCoreOutputs(start_wave=self.current_wave))",
        "(-2, EngineCoreOutputs(start_wave=self.current_wave))",
        ["dp_cpu", None],
    ),
}


@pytest.mark.release
@pytest.mark.gloo
@pytest.mark.parametrize("plant", sorted(_PLANTED))
def test_a_planted_engine_bug_hangs_real_processes_as_it_hangs_the_simulator(
    release_file: Callable[[str, str], Path],
    release: Callable[[str], Any],
    tmp_path: Path,
    plant: str,
) -> None:
    old, new, waiting = _PLANTED[plant]
    package = release_file("0.33.0", "v1/engine/core.py").parents[2]
    tree = tmp_path / "vllm"
    shutil.copytree(package, tree)
    core = tree / "v1" / "engine" / "core.py"
    text = core.read_text()
    planted = text.replace(old, new, 1)  # the first place only
    assert planted != text
    core.write_text(planted)
    _, lane, differences = _both(release(str(tree)), _case())
    assert differences == ()
    assert lane.result.outcome == Outcome.HANG
    assert [verdict.property for verdict in lane.verdicts] == ["no-hang"]
    assert [trace.state for trace in lane.result.ranks] == [RankState.WAITING] * 2
    assert [
        trace.waiting.group if trace.waiting else None for trace in lane.result.ranks
    ] == waiting
    for trace, group in zip(lane.result.ranks, waiting, strict=True):
        parked = [event for event in trace.events if event.kind == PARKED_EVENT]
        assert bool(parked) == (group is None)
    # Each rank standing in a collective was ended by its group's own timeout,
    # as its log says. Whether the watchdog also fired (no log growth for the
    # timeout plus a grace, while the run settles) is a race of wall clocks on
    # a loaded machine, not part of what the bug does.
    assert [
        "Timed out" in (end.backend_error or "")
        for end, group in zip(lane.ends, waiting, strict=True)
    ] == [group is not None for group in waiting]
