"""dpsim mutate on the V1 runner: the caller method's mutants stay inside the
method, and a V1 mutant is checked under the release's own caller.

The snippet below is written here; the release tests mutate dpsim's own V1
twin (``dpsim/corpus/reference_v1_v33.py``) or name 0.33.0's caller method by
its name, never quoting vLLM's text.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.corpus import reference_path
from dpsim.errors import UsageError
from dpsim.mutate import Budget, generate, mutate
from dpsim.mutate.files import mutated_file
from dpsim.targets import load_target
from dpsim.targets.v1.caller import CALLER_METHOD, RUNNER_CLASS

RUNNER = textwrap.dedent(
    """
    def helper(num_tokens: int) -> int:
        return num_tokens + 1


    class Runner:
        def other(self, num_tokens: int) -> int:
            return num_tokens - 1

        def decide(self, num_tokens: int, dp_size: int) -> int:
            def pick(count: int, eager: bool = False) -> int:
                return count if eager else count * 2

            padded = pick(num_tokens)
            if dp_size > 1:
                padded = max(padded, num_tokens)
            return padded
    """
)


def test_named_methods_and_their_closures_are_mutated_nothing_else() -> None:
    everything = generate(RUNNER)
    # Module-level functions only, by default: methods are left alone.
    assert {mutant.function for mutant in everything} == {"helper"}
    chosen = generate(RUNNER, functions=("Runner.decide",))
    assert {mutant.function for mutant in chosen} == {"decide", "pick"}
    lines = RUNNER.splitlines()
    first = next(i for i, line in enumerate(lines) if "def decide" in line) + 1
    assert all(mutant.line > first for mutant in chosen)
    assert any(mutant.operator == "min-max" for mutant in chosen)


def test_an_unknown_function_is_refused() -> None:
    with pytest.raises(UsageError, match=r"no function 'Runner\.missing'"):
        generate(RUNNER, functions=("Runner.missing",))


QUICK = Budget(examples=20, profiles=("caller",), ranks=(2, 4))


@pytest.mark.release
def test_caller_file_is_the_release_method_and_v2_has_none() -> None:
    target = load_target("0.33.0", runner="v1")
    mutated = mutated_file(target, "caller")
    assert mutated.functions == (f"{RUNNER_CLASS}.{CALLER_METHOD}",)
    assert mutated.name == "gpu_model_runner.py"
    mutants = generate(mutated.text, functions=mutated.functions)
    assert mutants and {m.function for m in mutants} <= {
        CALLER_METHOD,
        "dispatch_cudagraph",
    }
    assert mutated_file(target).path.endswith("v1/worker/dp_utils.py")
    with pytest.raises(UsageError, match="add --runner v1"):
        mutated_file(load_target("0.33.0", runner="v2"), "caller")


@pytest.mark.release
def test_a_twin_mutant_is_killed_under_the_real_caller() -> None:
    twin = str(reference_path("v1-v33"))
    # Padding under eager and not under graphs: ranks replay graphs of their
    # own sizes.
    (killable,) = [
        mutant.id
        for mutant in generate(Path(twin).read_text(), ["compare"])
        if mutant.function == "coordinate_batch_across_dp"
        and mutant.description == "!= -> =="
    ]
    report = mutate(
        "0.33.0", twin, runner="v1", budget=QUICK, workers=0, only=(killable,)
    )
    (result,) = report.results
    assert result.outcome.killed, result.outcome
    assert report.plan.runner == "v1" and report.plan.slot == "sync"


@pytest.mark.release
def test_cli_mutates_the_caller_method(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["mutate", "--vllm", "0.33.0", "--runner", "v1", "--file", "caller"]
    assert main([*common, "--list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert "V1" in listing["target"]
    # The re-dispatch at the agreed count, restricted to the agreed mode,
    # taken with this rank's own mode instead.
    (own_mode,) = [
        mutant["id"]
        for mutant in listing["mutants"]
        if mutant["description"]
        == "synced_cudagraph_mode -> cudagraph_mode (this rank's own)"
    ]
    assert listing["mutants"][0]["diff"].startswith("--- a/gpu_model_runner.py")
    status = main(
        [
            *common,
            "--mutant",
            own_mode,
            "--examples",
            "40",
            "--profile",
            "caller",
            "--ranks",
            "2..4",
            "--workers",
            "0",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert data["runner"] == "v1" and data["slot"] == "caller"
    assert (status, data["killed"]) == (0, 1), data["results"]


def test_an_unknown_slot_is_refused_before_the_target_is_read() -> None:
    with pytest.raises(UsageError, match="--file 'nope': expected one of sync, caller"):
        mutated_file(None, "nope")  # type: ignore[arg-type]
