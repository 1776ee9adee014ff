"""Capture policies, strategies, the contract manager and the table view.

Tests marked ``release`` build vLLM's own ``CudaGraphManager`` from loaded
releases; every expectation about a real table is either read off that
manager or a documented property of it (every capture size appears, per
mode), never a re-implementation of its construction rules.
"""

from __future__ import annotations

import enum
import inspect
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from dpsim import limits
from dpsim.capture import (
    ContractManager,
    candidates_for,
    capture_table,
    descriptor_tables,
    is_compatible,
    load_policy,
)
from dpsim.capture.contract import make_descriptor
from dpsim.capture.policy_files import to_json, to_toml
from dpsim.capture.strategies import adversarial_policies, policies, realistic_policies
from dpsim.errors import UsageError
from dpsim.records.policy import (
    ALL_CAPABILITIES,
    NO_CAPABILITIES,
    Capabilities,
    CapturePolicy,
    CudagraphMode,
    Microbatching,
    PolicyError,
    vllm_default_sizes,
)
from dpsim.targets import load_target

# ---------------------------------------------------------------- policies


def test_policy_is_normalised_and_defaults_are_vllms() -> None:
    policy = CapturePolicy(capture_sizes=[8, 1, 4])  # type: ignore[arg-type]
    assert policy.capture_sizes == (1, 4, 8)
    assert policy.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert policy.max_num_seqs == 256
    assert policy.effective_max_capture_size == 8
    assert hash(policy) == hash(CapturePolicy(capture_sizes=(1, 4, 8)))


def test_mode_is_an_enum_written_as_vllms_name() -> None:
    policy = CapturePolicy(capture_sizes=(1,), cudagraph_mode="FULL")  # type: ignore[arg-type]
    assert policy.cudagraph_mode is CudagraphMode.FULL
    assert [mode.value for mode in CudagraphMode] == [
        "NONE",
        "PIECEWISE",
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    ]
    data = policy.to_dict()
    assert type(data["cudagraph_mode"]) is str
    assert '"cudagraph_mode": "FULL",' in to_json(policy)
    assert 'cudagraph_mode = "FULL"\n' in to_toml(policy)
    assert f"{policy.cudagraph_mode}" == "FULL"


def test_default_grid_is_vllms_shape() -> None:
    grid = vllm_default_sizes(512)
    assert grid[:5] == (1, 2, 4, 8, 16)
    assert all(b - a == 8 for a, b in itertools.pairwise(grid[3:35]))
    assert grid[34:] == tuple(range(256, 513, 16))
    assert vllm_default_sizes(1) == (1,)
    assert vllm_default_sizes(20) == (1, 2, 4, 8, 16)


BAD_POLICIES = [
    (
        {"capture_sizes": []},
        "capture_sizes: empty, but cudagraph_mode FULL_AND_PIECEWISE captures "
        "graphs (use cudagraph_mode NONE for an eager-only policy)",
    ),
    (
        {"capture_sizes": [1, 0]},
        "capture_sizes: every size must be an integer >= 1, got 0",
    ),
    (
        {"capture_sizes": [-8]},
        "capture_sizes: every size must be an integer >= 1, got -8",
    ),
    (
        {"capture_sizes": [1, True]},
        "capture_sizes: every size must be an integer >= 1, got True",
    ),
    ({"capture_sizes": [4, 4]}, "capture_sizes: size 4 is listed twice"),
    ({"capture_sizes": 8}, "capture_sizes: expected a list of integers, got 8"),
    (
        {"capture_sizes": [1], "cudagraph_mode": "FULL_GRAPH"},
        "cudagraph_mode: unknown mode 'FULL_GRAPH'; expected one of NONE, "
        "PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE",
    ),
    (
        {"capture_sizes": [1], "decode_query_len": 0},
        "decode_query_len: must be an integer >= 1, got 0",
    ),
    (
        {"capture_sizes": [1], "max_num_seqs": 0},
        "max_num_seqs: must be an integer >= 1, got 0",
    ),
    (
        {"capture_sizes": [1], "max_capture_size": 0},
        "max_capture_size: must be an integer >= 1, got 0 "
        "(leave it out for the largest capture size)",
    ),
    (
        {"capture_sizes": [1], "lora_capture_cases": [0, -1]},
        "lora_capture_cases: every case must be an integer >= 0, got -1",
    ),
    (
        {"capture_sizes": [1], "lora_capture_cases": []},
        "lora_capture_cases: empty; leave it out (or null) for no LoRA",
    ),
    (
        {"capture_sizes": [1], "varlen_decode": "yes"},
        "varlen_decode: must be true or false, got 'yes'",
    ),
    (
        {"capture_sizes": [1], "microbatching": {"num_ubatches": 1}},
        "microbatching.num_ubatches: must be an integer >= 2, got 1",
    ),
    (
        {"capture_sizes": [1], "microbatching": {"decode_token_threshold": -1}},
        "microbatching.decode_token_threshold: must be an integer >= 0, got -1",
    ),
    (
        {"capture_sizes": [1], "microbatching": {"prefill_token_threshold": -5}},
        "microbatching.prefill_token_threshold: must be an integer >= 0, got -5",
    ),
    (
        {"capture_sizes": [1], "microbatching": {"ubatch": 2}},
        "microbatching: unknown key 'ubatch' (known keys: num_ubatches, "
        "decode_token_threshold, prefill_token_threshold)",
    ),
    (
        {"capture_sizes": [1], "drafter": {"capture_sizes": [0]}},
        "drafter: capture_sizes: every size must be an integer >= 1, got 0",
    ),
    (
        {
            "capture_sizes": [1],
            "drafter": {"capture_sizes": [1], "drafter": {"capture_sizes": [1]}},
        },
        "drafter.drafter: a drafter has no drafter of its own",
    ),
    ({"cudagraph_mode": "FULL"}, "missing required key 'capture_sizes'"),
    (
        {"capture_sizes": [1], "capture_size": [2]},
        "unknown key 'capture_size' (known keys: capture_sizes, cudagraph_mode, "
        "max_num_seqs, decode_query_len, lora_capture_cases, varlen_decode, "
        "max_capture_size, microbatching, drafter, encoder_decoder)",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_POLICIES)
def test_invalid_policies_are_refused_in_one_line(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        CapturePolicy.from_dict(data)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, UsageError)


def test_eager_policy_may_have_no_sizes() -> None:
    policy = CapturePolicy(capture_sizes=(), cudagraph_mode="NONE")
    assert policy.manager_config().capture_sizes == ()


def test_default_sizes_follow_vllms_derived_ceiling() -> None:
    policy = CapturePolicy.from_dict(
        {"capture_sizes": "default", "max_num_seqs": 8, "decode_query_len": 2}
    )
    # min(8 * 2 * 2, 512) = 32
    assert policy.capture_sizes == (1, 2, 4, 8, 16, 24, 32)
    explicit = CapturePolicy.from_dict(
        {"capture_sizes": "default", "max_capture_size": 256}
    )
    assert explicit.capture_sizes == vllm_default_sizes(256)


FULL_EXAMPLE = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16, 24, 32),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=128,
    decode_query_len=4,
    lora_capture_cases=(0, 1, 2, 4, 5),
    varlen_decode=True,
    max_capture_size=32,
    microbatching=Microbatching(2, 16, 256),
    drafter=CapturePolicy(
        capture_sizes=(1, 2, 4, 8), cudagraph_mode="FULL_DECODE_ONLY"
    ),
)


def test_manager_configs_carry_every_setting() -> None:
    config = FULL_EXAMPLE.manager_config(dp_size=4)
    assert config.capture_sizes == FULL_EXAMPLE.capture_sizes
    assert config.cudagraph_mode == "FULL_AND_PIECEWISE"
    assert (config.max_num_seqs, config.decode_query_len) == (128, 4)
    assert config.lora_capture_cases == (0, 1, 2, 4, 5)
    assert config.varlen_decode is True
    assert config.max_capture_size == 32
    assert config.microbatching == Microbatching(2, 16, 256)
    assert config.data_parallel_size == 4
    drafter = FULL_EXAMPLE.drafter_manager_config(dp_size=4)
    assert drafter is not None
    assert (drafter.cudagraph_mode, drafter.capture_sizes) == (
        "FULL_DECODE_ONLY",
        (1, 2, 4, 8),
    )
    assert drafter.data_parallel_size == 4
    assert CapturePolicy(capture_sizes=(1,)).drafter_manager_config() is None
    with pytest.raises(PolicyError, match="dp_size: must be an integer >= 1, got 0"):
        FULL_EXAMPLE.manager_config(dp_size=0)


def test_unsupported_features_are_refused_for_a_version() -> None:
    FULL_EXAMPLE.check_supported(ALL_CAPABILITIES)
    with pytest.raises(PolicyError, match=r"^lora_capture_cases is set but"):
        FULL_EXAMPLE.check_supported(NO_CAPABILITIES)
    no_lora = replace(
        FULL_EXAMPLE, lora_capture_cases=None, varlen_decode=False, microbatching=None
    )
    no_lora.check_supported(NO_CAPABILITIES)
    # [0] is what the manager assumes without LoRA: needs no support.
    replace(no_lora, lora_capture_cases=(0,)).check_supported(NO_CAPABILITIES)
    bad_drafter = replace(
        no_lora, drafter=CapturePolicy(capture_sizes=(1,), varlen_decode=True)
    )
    with pytest.raises(PolicyError, match=r"^drafter: varlen_decode is set but"):
        bad_drafter.check_supported(NO_CAPABILITIES)


def test_dict_and_json_round_trip_with_stable_key_order() -> None:
    data = FULL_EXAMPLE.to_dict()
    assert list(data) == [
        "capture_sizes",
        "cudagraph_mode",
        "max_num_seqs",
        "decode_query_len",
        "lora_capture_cases",
        "varlen_decode",
        "max_capture_size",
        "microbatching",
        "drafter",
    ]
    assert data["drafter"]["drafter"] is None
    assert CapturePolicy.from_dict(json.loads(to_json(FULL_EXAMPLE))) == FULL_EXAMPLE
    assert to_json(FULL_EXAMPLE) == to_json(CapturePolicy.from_dict(data))


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_file_round_trip(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"policy{suffix}"
    path.write_text(
        to_json(FULL_EXAMPLE) if suffix == ".json" else to_toml(FULL_EXAMPLE)
    )
    assert load_policy(path) == FULL_EXAMPLE
    minimal = CapturePolicy(capture_sizes=(8,), cudagraph_mode="FULL")
    path.write_text(to_json(minimal) if suffix == ".json" else to_toml(minimal))
    assert load_policy(path) == minimal


def test_module_docstring_example_loads(tmp_path: Path) -> None:
    import dpsim.capture.policy_files as module

    doc = module.__doc__ or ""
    block = doc.split(".. code-block:: toml\n", 1)[1].split("\nThe JSON form", 1)[0]
    lines = [line[4:] for line in block.splitlines()]
    path = tmp_path / "example.toml"
    path.write_text("\n".join(lines))
    policy = load_policy(path)
    assert policy.lora_capture_cases == (0, 1, 2, 4, 8)
    assert policy.microbatching == Microbatching(2, 32, 512)
    assert (
        policy.drafter is not None
        and policy.drafter.cudagraph_mode == "FULL_DECODE_ONLY"
    )


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("p.json", None, "no such policy file"),
        (
            "p.json",
            '{"capture_sizes": [1,]}',
            "invalid JSON at line 1 column 22: Expecting value",
        ),
        ("p.toml", "capture_sizes = [1\n", "invalid TOML: "),
        (
            "p.toml",
            "capture_sizes = [1]\nmode = 'FULL'\n",
            "unknown key 'mode' (known keys: ",
        ),
        (
            "p.toml",
            "capture_sizes = [0]\n",
            "capture_sizes: every size must be an integer >= 1, got 0",
        ),
        (
            "p.json",
            '{"capture_sizes": [1], "microbatching": {"num_ubatches": [2]}}',
            "microbatching.num_ubatches: must be an integer >= 2, got [2]",
        ),
        ("p.json", "[1, 2]", "expected a table of policy keys, got [1, 2]"),
        (
            "p.yaml",
            "capture_sizes: [1]",
            "unknown policy file type '.yaml'; use .json or .toml",
        ),
    ],
)
def test_load_policy_errors_name_the_file(
    tmp_path: Path, name: str, text: str | None, message: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert "\n" not in str(caught.value)


# ------------------------------------------------------ bounds, consistency

# Each bound is read from dpsim.limits, so a test never restates a number.
BOUNDED_KEYS = [
    ("max_num_seqs", limits.MAX_NUM_SEQS),
    ("decode_query_len", limits.MAX_DECODE_QUERY_LEN),
    ("max_capture_size", limits.MAX_CAPTURE_SIZE),
]


@pytest.mark.parametrize(("key", "most"), BOUNDED_KEYS)
def test_policy_numbers_are_bounded_at_their_limit(key: str, most: int) -> None:
    sizes = {"capture_sizes": [1], "max_capture_size": 1}
    assert getattr(CapturePolicy.from_dict({**sizes, key: most}), key) == most
    for huge in (most + 1, 10**8, 2**62):
        with pytest.raises(PolicyError) as caught:
            CapturePolicy.from_dict({**sizes, key: huge})
        assert str(caught.value).startswith(f"{key}: must be at most {most:,}, got")


BOUNDED_POLICIES = [
    (
        {"capture_sizes": [1, 2**62]},
        f"capture_sizes: every size must be at most {limits.MAX_CAPTURE_SIZE:,}, "
        f"got {2**62}",
    ),
    (
        # The default grid is never built up to a ceiling that is refused.
        {"capture_sizes": "default", "max_capture_size": 2**62},
        f"max_capture_size: must be at most {limits.MAX_CAPTURE_SIZE:,}, "
        f"got {2**62} (leave it out for the largest capture size)",
    ),
    (
        {"capture_sizes": list(range(1, limits.MAX_CAPTURE_ENTRIES + 2))},
        f"capture_sizes: {limits.MAX_CAPTURE_ENTRIES + 1:,} entries; at most "
        f"{limits.MAX_CAPTURE_ENTRIES:,} allowed",
    ),
    (
        {
            "capture_sizes": [1],
            "lora_capture_cases": list(range(limits.MAX_LORA_CASES + 1)),
        },
        f"lora_capture_cases: {limits.MAX_LORA_CASES + 1} entries; at most "
        f"{limits.MAX_LORA_CASES} allowed",
    ),
    (
        {"capture_sizes": [1], "lora_capture_cases": [0, 2**40]},
        f"lora_capture_cases: every case must be at most {limits.MAX_INT:,}, "
        f"got {2**40}",
    ),
    (
        {
            "capture_sizes": list(range(1, 301)),
            "lora_capture_cases": list(range(16)),
        },
        "capture_sizes x lora_capture_cases: 4,800 graphs per mode; at most "
        f"{limits.MAX_GRAPHS_PER_MODE:,} (the manager's build time grows with "
        "the square of it)",
    ),
    (
        {"capture_sizes": [1], "microbatching": {"num_ubatches": 10**6}},
        f"microbatching.num_ubatches: must be at most {limits.MAX_UBATCHES}, "
        f"got {10**6}",
    ),
    (
        {"capture_sizes": [1], "microbatching": {"decode_token_threshold": 2**40}},
        "microbatching.decode_token_threshold: must be at most "
        f"{limits.MAX_INT:,}, got {2**40}",
    ),
    (
        {"capture_sizes": [1], "max_num_seqs": 10**5000},
        f"max_num_seqs: must be at most {limits.MAX_NUM_SEQS:,}, got an integer "
        f"of {(10**5000).bit_length()} bits",
    ),
    (
        {"capture_sizes": [1], "drafter": {"capture_sizes": [1], "max_num_seqs": -1}},
        "drafter: max_num_seqs: must be an integer >= 1, got -1",
    ),
]


@pytest.mark.parametrize(("data", "message"), BOUNDED_POLICIES)
def test_oversized_policies_are_refused_in_one_line(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        CapturePolicy.from_dict(data)
    assert str(caught.value) == message


def test_drafters_nested_deep_are_refused_at_the_second(tmp_path: Path) -> None:
    data: dict[str, Any] = {"capture_sizes": [1]}
    for _ in range(900):
        data = {"capture_sizes": [1], "drafter": data}
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value) == (
        f"{path}: drafter.drafter: a drafter has no drafter of its own"
    )


def test_dp_size_is_bounded_by_the_ranks_limit() -> None:
    policy = CapturePolicy(capture_sizes=(1,))
    assert policy.manager_config(limits.MAX_RANKS).data_parallel_size == (
        limits.MAX_RANKS
    )
    with pytest.raises(PolicyError, match=r"^dp_size: must be at most 1,024, got"):
        policy.manager_config(limits.MAX_RANKS + 1)


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


DEEP = 100_000


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "p.json",
            b'{"capture_sizes": [1], "cudagraph_mode": "\xff"}',
            "not UTF-8 text (byte 42)",
        ),
        ("p.toml", b"capture_sizes = [1]\n# caf\xe9\n", "not UTF-8 text (byte "),
        ("p.json", "[" * DEEP + "]" * DEEP, "nested too deeply to be a policy"),
        (
            "p.json",
            '{"capture_sizes": ' + "[" * DEEP + "]" * DEEP + "}",
            "nested too deeply to be a policy",
        ),
        (
            "p.toml",
            "capture_sizes = " + "[" * DEEP + "]" * DEEP + "\n",
            "nested too deeply to be a policy",
        ),
        ("p.json", '{"capture_sizes": [' + "9" * 5000 + "]}", "invalid JSON: "),
        ("p.toml", "capture_sizes = [" + "9" * 5000 + "]\n", "invalid TOML: "),
        (
            "p.json",
            '{"capture_sizes": [1], "max_num_seqs": 100000000}',
            f"max_num_seqs: must be at most {limits.MAX_NUM_SEQS:,}, got 100000000",
        ),
        (
            "p.toml",
            "capture_sizes = [1]\n" + "#" * limits.MAX_POLICY_BYTES + "\n",
            f"{limits.MAX_POLICY_BYTES + 21:,} bytes; a policy file is at most "
            f"{limits.MAX_POLICY_BYTES:,}",
        ),
    ],
)
def test_unreadable_policy_files_are_one_line(
    tmp_path: Path, name: str, content: str | bytes, message: str
) -> None:
    path = _write(tmp_path / name, content)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            "capture_sizes = [1, 2, 4, 8]\nmax_capture_size = 4\n",
            "max_capture_size 4 differs from the largest capture size 8, which "
            "vLLM refuses (CompilationConfig.post_init_cudagraph_sizes, "
            "vllm/config/compilation.py); leave it out or set it to 8",
        ),
        (
            "capture_sizes = [1, 2]\nmax_capture_size = 64\n",
            "max_capture_size 64 differs from the largest capture size 2, which ",
        ),
        (
            "capture_sizes = [1, 2]\n[drafter]\ncapture_sizes = [1, 4]\n"
            "max_capture_size = 2\n",
            "drafter: max_capture_size 2 differs from the largest capture size 4",
        ),
    ],
)
def test_policy_files_keep_vllms_ceiling_rule(
    tmp_path: Path, policy: str, message: str
) -> None:
    path = _write(tmp_path / "p.toml", policy)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}: {message}")


def test_a_consistent_or_derived_ceiling_loads(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.toml", "capture_sizes = [1, 8]\nmax_capture_size = 8\n")
    assert load_policy(path).max_capture_size == 8
    # The default grid to 300 stops at 288, and vLLM truncates its ceiling to it.
    path = _write(
        tmp_path / "d.toml", 'capture_sizes = "default"\nmax_capture_size = 300\n'
    )
    policy = load_policy(path)
    assert (max(policy.capture_sizes), policy.max_capture_size) == (288, 288)
    # Counterexamples keep the contract profile's tight ceilings: the rule is
    # for deployments (files), not for the contract's policy space.
    tight = CapturePolicy.from_dict({"capture_sizes": [1, 8], "max_capture_size": 4})
    assert tight.max_capture_size == 4


def test_policy_show_refuses_in_one_line_before_loading_a_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpsim.cli import main

    for text, message in [
        ("capture_sizes = [1, 8]\nmax_capture_size = 4\n", "max_capture_size 4"),
        ("capture_sizes = [1]\nmax_num_seqs = 100000000\n", "max_num_seqs: must"),
    ]:
        path = _write(tmp_path / "p.toml", text)
        assert main(["policy", "show", str(path), "--vllm", "no-such-release"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dpsim: error: {path}: {message}")
        assert err.count("\n") == 1


# -------------------------------------------------------------- strategies

CAPABILITY_SETS = [
    ALL_CAPABILITIES,
    NO_CAPABILITIES,
    Capabilities(has_lora=True, has_varlen_decode=False, has_microbatching=False),
    Capabilities(has_lora=True, has_varlen_decode=True, has_microbatching=False),
]


@pytest.mark.parametrize("caps", CAPABILITY_SETS, ids=str)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_policies_are_valid_and_within_capabilities(
    caps: Capabilities, data: st.DataObject
) -> None:
    policy = data.draw(policies(caps))
    policy.check_supported(caps)
    # Construction validated it; a second trip through the file format must
    # validate again and give the same policy.
    assert CapturePolicy.from_dict(json.loads(to_json(policy))) == policy
    assert policy.manager_config().capture_sizes == policy.capture_sizes


#: Seeded, with no example database: a shrunk example depends on the seed
#: and, with a database, on what an earlier run left behind.
SHRUNK = settings(database=None, deadline=None)


def _smallest(strategy: st.SearchStrategy[Any], condition: Any) -> Any:
    return find(strategy, condition, settings=SHRUNK, random=Random(0))


def _drawn(strategy: st.SearchStrategy[Any], condition: Any) -> Any:
    """The first draw meeting ``condition`` (NoSuchExample if none is)."""
    reach = settings(SHRUNK, phases=(Phase.generate,))
    return find(strategy, condition, settings=reach, random=Random(0))


def _tiny(policy: CapturePolicy) -> bool:
    """One FULL graph of size 1 and nothing else set: what every choice's
    simplest option gives (max_num_seqs is a family's fewest: realistic 16,
    adversarial 1)."""
    return (
        policy.capture_sizes == (1,)
        and policy.cudagraph_mode == CudagraphMode.FULL
        and policy.max_num_seqs in (1, 16)
        and policy.lora_capture_cases is None
        and not policy.varlen_decode
        and policy.max_capture_size is None
        and policy.microbatching is None
        and not policy.encoder_decoder
    )


def test_minimal_policies_are_tiny() -> None:
    plain = _smallest(policies(), lambda p: True)
    assert _tiny(plain) and plain.decode_query_len == 1 and plain.drafter is None
    odd = _smallest(adversarial_policies(), lambda p: True)
    assert _tiny(odd) and odd.decode_query_len == 1 and odd.drafter is None
    assert odd.max_num_seqs == 1  # adversarial draws start at one sequence
    spec = _smallest(policies(), lambda p: p.drafter is not None)
    assert spec.drafter is not None
    assert _tiny(spec) and _tiny(spec.drafter)
    # A realistic drafter needs decode_query_len > 1; an adversarial one not.
    assert spec.decode_query_len <= 2 and spec.drafter.decode_query_len == 1
    assert spec.drafter.drafter is None
    tight = _smallest(
        policies(),
        lambda p: (
            p.max_capture_size is not None and p.max_capture_size < max(p.capture_sizes)
        ),
    )
    # The smallest ceiling below the largest size: size 2, ceiling 1.
    assert (tight.capture_sizes, tight.max_capture_size) == ((2,), 1)


def test_realistic_policies_look_like_vllm_defaults() -> None:
    derived = _smallest(
        realistic_policies(),
        lambda p: p.capture_sizes == vllm_default_sizes(512) and p.max_num_seqs == 256,
    )
    assert derived.cudagraph_mode == "FULL" and derived.decode_query_len == 1


@settings(max_examples=100, deadline=None)
@given(realistic_policies(), adversarial_policies())
def test_families_differ_where_they_should(
    real: CapturePolicy, odd: CapturePolicy
) -> None:
    # Realistic drafters decode one token at a time; realistic LoRA cases
    # always include 0 (the no-LoRA graphs).
    if real.drafter is not None:
        assert real.drafter.decode_query_len == 1
    assert real.lora_capture_cases is None or 0 in real.lora_capture_cases
    assert odd.cudagraph_mode != "NONE"


# ---------------------------------------------------------------- contract
# A descriptor and mode enum of our own, shaped like the target's: the
# contract manager must work with whatever fields a version's class has.


class Mode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class Desc:
    cg_mode: Mode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1


@dataclass(frozen=True)
class OldDesc:
    """A 0.18-0.23 style descriptor: no LoRA, query bound or microbatches."""

    cg_mode: Mode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None


F, P, N = Mode.FULL, Mode.PIECEWISE, Mode.NONE

HAND_TABLE = (
    Desc(F, 4, 4, uniform_token_count=1),
    Desc(F, 8, 8, uniform_token_count=1),
    Desc(F, 12, 4, uniform_token_count=3),
    Desc(F, 16, 16, max_query_len=2),
    Desc(P, 8, None),
    Desc(P, 32, None),
    Desc(F, 32, 16, num_ubatches=2),
    Desc(P, 16, None, num_active_loras=2),
)


@pytest.mark.parametrize(
    ("call", "kwargs", "expected"),
    [
        # Uniform decode: the smallest uniform-1 graph that covers 3 tokens.
        ((3, 3, 1), {}, Desc(F, 4, 4, uniform_token_count=1)),
        # Mixed batch: uniform graphs refuse it, PIECEWISE 8 takes it.
        ((2, 3, None), {}, Desc(P, 8, None)),
        # Spec decode of 3 requests x 3 tokens: the uniform-3 graph at 12,
        # although PIECEWISE 32 would also serve.
        ((3, 9, 3), {}, Desc(F, 12, 4, uniform_token_count=3)),
        # Too many requests for the uniform-3 graph: PIECEWISE 32.
        ((5, 10, 2), {}, Desc(P, 32, None)),
        # Bounded query: the max_query_len=2 graph takes 10 tokens of <= 2...
        ((9, 10, None), {"max_query_len": 2}, Desc(F, 16, 16, max_query_len=2)),
        # ...but not a caller that does not know its longest query,
        ((9, 10, None), {}, Desc(P, 32, None)),
        # ...nor one whose longest query is 3.
        ((9, 10, None), {"max_query_len": 3}, Desc(P, 32, None)),
        # LoRA counts must be equal: 2 active LoRAs get the LoRA graph,
        ((1, 5, None), {"num_active_loras": 2}, Desc(P, 16, None, num_active_loras=2)),
        # 1 active LoRA has none: eager, carrying the request as given.
        ((1, 5, None), {"num_active_loras": 1}, Desc(N, 5, 1, num_active_loras=1)),
        # Microbatch counts must be equal.
        ((4, 20, 5), {"num_ubatches": 2}, Desc(F, 32, 16, num_ubatches=2)),
        ((4, 20, 5), {"num_ubatches": 3}, Desc(N, 20, 4, num_ubatches=3)),
        # Beyond every graph: eager with the request's own token count.
        ((1, 33, None), {}, Desc(N, 33, 1)),
        # Nothing to run: eager, never a graph.
        ((0, 0, None), {}, Desc(N, 0, 0)),
    ],
)
def test_contract_dispatch_by_hand(
    call: tuple[int, int, int | None], kwargs: dict[str, Any], expected: Desc
) -> None:
    manager = ContractManager(HAND_TABLE, mode_enum=Mode)
    assert manager.dispatch(*call, **kwargs) == expected


def test_contract_ties_go_to_the_first_listed() -> None:
    full, piecewise = Desc(F, 8, 8), Desc(P, 8, None)
    assert (
        ContractManager([full, piecewise], mode_enum=Mode).dispatch(2, 5, None) is full
    )
    assert (
        ContractManager([piecewise, full], mode_enum=Mode).dispatch(2, 5, None)
        is piecewise
    )


def test_contract_serves_nothing_before_capture() -> None:
    manager = ContractManager(HAND_TABLE, mode_enum=Mode, graphs_captured=False)
    assert manager.dispatch(3, 3, 1) == Desc(N, 3, 3)


def test_contract_with_old_descriptors_sets_only_their_fields() -> None:
    table = (OldDesc(F, 4, 2, uniform_token_count=2), OldDesc(P, 8, None))
    manager = ContractManager(table, mode_enum=Mode)
    # 0.20's dp_utils calls with three positional arguments only.
    assert manager.dispatch(2, 4, 2) == OldDesc(F, 4, 2, uniform_token_count=2)
    assert manager.dispatch(1, 3, None) == OldDesc(P, 8, None)
    assert manager.dispatch(1, 9, None) == OldDesc(N, 9, 1)
    with pytest.raises(ValueError, match="OldDesc has no field 'num_active_loras'"):
        make_descriptor(
            OldDesc, cg_mode=N, num_tokens=1, num_reqs=1, num_active_loras=2
        )
    with pytest.raises(ValueError, match="no eager descriptor"):
        ContractManager([OldDesc(N, 4, 4)], mode_enum=Mode)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=descriptor_tables(Desc, Mode, max_tokens=64),
    num_reqs=st.integers(1, 64),
    num_tokens=st.integers(1, 70),
    uniform=st.one_of(st.none(), st.integers(1, 8)),
    loras=st.sampled_from((0, 1, 2, 4)),
    max_query_len=st.one_of(st.none(), st.integers(1, 16)),
    ubatches=st.sampled_from((1, 2)),
)
def test_contract_result_is_smallest_compatible_or_eager(
    table: tuple[Desc, ...],
    num_reqs: int,
    num_tokens: int,
    uniform: int | None,
    loras: int,
    max_query_len: int | None,
    ubatches: int,
) -> None:
    request = (num_reqs, num_tokens, uniform, loras, max_query_len, ubatches)
    result = ContractManager(table, mode_enum=Mode, descriptor_class=Desc).dispatch(
        num_reqs,
        num_tokens,
        uniform,
        num_active_loras=loras,
        max_query_len=max_query_len,
        num_ubatches=ubatches,
    )
    compatible = [d for d in table if is_compatible(d, *request)]
    if compatible:
        assert result in compatible
        assert result.num_tokens == min(d.num_tokens for d in compatible)
    else:
        assert result == Desc(N, num_tokens, num_reqs, None, None, loras, ubatches)


@given(descriptor_tables(OldDesc, Mode))
def test_generated_tables_use_only_the_class_fields(table: tuple[OldDesc, ...]) -> None:
    assert all(type(d) is OldDesc and d.cg_mode in (F, P) for d in table)
    assert len(set(table)) == len(table)


def test_table_view_renders_one_row_per_descriptor() -> None:
    view = capture_table(ContractManager(HAND_TABLE, mode_enum=Mode))
    assert view.graph_count == len(HAND_TABLE)
    assert view.graph_counts() == {"FULL": 5, "PIECEWISE": 3}
    assert view.render() == (
        "mode       tokens  reqs  uniform  max_q  loras  ubatches\n"
        "FULL           32    16        -      -      0         2\n"
        "FULL           16    16        -      2      0         1\n"
        "FULL           12     4        3      -      0         1\n"
        "FULL            8     8        1      -      0         1\n"
        "FULL            4     4        1      -      0         1\n"
        "PIECEWISE      32     -        -      -      0         1\n"
        "PIECEWISE      16     -        -      -      2         1\n"
        "PIECEWISE       8     -        -      -      0         1\n"
        "8 graphs (FULL 5, PIECEWISE 3)\n"
    )


# ------------------------------------------------------- real managers
# Releases of each era of the manager: list-indexed candidates (0.20), LoRA
# cases (0.24), varlen decode and max_query_len (0.28), per-mode candidates
# (0.29), microbatched twins (0.30), and the newest.

RELEASES = ["0.20.0", "0.24.0", "0.28.0", "0.29.0", "0.30.0", "0.33.0"]


def _target(version: str) -> Any:
    return load_target(version)


def _table_of(manager: Any) -> list[Any]:
    return [d for _, descs in capture_table(manager).descriptors for d in descs]


def _contract_twin(target: Any, manager: Any) -> ContractManager:
    """The same descriptors as the real manager, dispatched by the contract."""
    return ContractManager(
        _table_of(manager),
        mode_enum=target.CUDAGraphMode,
        descriptor_class=target.BatchExecutionDescriptor,
    )


def _dispatch_params(target: Any) -> set[str]:
    return set(inspect.signature(target.manager_class.dispatch).parameters)


@dataclass(frozen=True)
class Request:
    num_reqs: int
    num_tokens: int
    uniform_token_count: int | None
    extra: tuple[tuple[str, int | None], ...]

    def on(self, manager: Any, **override: int | None) -> Any:
        kwargs = dict(self.extra) | override
        return manager.dispatch(
            self.num_reqs, self.num_tokens, self.uniform_token_count, **kwargs
        )


def request_grid(
    target: Any,
    max_tokens: int = 36,
    max_reqs: int = 16,
    loras: tuple[int, ...] = (0,),
    ubatches: tuple[int, ...] = (1,),
) -> Iterator[Request]:
    """Every batch shape a runner can report, small enough to enumerate.

    Uniform count when the tokens divide evenly (and None, which a caller
    may always pass); max_query_len None, the even split, and the widest
    query the shape allows; only the keywords this version's dispatch takes.
    """
    params = _dispatch_params(target)
    for num_tokens in range(1, max_tokens + 1):
        for num_reqs in range(1, min(num_tokens, max_reqs) + 1):
            even, rest = divmod(num_tokens, num_reqs)
            uniforms = [None] if rest else [None, even]
            queries = (
                [None, even + (rest > 0), num_tokens - num_reqs + 1]
                if "max_query_len" in params
                else [None]
            )
            for uniform in uniforms:
                for lora in loras if "num_active_loras" in params else (0,):
                    for query in dict.fromkeys(queries):
                        for ub in ubatches if "num_ubatches" in params else (1,):
                            extra: dict[str, int | None] = {}
                            if "num_active_loras" in params:
                                extra["num_active_loras"] = lora
                            if query is not None:
                                extra["max_query_len"] = query
                            if ub != 1:
                                extra["num_ubatches"] = ub
                            yield Request(
                                num_reqs, num_tokens, uniform, tuple(extra.items())
                            )


SMALL_DEFAULT = dict(capture_sizes=vllm_default_sizes(32), max_num_seqs=16)


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_real_managers_build_from_generated_policies(
    version: str, data: st.DataObject
) -> None:
    target = _target(version)
    caps = Capabilities.of_target(target)
    policy = data.draw(policies(caps))
    params = _dispatch_params(target)
    for config in (policy.manager_config(), policy.drafter_manager_config()):
        if config is None:
            continue
        try:
            manager = target.build_manager(config)
        except ValueError as refused:
            # 0.21-0.24 round sizes to multiples of the decode length in the
            # version's own CompilationConfig, and refuse a policy where none
            # survives under max_capture_size: vLLM's verdict, not ours.
            assert config.decode_query_len > 1, refused
            assert hasattr(
                target.compilation.CompilationConfig,
                "adjust_cudagraph_sizes_for_spec_decode",
            ), refused
            continue
        view = capture_table(manager)
        if config.cudagraph_mode == "NONE":
            assert view.graph_count == 0
        # Every captured graph is reachable: a batch shaped exactly like it
        # is served by a graph of its size (else its memory is wasted).
        for desc in _table_of(manager):
            kwargs: dict[str, Any] = {}
            if "num_active_loras" in params:
                kwargs["num_active_loras"] = desc.num_active_loras
            if "max_query_len" in params:
                kwargs["max_query_len"] = desc.max_query_len
            if "num_ubatches" in params:
                kwargs["num_ubatches"] = desc.num_ubatches
            num_reqs = desc.num_reqs if desc.num_reqs is not None else 1
            got = manager.dispatch(
                num_reqs, desc.num_tokens, desc.uniform_token_count, **kwargs
            )
            assert (got.cg_mode.name, got.num_tokens) != ("NONE", desc.num_tokens), desc
            assert got.num_tokens == desc.num_tokens, (desc, got)


@pytest.mark.release
def test_capabilities_follow_the_version() -> None:
    assert Capabilities.of_target(_target("0.20.0")) == NO_CAPABILITIES
    assert Capabilities.of_target(_target("0.24.0")) == Capabilities(True, False, False)
    assert Capabilities.of_target(_target("0.28.0")) == Capabilities(True, True, False)
    assert Capabilities.of_target(_target("0.30.0")) == ALL_CAPABILITIES


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    "mode", ["FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY"]
)
def test_default_like_table_is_the_versions_own(version: str, mode: str) -> None:
    target = _target(version)
    sizes = vllm_default_sizes(512)
    policy = CapturePolicy(capture_sizes=sizes, cudagraph_mode=mode, max_num_seqs=256)
    manager = target.build_manager(policy.manager_config())
    view = capture_table(manager)

    # The view is the manager's own output, object for object, FULL first.
    own = {str(m.name): list(d) for m, d in manager._capture_descs.items()}
    assert {m: list(d) for m, d in view.descriptors} == own
    assert view.graph_count == sum(len(d) for d in own.values())
    assert len(view.render().splitlines()) == view.graph_count + 2

    # Documented shape of a table without spec decode, LoRA or varlen: every
    # size gets a mixed-batch graph in the mixed mode, and a one-token
    # uniform decode graph in the decode mode up to max_num_seqs.
    by_mode = view.by_mode()
    full_sizes = sorted(d.num_tokens for d in by_mode.get("FULL", ()))
    piecewise_sizes = sorted(d.num_tokens for d in by_mode.get("PIECEWISE", ()))
    decode_sizes = [s for s in sizes if s <= 256]
    if mode == "FULL_AND_PIECEWISE":
        assert piecewise_sizes == list(sizes)
        assert full_sizes == decode_sizes
        assert all(d.uniform_token_count == 1 for d in by_mode["FULL"])
    elif mode == "FULL":
        assert full_sizes == list(sizes) and not piecewise_sizes
        assert all(d.num_reqs == min(d.num_tokens, 256) for d in by_mode["FULL"])
    elif mode == "PIECEWISE":
        assert piecewise_sizes == list(sizes) and not full_sizes
        assert all(d.num_reqs is None for d in by_mode["PIECEWISE"])
    else:
        assert full_sizes == decode_sizes and not piecewise_sizes
    # Each size is among the real manager's own candidates for that count.
    for size in sizes:
        if mode != "FULL_DECODE_ONLY" or size <= 256:
            assert any(d.num_tokens == size for d in candidates_for(manager, size))


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.24.0", "0.29.0", "0.33.0"])
def test_table_counts_lora_cases(version: str) -> None:
    target = _target(version)
    base = CapturePolicy(**SMALL_DEFAULT, cudagraph_mode="PIECEWISE")  # type: ignore[arg-type]
    plain = capture_table(target.build_manager(base.manager_config()))
    lora = replace(base, lora_capture_cases=(0, 1, 2, 4))
    with_lora = capture_table(target.build_manager(lora.manager_config()))
    assert with_lora.graph_count == 4 * plain.graph_count
    assert {r.loras for r in with_lora.rows} == {0, 1, 2, 4}


# Real vs contract: the real manager's answers compared with the contract's
# over its own table. Where they differ, the tests below pin the exact
# difference, version by version.

PLAIN_POLICIES = [
    CapturePolicy(**SMALL_DEFAULT, cudagraph_mode=mode)  # type: ignore[arg-type]
    for mode in ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY")
] + [
    # Odd sizes, and sizes beyond max_num_seqs x decode length.
    CapturePolicy(
        capture_sizes=(3, 96), cudagraph_mode="FULL_AND_PIECEWISE", max_num_seqs=4
    ),
    CapturePolicy(capture_sizes=(1, 7, 13), cudagraph_mode="FULL", max_num_seqs=5),
]


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_real_matches_contract_without_lora_or_spec_decode(version: str) -> None:
    target = _target(version)
    for policy in PLAIN_POLICIES:
        real = target.build_manager(policy.manager_config())
        contract = _contract_twin(target, real)
        differ = [
            r
            for r in request_grid(target, max_tokens=100)
            if r.on(real) != r.on(contract)
        ]
        assert differ == [], (policy, differ[:3])


def _effective_lora(cases: tuple[int, ...], active: int) -> int:
    with_lora = sorted(c for c in cases if c > 0)
    if active <= 0 or not with_lora:
        return active
    return next((c for c in with_lora if c >= active), with_lora[-1])


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.24.0", "0.28.0", "0.29.0", "0.33.0"])
def test_finding_real_rounds_active_loras_up_to_a_captured_case(version: str) -> None:
    """Contract: LoRA counts must be equal. Real (0.24+): an active count is
    first mapped to the smallest captured case at or above it (clamped to the
    largest), and even the eager descriptor carries that mapped count."""
    target = _target(version)
    cases = (0, 1, 2, 4)
    policy = CapturePolicy(**SMALL_DEFAULT, lora_capture_cases=cases)  # type: ignore[arg-type]
    real = target.build_manager(policy.manager_config())
    contract = _contract_twin(target, real)
    grid = list(request_grid(target, loras=(0, 1, 2, 3, 4, 5)))
    differ = [r for r in grid if r.on(real) != r.on(contract)]
    # The whole difference is the mapping: with it, contract == real.
    for r in grid:
        mapped = _effective_lora(cases, dict(r.extra)["num_active_loras"])  # type: ignore[arg-type]
        assert r.on(real) == r.on(contract, num_active_loras=mapped)
    assert {dict(r.extra)["num_active_loras"] for r in differ} == {3, 5}
    three = Request(3, 3, 1, (("num_active_loras", 3),))
    assert three.on(contract).cg_mode.name == "NONE"
    assert three.on(real).num_active_loras == 4
    assert three.on(real).cg_mode.name == "FULL"


SPEC_POLICY = CapturePolicy(
    capture_sizes=(1, 2, 4, 8, 16, 24, 32),
    cudagraph_mode="FULL_AND_PIECEWISE",
    max_num_seqs=16,
    decode_query_len=3,
)


@pytest.mark.release
def test_finding_0_28_decode_graphs_shadow_piecewise_ones() -> None:
    """0.28 keys candidates by the smallest captured size of *any* mode. With
    spec decode, FULL decode graphs sit at multiples of 3 that are not
    capture sizes (3, 6, 9, 18); a mixed batch whose smallest covering size is
    one of them finds only that uniform graph and runs eager, although the
    contract (and 0.29+) would pad it to the next PIECEWISE graph."""
    target = _target("0.28.0")
    real = target.build_manager(SPEC_POLICY.manager_config())
    contract = _contract_twin(target, real)
    table = _table_of(real)
    piecewise = sorted(d.num_tokens for d in table if d.cg_mode.name == "PIECEWISE")
    decode_only = sorted(
        {d.num_tokens for d in table if d.cg_mode.name == "FULL"} - set(piecewise)
    )
    assert decode_only == [3, 6, 9, 18]
    differ = [r for r in request_grid(target) if r.on(real) != r.on(contract)]
    assert differ
    for r in differ:
        ours, theirs = r.on(real), r.on(contract)
        assert (ours.cg_mode.name, theirs.cg_mode.name) == ("NONE", "PIECEWISE")
        smallest_cover = min(
            s for s in {d.num_tokens for d in table} if s >= r.num_tokens
        )
        assert smallest_cover in decode_only
    # e.g. one request of 3 tokens (a short prefill): eager on 0.28.
    prefill = Request(1, 3, None, (("num_active_loras", 0),))
    assert prefill.on(real).cg_mode.name == "NONE"
    assert prefill.on(contract).num_tokens == 4


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.29.0", "0.30.0", "0.33.0"])
def test_finding_real_prefers_a_larger_full_graph_to_a_smaller_piecewise_one(
    version: str,
) -> None:
    """0.29+ tries FULL candidates before PIECEWISE ones, so a uniform decode
    batch of 12 tokens (4 x 3) pads to the FULL graph at 18 although the
    PIECEWISE graph at 16 covers it: "smallest" holds per mode, not overall.
    The 0.28 shadowing is gone."""
    target = _target(version)
    real = target.build_manager(SPEC_POLICY.manager_config())
    contract = _contract_twin(target, real)
    full_only = ContractManager(
        [d for d in _table_of(real) if d.cg_mode.name == "FULL"],
        mode_enum=target.CUDAGraphMode,
        descriptor_class=target.BatchExecutionDescriptor,
    )
    differ = [r for r in request_grid(target) if r.on(real) != r.on(contract)]
    assert differ
    for r in differ:
        ours, theirs = r.on(real), r.on(contract)
        assert (ours.cg_mode.name, theirs.cg_mode.name) == ("FULL", "PIECEWISE")
        assert ours.num_tokens > theirs.num_tokens
        assert ours == r.on(full_only)
    assert {(r.num_tokens, r.uniform_token_count) for r in differ} == {(12, 3), (15, 3)}
    decode = Request(4, 12, 3, (("num_active_loras", 0),))
    assert (decode.on(real).num_tokens, decode.on(contract).num_tokens) == (18, 16)


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.30.0", "0.33.0"])
def test_finding_real_ubatched_dispatch_does_not_look_past_the_smallest_size(
    version: str,
) -> None:
    """Microbatched twins exist only at sizes >= the decode threshold. A
    microbatched request smaller than the smallest twin is matched (0.29+
    candidates) against the smallest FULL size only, so it runs eager,
    where the contract would pad it to the smallest twin."""
    target = _target(version)
    policy = CapturePolicy(
        capture_sizes=(16, 32, 64),
        cudagraph_mode="FULL",
        max_num_seqs=64,
        microbatching=Microbatching(2, 32, 512),
    )
    real = target.build_manager(policy.manager_config())
    contract = _contract_twin(target, real)
    twins = sorted(d.num_tokens for d in _table_of(real) if d.num_ubatches == 2)
    assert twins == [32, 64]
    request = Request(8, 8, 1, (("num_active_loras", 0), ("num_ubatches", 2)))
    assert request.on(real).cg_mode.name == "NONE"
    assert (request.on(contract).num_tokens, request.on(contract).num_ubatches) == (
        32,
        2,
    )
    differ = [
        r
        for r in request_grid(target, max_tokens=64, max_reqs=64, ubatches=(1, 2))
        if r.on(real) != r.on(contract)
    ]
    assert differ
    for r in differ:
        assert dict(r.extra).get("num_ubatches") == 2 and r.num_tokens <= 16
        assert r.on(real).cg_mode.name == "NONE"


@pytest.mark.release
@pytest.mark.parametrize("version", RELEASES)
def test_contract_and_view_know_every_descriptor_field(version: str) -> None:
    # A field added by a future version would be ignored by is_compatible and
    # the table view; this is where that shows first.
    names = {f.name for f in fields(_target(version).BatchExecutionDescriptor)}
    assert names <= {f.name for f in fields(Desc)}
    assert {"cg_mode", "num_tokens", "num_reqs", "uniform_token_count"} <= names


# ------------------------------------------------------ caller policy space
# The caller profile draws policies through a release's BuildRules (what its
# own config code builds); the contract profile draws every valid table.


def _unbuildable(policy: CapturePolicy) -> bool:
    """LoRA cases without 0, or thresholds below the microbatch count."""
    for table in (policy, policy.drafter):
        if table is None:
            continue
        cases, mb = table.lora_capture_cases, table.microbatching
        if cases is not None and 0 not in cases:
            return True
        if (
            mb is not None
            and min(mb.decode_token_threshold, mb.prefill_token_threshold)
            < mb.num_ubatches
        ):
            return True
    return False


@pytest.mark.release
def test_caller_space_never_draws_what_vllm_cannot_build() -> None:
    from dpsim.targets.buildable import rules_of

    rules = rules_of(_target("0.33.0"))
    for with_drafter in (False, True):
        space = policies(with_drafter=with_drafter, rules=rules)
        # Each found (no NoSuchExample): the space draws LoRA and microbatching.
        _drawn(space, lambda p: p.lora_capture_cases is not None)
        _drawn(space, lambda p: p.microbatching is not None)
        with pytest.raises(NoSuchExample):
            find(
                space,
                lambda p: (
                    _unbuildable(p)
                    or (
                        p.max_capture_size is not None
                        and p.max_capture_size != max(p.capture_sizes)
                    )
                ),
                settings=settings(max_examples=400, database=None, deadline=None),
                random=Random(0),
            )


def test_contract_space_still_draws_unbuildable_tables() -> None:
    lora = _smallest(
        policies(),
        lambda p: p.lora_capture_cases is not None and 0 not in p.lora_capture_cases,
    )
    assert lora.lora_capture_cases == (1,)
    low = _smallest(
        policies(),
        lambda p: (
            p.microbatching is not None
            and p.microbatching.decode_token_threshold < p.microbatching.num_ubatches
        ),
    )
    assert low.microbatching is not None
    assert low.microbatching.decode_token_threshold == 0


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_encoder_decoder_is_written_only_when_set_and_read_back(
    tmp_path: Path, suffix: str
) -> None:
    # Off (the default): no key, so every file from before it reads and
    # writes as it did; on: the last key, and it survives a file.
    plain = CapturePolicy(capture_sizes=(1, 2))
    assert "encoder_decoder" not in plain.to_dict()
    assert "encoder_decoder" not in to_json(plain) + to_toml(plain)
    model = replace(plain, encoder_decoder=True)
    assert list(model.to_dict())[-1] == "encoder_decoder"
    path = tmp_path / f"policy{suffix}"
    path.write_text(to_json(model) if suffix == ".json" else to_toml(model))
    assert load_policy(path) == model
    assert CapturePolicy.from_dict(plain.to_dict()) == plain
    assert model.manager_config().encoder_decoder is True


def test_encoder_decoder_must_be_true_or_false() -> None:
    with pytest.raises(PolicyError, match=r"^encoder_decoder: "):
        CapturePolicy.from_dict({"capture_sizes": [1], "encoder_decoder": 1})
