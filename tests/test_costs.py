"""dpsim policy validate: cost figures by hand, workloads, suggestions, report files, CLI."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from random import Random

import pytest

from dpsim import limits
from dpsim.cli import main
from dpsim.costs import (
    StepCost,
    Workload,
    WorkloadError,
    builtin_workload,
    measure,
    resolve_workload,
    summarise,
)
from dpsim.costs.figures import nearest_rank
from dpsim.costs.suggest import best_sizes
from dpsim.costs.workload import BUILTIN_WORKLOADS, decode_query_len_for, parse_trace
from dpsim.records.policy import CapturePolicy
from dpsim.targets import load_target

# -- figures, by hand ----------------------------------------------------------

# Rank 0 has 3 tokens, rank 1 is idle (passes the 1-token dummy), rank 2 has
# 5; all run a FULL graph of 8.
GRAPH_STEP = StepCost(mode="FULL", real=(3, 0, 5), passed=(3, 1, 5), ran=(8, 8, 8))
EAGER_STEP = StepCost(mode="NONE", real=(4, 2), passed=(4, 2), ran=(4, 2))


def test_step_figures_by_hand() -> None:
    step = GRAPH_STEP
    assert step.batch_size == 5
    assert step.real_tokens == 8
    assert step.padding == 24 - 8
    # Up to the largest batch (5): 2 + 5 + 0; beyond it to the graph: 3 each.
    assert step.dp_padding == 7
    assert step.graph_padding == 9
    assert step.dp_padding + step.graph_padding == step.padding
    assert step.padding_share == 2.0
    assert not step.dp_dominates
    assert EAGER_STEP.padding == EAGER_STEP.dp_padding == EAGER_STEP.graph_padding == 0


def test_summary_by_hand() -> None:
    cost = summarise("p", 3, 7, [GRAPH_STEP, EAGER_STEP])
    assert cost.steps == 2
    assert cost.graphs == 7
    assert cost.real_tokens == 8 + 6
    assert cost.padded_tokens == 16
    assert cost.padding_overall == 16 / 14
    assert cost.padding_mean == (2.0 + 0.0) / 2
    # Nearest rank over [0.0, 2.0]: p50 is the 1st value, p99 the 2nd.
    assert cost.padding_p50 == 0.0
    assert cost.padding_p99 == 2.0
    assert cost.mode_share("FULL") == 0.5
    assert cost.mode_share("NONE") == 0.5
    assert cost.mode_share("PIECEWISE") == 0.0
    assert cost.dp_dominated == 0.0
    dominated = StepCost(mode="FULL", real=(1, 4), passed=(1, 4), ran=(4, 4))
    assert summarise("p", 2, 1, [dominated, GRAPH_STEP]).dp_dominated == 0.5


def test_nearest_rank() -> None:
    values = list(range(1, 101))
    assert nearest_rank(values, 50) == 50
    assert nearest_rank(values, 99) == 99
    assert nearest_rank([7.0], 99) == 7.0


# -- the real target --------------------------------------------------------------


@pytest.mark.release
def test_measure_reads_what_the_real_sync_chose() -> None:
    target = load_target("0.33.0")
    policy = CapturePolicy(capture_sizes=(1, 2, 4, 8), max_num_seqs=16)
    workload = Workload(
        "hand",
        (
            ((1, 1, 1), (1,)),  # uniform decodes, largest 3: FULL graph of 4
            ((1, 1), ()),  # an idle rank runs the 1-token dummy: FULL 2
            ((10,), (1,)),  # a 10-token prefill is above every size: eager
        ),
    )
    measured = measure(target, policy, workload)
    assert measured.outcome == "ok"
    assert measured.unfinished == 0
    first, second, third = measured.steps
    assert (first.mode, first.ran, first.real) == ("FULL", (4, 4), (3, 1))
    assert (first.dp_padding, first.graph_padding) == (2, 2)
    assert (second.mode, second.ran, second.real, second.passed) == (
        "FULL",
        (2, 2),
        (2, 0),
        (2, 1),
    )
    assert (second.dp_padding, second.graph_padding) == (2, 0)
    assert (third.mode, third.ran, third.padding) == ("NONE", (10, 1), 0)


# -- suggestions ------------------------------------------------------------------


def test_best_sizes_by_hand() -> None:
    observed = Counter({1: 5, 2: 1, 3: 1, 10: 1})
    assert best_sizes(observed, 10, 1) == (10,)
    # {3, 10} pads 1->3, 2->3: 2*5 + 1 = 11; {1, 10} pads 2, 3 -> 10: 15.
    assert best_sizes(observed, 10, 2) == (3, 10)
    assert best_sizes(observed, 10, 3) == (1, 3, 10)
    assert best_sizes(observed, 10, 9) == (1, 2, 3, 10)
    # Values above the top are left out; the top is always a size.
    assert best_sizes(Counter({4: 1, 50: 9}), 8, 2) == (4, 8)


def _padding(observed: Counter[int], sizes: tuple[int, ...]) -> int:
    return sum(
        weight * (min(s for s in sizes if s >= value) - value)
        for value, weight in observed.items()
        if value <= max(sizes)
    )


def test_best_sizes_is_optimal_against_brute_force() -> None:
    rng = Random(3)
    for _ in range(40):
        observed = Counter({rng.randint(1, 40): rng.randint(1, 5) for _ in range(7)})
        top = max(observed)
        count = rng.randint(1, 4)
        chosen = best_sizes(observed, top, count)
        assert top in chosen and len(chosen) <= count
        others = sorted(set(range(1, top)))
        least = min(
            _padding(observed, (*combo, top))
            for k in range(count)
            for combo in itertools.combinations(others, k)
        )
        assert _padding(observed, chosen) == least


# -- workloads --------------------------------------------------------------------


def test_trace_forms(tmp_path: Path) -> None:
    lines = [
        "# exported from my logs",
        '{"ranks": [[1, 1, 1], [1, 1, 37], []]}',
        "",
        '{"ranks": [{"query_lens": [1, 1]}, {"num_reqs": 3, "num_tokens": 7}, '
        '{"num_reqs": 0, "num_tokens": 0}]}',
        '{"ranks": [[], [], []]}',
    ]
    workload = parse_trace(lines, "t.jsonl")
    assert workload.dp_size == 3
    assert workload.from_trace
    # The all-idle step is kept and counted; 7 tokens over 3 requests: 2, 2, 3.
    assert workload.steps == (
        ((1, 1, 1), (1, 1, 37), ()),
        ((1, 1), (2, 2, 3), ()),
        ((), (), ()),
    )
    assert workload.working_steps == workload.steps[:2]
    assert workload.idle_steps == 1
    assert workload.idle_note == (
        "t.jsonl at DP 3: 1 of 3 steps had every rank idle; vLLM does not step "
        "then, so they are counted here and not run"
    )
    # Dealt two to a step, in order: rank batches keep their order, the idle
    # ones included.
    dealt = workload.at_dp_size(2)
    assert dealt.steps == (
        ((1, 1, 1), (1, 1, 37)),
        ((), (1, 1)),
        ((2, 2, 3), ()),
        ((), ()),
    )
    assert dealt.idle_steps == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "t.jsonl:2: invalid JSON"),
        ('{"rank": []}', 't.jsonl:2: expected an object with a "ranks" list'),
        ('{"ranks": [[1]]}', "t.jsonl:2: 1 ranks, but earlier steps have 2"),
        (
            '{"ranks": [[1], [0]]}',
            "t.jsonl:2: rank 1: query lengths: each must be an integer >= 1, got 0",
        ),
        ('{"ranks": [[1], "x"]}', "t.jsonl:2: rank 1: a rank is a list"),
        (
            '{"ranks": [[1], {"num_reqs": 4, "num_tokens": 2}]}',
            "t.jsonl:2: rank 1: 4 requests cannot hold 2 tokens",
        ),
        (
            '{"ranks": [[1], {"query_lens": [1, 2], "num_tokens": 5}]}',
            "t.jsonl:2: rank 1: num_tokens 5 does not match query_lens (3)",
        ),
        ('{"ranks": [[1], {"lens": [1]}]}', "t.jsonl:2: rank 1: unknown key 'lens'"),
        ('{"ranks": [[1], [1]], "extra": 1}', "t.jsonl:2: unknown key 'extra'"),
    ],
)
def test_trace_errors_name_file_and_line(line: str, message: str) -> None:
    with pytest.raises(WorkloadError) as error:
        parse_trace(['{"ranks": [[1], [1]]}', line], "t.jsonl")
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_trace_without_work_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no step with work"):
        parse_trace(['{"ranks": [[], []]}'], "t.jsonl")
    with pytest.raises(WorkloadError, match="no such trace file"):
        resolve_workload(str(tmp_path / "missing.jsonl"), 2, 10, 0)
    with pytest.raises(WorkloadError, match="unknown workload 'heavy'"):
        resolve_workload("heavy", 2, 10, 0)


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builtin_workloads_are_seeded_and_capped(name: str) -> None:
    q = 4 if name == "spec-decode" else 1
    first = builtin_workload(name, 4, 30, seed=1, max_reqs=16, decode_query_len=q)
    assert first == builtin_workload(
        name, 4, 30, seed=1, max_reqs=16, decode_query_len=q
    )
    assert first != builtin_workload(
        name, 4, 30, seed=2, max_reqs=16, decode_query_len=q
    )
    assert len(first.steps) == 30
    assert all(len(step) == 4 for step in first.steps)
    assert all(len(lengths) <= 16 for step in first.steps for lengths in step)
    assert first.working_steps


# -- workload bounds, spec-decode's decode length, all-idle steps ----------------


def _trace_error(lines: list[str]) -> str:
    with pytest.raises(WorkloadError) as error:
        parse_trace(lines, "t.jsonl")
    message = str(error.value)
    assert "\n" not in message and len(message) < 300
    return message


@pytest.mark.parametrize(
    ("rank", "message"),
    [
        # Refused before a list of a billion lengths is built.
        (
            '{"num_reqs": 1000000000, "num_tokens": 1000000000}',
            f"num_reqs must be at most {limits.MAX_NUM_SEQS:,}, got 1000000000",
        ),
        (
            '{"num_reqs": 1, "num_tokens": 4611686018427387904}',
            f"num_tokens must be at most {limits.MAX_INT:,}, got 4611686018427387904",
        ),
        (
            json.dumps([1] * (limits.MAX_NUM_SEQS + 1)),
            f"{limits.MAX_NUM_SEQS + 1:,} requests; at most {limits.MAX_NUM_SEQS:,}",
        ),
        (
            "[2147483647, 2147483647]",
            f"4,294,967,294 tokens; at most {limits.MAX_INT:,} per rank",
        ),
        (
            f"[{2**100}]",
            f"query lengths: each must be at most {limits.MAX_INT:,}, got an integer "
            "of 101 bits",
        ),
    ],
)
def test_trace_counts_are_bounded(rank: str, message: str) -> None:
    got = _trace_error([f'{{"ranks": [[1], {rank}]}}'])
    assert got.startswith(f"t.jsonl:1: rank 1: {message}")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"ranks": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ('{"ranks": [[' + "9" * 5000 + "]]}", "invalid JSON: Exceeds the limit"),
        (
            json.dumps({"ranks": [[1]] * (limits.MAX_RANKS + 1)}),
            f"{limits.MAX_RANKS + 1:,} ranks; at most {limits.MAX_RANKS:,}",
        ),
    ],
)
def test_unreadable_trace_lines_are_one_line(line: str, message: str) -> None:
    assert _trace_error([line]).startswith(f"t.jsonl:1: {message}")


def test_a_trace_is_bounded_in_steps_requests_and_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpsim.costs import workload as module

    # Small stand-ins for the limits, so the test stays cheap.
    monkeypatch.setattr(module, "MAX_RANK_STEPS", 4)
    message = _trace_error(['{"ranks": [[1], [1]]}'] * 3)
    assert message == (
        "t.jsonl:3: 3 steps of 2 ranks are 6 rank batches; at most 4 "
        "(every rank's batch of every step is held in memory)"
    )
    monkeypatch.setattr(module, "MAX_WORKLOAD_REQUESTS", 5)
    message = _trace_error(['{"ranks": [[1, 1], [1, 1, 1, 1]]}'])
    assert message == "t.jsonl:1: 6 requests so far; a workload holds at most 5"
    monkeypatch.setattr(module, "MAX_TRACE_BYTES", 10)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"ranks": [[1], [1]]}\n')
    with pytest.raises(WorkloadError) as error:
        resolve_workload(str(trace), 2, 10, 0)
    assert str(error.value) == f"{trace}: 22 bytes; a trace file is at most 10"


def test_a_non_utf8_trace_is_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(b'{"ranks": [[1]]}\n# caf\xe9\n')
    with pytest.raises(WorkloadError, match=r"^.*t\.jsonl: not UTF-8 text \(byte 22\)"):
        resolve_workload(str(trace), 1, 10, 0)


def test_builtin_steps_times_ranks_are_bounded() -> None:
    most = limits.MAX_RANK_STEPS
    assert len(builtin_workload("bursty", 1, most).steps) == most
    with pytest.raises(WorkloadError) as error:
        builtin_workload("decode-heavy", 16, 100_000)
    assert str(error.value) == (
        "decode-heavy: 100,000 steps at DP 16 are 1,600,000 rank batches; at most "
        f"{most:,} (every rank's batch of every step is held in memory)"
    )


def test_spec_decode_follows_the_policies_decode_length() -> None:
    for q in (2, 3, 7):
        workload = builtin_workload("spec-decode", 2, 40, decode_query_len=q)
        assert workload.name == f"spec-decode (decodes of {q} tokens)"
        # Every request below a prefill chunk (>= 16 tokens) is one decode of q.
        decodes = {n for step in workload.steps for rank in step for n in rank}
        assert {n for n in decodes if n < 16} == {q}
    with pytest.raises(WorkloadError, match="but theirs is 1; give policies with"):
        builtin_workload("spec-decode", 2, 40, decode_query_len=1)
    assert decode_query_len_for("spec-decode", {"a": 4, "b": 4}) == 4
    assert decode_query_len_for("decode-heavy", {"a": 1, "b": 4}) == 1
    with pytest.raises(WorkloadError) as error:
        decode_query_len_for("spec-decode", {"a": 1, "b": 4})
    assert str(error.value) == (
        "spec-decode decodes the policies' decode_query_len tokens per request, "
        "but theirs differ (a 1, b 4); compare policies of one decode length, "
        "or give a trace"
    )


def test_a_window_of_only_idle_steps_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"ranks": [[], []]}\n{"ranks": [[1], []]}\n')
    with pytest.raises(WorkloadError) as error:
        resolve_workload(str(trace), 2, 1, 0)
    assert str(error.value) == (
        f"{trace}: every rank is idle in all 1 steps at DP 2; nothing to measure"
    )
    assert resolve_workload(str(trace), 2, 2, 0).idle_steps == 1


@pytest.mark.parametrize(
    ("policies", "extra", "message"),
    [
        ([1], ["--ranks", "2000"], "--ranks '2000': at most 1,024 ranks"),
        (
            [1],
            ["--steps", "100000"],
            "decode-heavy: 100,000 steps at DP 4 are 400,000 rank batches",
        ),
        ([1], ["--workload", "spec-decode"], "but theirs is 1; give policies"),
        ([1, 4], ["--workload", "spec-decode"], "but theirs differ (p0 1, p1 4)"),
    ],
)
def test_validate_refuses_oversized_or_mismatched_workloads_before_loading(
    policies: list[int],
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = []
    for index, q in enumerate(policies):
        path = tmp_path / f"p{index}.toml"
        path.write_text(f"capture_sizes = [1, 2, 4]\ndecode_query_len = {q}\n")
        paths.append(str(path))
    # A release that does not exist: the refusal comes before any target loads.
    arguments = ["policy", "validate", *paths, "--vllm", "no-such-release"]
    assert main([*arguments, "--examples", "0", *extra]) == 2
    error = capsys.readouterr().err
    assert error.startswith("dpsim: error: ") and message in error
    assert error.count("\n") == 1


def test_policy_show_bounds_dp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.toml"
    path.write_text("capture_sizes = [1]\n")
    assert main(["policy", "show", str(path), "--dp", "5000"]) == 2
    assert capsys.readouterr().err == (
        "dpsim: error: --dp must be at most 1,024, got 5000\n"
    )


@pytest.mark.release
def test_all_idle_steps_are_counted_in_the_comparison_not_run() -> None:
    from dpsim.costs import NamedPolicy, compare

    target = load_target("0.33.0")
    policy = CapturePolicy(capture_sizes=(1, 2, 4, 8), max_num_seqs=16)
    workload = Workload("hand", (((1, 1), (1,)), ((), ()), ((1,), ())))
    measured = measure(target, policy, workload)
    assert (len(measured.steps), measured.unfinished) == (2, 0)
    comparison = compare(target, [NamedPolicy("p", policy, "p.toml")], [workload])
    assert comparison.costs[0][0].steps == 2
    assert workload.idle_note in comparison.notes


# -- the command -------------------------------------------------------------------


class _Tags(HTMLParser):
    """Collects tags and checks that every opened element is closed in order."""

    VOID = frozenset({"meta", "img", "br", "link"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.seen: Counter[str] = Counter()
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen[tag] += 1
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        elif tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()


def _policy(tmp_path: Path, name: str, sizes: list[int]) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"capture_sizes = {sizes}\nmax_num_seqs = 32\n")
    return path


@pytest.mark.release
def test_validate_writes_a_report_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = _policy(tmp_path, "small", [1, 2, 4, 8])
    wide = _policy(tmp_path, "wide", [1, 2, 4, 8, 16, 32, 64])
    out = tmp_path / "report"
    common = ["--vllm", "0.33.0", "--steps", "12", "--ranks", "2,4", "--out", str(out)]
    arguments = ["policy", "validate", str(wide), str(small), *common]
    assert main([*arguments, "--examples", "0", "--suggest", "6"]) == 0
    text = capsys.readouterr().out
    assert "DP 2 (12 steps)" in text and "DP 4 (12 steps)" in text
    assert "suggested" in text and "result: PASS" in text
    for name in ("padding.png", "modes.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    parser = _Tags()
    parser.feed((out / "report.html").read_text())
    parser.close()
    assert parser.stack == []
    assert parser.seen["table"] == 2
    assert len(parser.images) == 2
    assert all(src.startswith("data:image/png;base64,iVBOR") for src in parser.images)
    costs = json.loads((out / "costs.json").read_text())
    assert {(c["policy"], c["dp_size"]) for c in costs["costs"]} == {
        (p, d) for p in ("wide", "small", "suggested") for d in (2, 4)
    }

    assert main([*arguments, "--examples", "5", "--profile", "caller", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "pass"
    assert [(s["policy"], s["profile"]) for s in summary["safety"]] == [
        ("wide", "caller"),
        ("small", "caller"),
    ]


@pytest.mark.release
def test_validate_a_real_counterexample_exits_1(
    per_rank_padding: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, "small", [1, 2, 4, 8])
    arguments = ["policy", "validate", str(policy), "--vllm", "0.20.0"]
    arguments += ["--target", str(per_rank_padding), "--profile", "caller"]
    arguments += ["--ranks", "2", "--steps", "5", "--examples", "100"]
    assert main([*arguments, "--out", str(tmp_path / "out")]) == 1
    text = capsys.readouterr().out
    assert "counterexample (shrunk)" in text
    assert "replay:  dpsim replay" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workload", "nosuch"], "unknown workload 'nosuch'"),
        (["--ranks", "0"], "--ranks '0': every DP size must be >= 1"),
        (["--ranks", "a,b"], "--ranks 'a,b': expected N"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--suggest", "0"], "--suggest: the budget must be at least 1 graph"),
    ],
)
@pytest.mark.release
def test_validate_usage_errors_exit_2(
    extra: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = _policy(tmp_path, "small", [1, 2, 4])
    arguments = ["policy", "validate", str(policy), "--vllm", "0.33.0"]
    assert main([*arguments, "--examples", "0", *extra]) == 2
    error = capsys.readouterr().err
    assert message in error
    assert error.count("\n") == 1


@pytest.mark.release
def test_validate_bad_trace_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, "small", [1, 2, 4])
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"ranks": [[1], [1]]}\n{"ranks": [[1], [-3]]}\n')
    arguments = ["policy", "validate", str(policy), "--workload", str(trace)]
    assert main([*arguments, "--examples", "0", "--vllm", "0.33.0"]) == 2
    assert f"{trace}:2: rank 1: query lengths: each must be an integer >= 1" in (
        capsys.readouterr().err
    )


# -- safety first: an unsafe policy is never best ------------------------------


def test_an_unsafe_policy_is_never_best_however_cheap() -> None:
    from dpsim.costs.compare import ROWS, best_columns

    padding = next(row for row in ROWS if row.label == "padding, all tokens")
    cheap = summarise("cheap", 2, 4, [EAGER_STEP])  # no padding at all
    dear = summarise("dear", 2, 4, [GRAPH_STEP])
    padded_further = StepCost(
        mode="FULL", real=(3, 0, 5), passed=(3, 1, 5), ran=(16,) * 3
    )
    dearer = summarise("dearer", 2, 4, [padded_further])
    costs = [cheap, dear, dearer]
    assert best_columns(padding, costs) == {0}
    # Unsafe, the cheapest is out of the running, and the best safe one wins.
    assert best_columns(padding, costs, ("cheap",)) == {1}
    # One safe policy left: nothing to be best against.
    assert best_columns(padding, costs, ("cheap", "dearer")) == set()


@pytest.mark.release
def test_known_findings_match_only_unmodified_releases(tmp_path: Path) -> None:
    from dpsim.known import known_finding

    release = load_target("0.33.0")
    finding = known_finding(release, "ubatch", "caller", "eager-contagion")
    assert finding is not None and finding.number == 1
    assert known_finding(release, "step", "caller", "no-hang") is None
    # The drafter's reuse path: the contract profile only.
    assert known_finding(release, "drafter", "contract", "no-hang") is not None
    assert known_finding(release, "drafter", "caller", "no-hang") is None
    assert (
        known_finding(load_target("0.29.0"), "step", "caller", "eager-contagion")
        is None
    )
    # A --target file on the same release may have fixed the bug, or broken
    # something else the same way: never excused by name.
    copy = tmp_path / "dp_utils.py"
    copy.write_text((release.package_dir / "v1/worker/gpu/dp_utils.py").read_text())
    edited = load_target("0.33.0", copy)
    assert known_finding(edited, "ubatch", "caller", "eager-contagion") is None


@pytest.mark.release
def test_validate_report_puts_safety_first_and_names_known_bugs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0.33.0 ignores need_eager when every rank votes to microbatch (finding 1):
    # the microbatching policy fails through that bug alone.
    small = _policy(tmp_path, "small", [1, 2, 4, 8, 16, 32, 64, 128])
    out = tmp_path / "report"
    arguments = ["policy", "validate", "docs/policies/microbatching.toml", str(small)]
    arguments += ["--vllm", "0.33.0", "--steps", "20", "--ranks", "2"]
    arguments += ["--examples", "60", "--profile", "caller", "--out", str(out)]
    root = Path(__file__).resolve().parent.parent
    assert main([arg.replace("docs/", f"{root}/docs/") for arg in arguments]) == 1
    text = capsys.readouterr().out
    assert "(known bug 1)" in text and "only known bugs of this vLLM" in text
    assert "known bug 1 of vllm 0.33.0: need_eager is ignored" in text
    assert "microbatching: " in text and "(UNSAFE: broke a property" in text
    page = (out / "report.html").read_text()
    assert page.index("<h2>Safety</h2>") < page.index("<h2>Costs</h2>")
    assert "microbatching (unsafe)</th>" in page
    # The unsafe policy's column holds no best cell: only safe policies compete.
    columns = [row.split("<td")[1:] for row in page.split("<tr>") if "<td" in row]
    assert all("class='best'" not in cells[0] for cells in columns)
    costs = json.loads((out / "costs.json").read_text())
    assert costs["unsafe"] == ["microbatching"]
