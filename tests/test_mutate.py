"""dpsim mutate: the operators on hand-written snippets, mutants of our own
corpus reference checked on release 0.29.0, and the command line.

No vLLM text is used here: snippets are written below, and the only target
mutated is ``dpsim/corpus/reference_v29.py``, which is dpsim's own code.
"""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from dpsim.cli import main
from dpsim.corpus import entry as corpus_entry
from dpsim.corpus import materialize, reference_path
from dpsim.errors import UsageError
from dpsim.mutate import (
    OPERATOR_NAMES,
    Budget,
    generate,
    mutate,
    select_operators,
    sites,
    summary,
)
from dpsim.mutate import equivalent as equivalent_list

SYNC = textwrap.dedent(
    '''
    import torch


    class DPSyncState:
        """Not a function: never mutated."""

        eager: bool = False


    def sync(num_tokens: int, dp_size: int, dp_rank: int, uniform_token_count):
        """A docstring, never mutated."""
        assert dp_size > 1, "guards a caller error"
        tensor = torch.zeros(2, dp_size, dtype=torch.int32)
        tensor[0][dp_rank] = num_tokens
        tensor[1][dp_rank] = uniform_token_count or 0
        num_tokens_across_dp = tensor[0]
        if torch.all(num_tokens_across_dp == 0).item():
            return None
        synced_num_tokens = int(num_tokens_across_dp.max())
        if not (synced_num_tokens <= 8 and dp_size is not None):
            return synced_num_tokens
        return min(synced_num_tokens, num_tokens)
    '''
)


def _descriptions(operator: str, text: str = SYNC) -> list[str]:
    return [site.description for site in sites(text, [operator])]


def _mutated_lines(operator: str, text: str = SYNC) -> list[str]:
    """For each mutant, the one line it changes, as the mutant has it."""
    original = text.splitlines()
    changed = []
    for mutant in generate(text, [operator]):
        lines = mutant.text.splitlines()
        differing = [
            new.strip() for old, new in zip(original, lines, strict=False) if old != new
        ]
        changed.append(differing[0] if differing else "")
    return changed


def test_min_max_swaps_methods_and_builtins() -> None:
    lines = _mutated_lines("min-max")
    assert "synced_num_tokens = int(num_tokens_across_dp.min())" in lines
    assert "return max(synced_num_tokens, num_tokens)" in lines


def test_all_any_swaps_torch_all() -> None:
    assert _mutated_lines("all-any") == [
        "if torch.any(num_tokens_across_dp == 0).item():"
    ]
    snippet = "def f(x):\n    return x.any() and all(x)\n"
    assert {m.text.splitlines()[1].strip() for m in generate(snippet, ["all-any"])} == {
        "return x.all() and all(x)",
        "return x.any() and any(x)",
    }


def test_compare_flips_each_operator() -> None:
    assert _descriptions("compare") == ["== -> !=", "<= -> <", "is not -> is"]


def test_boolean_flips_and_or_not_and_constants() -> None:
    assert _descriptions("boolean") == ["or -> and", "not x -> x", "and -> or"]
    snippet = "def f(x):\n    return g(eager=True)\n"
    assert _descriptions("boolean", snippet) == ["True -> False"]


def test_drop_removes_statements_and_early_returns_but_not_asserts() -> None:
    descriptions = _descriptions("drop")
    assert "drop early return: return None" in descriptions
    assert "drop statement: tensor[0][dp_rank] = num_tokens" in descriptions
    assert not any("assert" in text for text in descriptions)
    # The last return is kept: dropping it only makes every caller crash.
    assert not any("return min(" in text for text in descriptions)


def test_agreed_value_swaps_per_rank_and_agreed_values() -> None:
    descriptions = _descriptions("agreed-value")
    # The idle decision taken by this rank alone: the classic DP bug.
    assert (
        "torch.all(num_tokens_across_dp == 0).item() -> bool((num_tokens) == 0) "
        "(this rank's own)" in descriptions
    )
    # The padded count from this rank's own count, not the largest.
    assert "num_tokens_across_dp.max() -> (num_tokens) (this rank's own)" in (
        descriptions
    )
    assert "synced_num_tokens -> num_tokens (this rank's own)" in descriptions
    assert "num_tokens -> synced_num_tokens (the agreed value)" in descriptions


def test_off_by_one_on_ints_and_counts() -> None:
    descriptions = _descriptions("off-by-one")
    assert "2 -> 3" in descriptions and "2 -> 1" in descriptions
    assert "num_tokens -> num_tokens + 1" in descriptions
    assert "int(num_tokens_across_dp.max()) -> int(num_tokens_across_dp.max()) - 1" in (
        descriptions
    )
    # uniform_token_count is no int (it may be None): left alone.
    assert not any(text.startswith("uniform_token_count") for text in descriptions)


def test_only_functions_are_mutated() -> None:
    for mutant in generate(SYNC):
        assert mutant.function == "sync"
        assert '"""Not a function: never mutated."""' in mutant.text
        assert "eager: bool = False" in mutant.text
        assert 'assert dp_size > 1, "guards a caller error"' in mutant.text


def test_mutants_of_the_reference_are_valid_distinct_and_local() -> None:
    text = reference_path("v29").read_text()
    mutants = generate(text)
    assert len(mutants) > 50
    assert {mutant.operator for mutant in mutants} == set(OPERATOR_NAMES)
    assert len({mutant.id for mutant in mutants}) == len(mutants)
    assert len({mutant.text for mutant in mutants}) == len(mutants)
    original = ast.dump(ast.parse(text))
    for mutant in mutants:
        assert ast.dump(ast.parse(mutant.text)) != original, mutant.id
        # Text edits, not a re-printed module: the diff is a few lines.
        changed = [
            line
            for line in mutant.diff(text).splitlines()
            if line[:1] in "+-" and line[:3] not in ("+++", "---")
        ]
        assert 1 <= len(changed) <= 12, mutant.id


def test_unknown_operator_is_refused() -> None:
    with pytest.raises(UsageError, match="unknown operator 'nope'"):
        select_operators(["nope"])


def test_shipped_equivalent_list_parses_with_a_reason_each() -> None:
    entries = equivalent_list.load(equivalent_list.REVIEWED)
    assert entries
    for entry in entries:
        assert len(entry.sha256) == 64 and entry.id and entry.reason.strip()


# -- checking mutants of dpsim's own reference on release 0.29.0 ----------------

QUICK = Budget(examples=25, profiles=("caller",))


def _find(function: str, description: str, text: str | None = None) -> str:
    """A mutant of the reference (or ``text``) by what it does, not by line:
    the reference may be edited."""
    found = [
        mutant.id
        for mutant in generate(text or reference_path("v29").read_text())
        if mutant.function == function and mutant.description == description
    ]
    assert len(found) == 1, found
    return found[0]


#: Pads every rank to the smallest count instead of the largest.
KILLABLE = _find("dispatch_cg_and_sync_dp", "max(...) -> min(...)")
#: shared_value reads column[1] instead of column[0]: with two or more ranks
#: any column gives the same answer (equal everywhere, or None).
EQUIVALENT = _find("shared_value", "0 -> 1")


def _listed(tmp_path: Path, mutant_id: str) -> Path:
    digest = hashlib.sha256(reference_path("v29").read_bytes()).hexdigest()
    path = tmp_path / "equivalent.toml"
    path.write_text(
        f'[[mutant]]\nsha256 = "{digest}"\nid = "{mutant_id}"\n'
        'reason = "any column gives the same answer"\n'
    )
    return path


@pytest.mark.release
def test_a_mutant_breaking_agreement_is_killed_and_an_equivalent_listed(
    tmp_path: Path,
) -> None:
    report = mutate(
        "0.29.0",
        str(reference_path("v29")),
        budget=QUICK,
        workers=0,
        only=(KILLABLE, EQUIVALENT),
        equivalent_lists=(_listed(tmp_path, EQUIVALENT),),
    )
    results = {result.mutant.id: result for result in report.results}
    killed = results[KILLABLE]
    assert killed.outcome.killed and killed.outcome.killer == "coverage"
    # Killed in the first leg it ran (step, caller): the legs after it never ran.
    first = report.plan.legs[0]
    assert (killed.outcome.scenario, killed.outcome.profile) == ("step", "caller")
    assert (first.scenario, first.profile) == ("step", "caller")
    assert killed.outcome.seconds is not None
    listed = results[EQUIVALENT]
    assert listed.equivalent == "any column gives the same answer"
    assert listed.outcome.status == "survived"
    assert report.score == 1.0 and [r.mutant.id for r in report.scored] == [KILLABLE]
    data = summary(report)
    assert data["equivalent"] == 1 and data["killed"] == 1 and data["score"] == 1.0
    assert data["killed_by"] == {killed.outcome.killer: 1}


@pytest.mark.release
def test_a_target_with_a_bug_of_its_own_is_judged_mutant_against_original(
    tmp_path: Path,
) -> None:
    # The witness breaks eager-contagion on many cases. The leg stays in, judged
    # case by case against the original: the pad-to-smallest mutant is killed,
    # and the equivalent one, failing exactly as the original does, is not.
    faulty = materialize(corpus_entry("witness-eager-contagion"), tmp_path)
    text = faulty.read_text()
    killable = _find("dispatch_cg_and_sync_dp", "max(...) -> min(...)", text)
    equivalent = _find("shared_value", "0 -> 1", text)
    report = mutate(
        "0.29.0",
        str(faulty),
        budget=QUICK,
        workers=0,
        only=(killable, equivalent),
    )
    relative = {leg.scenario for leg in report.plan.legs if leg.relative}
    assert "step" in relative
    assert {item.property for item in report.plan.inherited} == {"eager-contagion"}
    results = {result.mutant.id: result for result in report.results}
    assert results[killable].outcome.killed
    assert results[equivalent].outcome.status == "survived"


@pytest.mark.release
def test_cli_json_and_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "mutate",
        "--vllm",
        "0.29.0",
        "--target",
        str(reference_path("v29")),
        "--examples",
        "25",
        "--profile",
        "caller",
        "--workers",
        "0",
        "--json",
    ]
    assert main([*common, "--mutant", KILLABLE, "--out", str(tmp_path / "out")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {
        "target",
        "sha256",
        "score",
        "killed",
        "survived",
        "equivalent",
        "kill_seconds",
        "killed_by",
        "results",
        "legs",
    } <= set(data)
    assert data["score"] == 1.0 and data["survived"] == 0
    assert set(data["kill_seconds"]) == {"median", "p90", "max"}
    (result,) = data["results"]
    assert result["id"] == KILLABLE and result["status"] == "killed"
    assert (tmp_path / "out" / "mutate.json").is_file()
    # Not listed as equivalent: a survivor, exit 1, its diff shown.
    assert main([*common, "--mutant", EQUIVALENT]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["survived"] == 1 and data["score"] == 0.0
    assert data["results"][0]["diff"].startswith("--- a/dp_utils.py")
    assert main([*common, "--mutant", EQUIVALENT, "--min-score", "0"]) == 0
    capsys.readouterr()


@pytest.mark.release
def test_cli_lists_mutants(capsys: pytest.CaptureFixture[str]) -> None:
    target = str(reference_path("v29"))
    assert main(["mutate", "--vllm", "0.29.0", "--target", target, "--list"]) == 0
    out = capsys.readouterr().out
    assert KILLABLE in out and "max(...) -> min(...)" in out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--operators", "nope"], "unknown operator 'nope'"),
        (["--examples", "0"], "--examples must be at least 1"),
        (["--seconds", "0"], "--seconds must be positive"),
        (["--ranks", "3..2"], "--ranks"),
        (["--target", "/nonexistent/dp_utils.py", "--list"], "nonexistent"),
        pytest.param(
            ["--mutant", "drop@1:1"],
            "no mutant 'drop@1:1'",
            marks=pytest.mark.release,  # listing mutants loads the release
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--vllm", "0.29.0", "--target", str(reference_path("v29"))]
    if "--target" in arguments:
        target = ["--vllm", "0.29.0"]
    assert main(["mutate", *target, "--workers", "0", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
