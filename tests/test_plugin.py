"""The pytest plugin and the shared example databases: the suite from any
checkout (a release, a source tree), xdist and JUnit, failures as tables with
their file and replay command, a directory shared by two processes, and Redis
against a real server."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults import OWN_PADDING, RELEASE, write_faulty
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    MultiplexedDatabase,
)

import dpsim.suite.test_dp_sync as suite_module
from dpsim import cex
from dpsim.check import CheckOptions, run_check
from dpsim.cli import main
from dpsim.database import open_database
from dpsim.errors import UsageError
from dpsim.records.case import PROFILES
from dpsim.scenarios import SCENARIOS
from dpsim.suite.config import SuiteOptions
from dpsim.targets import load_target
from dpsim.targets.cache import ensure_release


def _pytest(cwd: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """pytest in a fresh process, from a directory that is not this checkout,
    as a vLLM checkout would run it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_scenario_has_a_test_and_profiles_agree() -> None:
    names = {name for name in dir(suite_module) if name.startswith("test_")}
    assert names == {f"test_{scenario}" for scenario in SCENARIOS}
    for name in names:
        # No fixtures: HypoFuzz does not collect tests that take any.
        assert inspect.signature(getattr(suite_module, name)).parameters == {}
    for profile in PROFILES:
        SuiteOptions(profile=profile).validate()
    with pytest.raises(UsageError):
        SuiteOptions(profile="nope").validate()


def test_the_suite_configuration_imports_without_torch_or_the_cli() -> None:
    # The plugin imports it in every pytest session of an environment with dpsim.
    probe = (
        "import sys, dpsim.suite.config; print(sorted(name for name in sys.modules"
        " if name == 'torch' or name.startswith(('torch.', 'dpsim.cli'))))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert completed.stdout == "[]\n"


def test_database_keys_follow_the_configuration_not_the_checkout() -> None:
    key = SuiteOptions().database_key("step")
    assert key == SuiteOptions(vllm="/any/tree", out="x").database_key("step")
    assert key != SuiteOptions().database_key("drafter")
    assert key != SuiteOptions(profile="contract").database_key("step")
    assert key != SuiteOptions(ranks="2..8").database_key("step")


@pytest.mark.release
def test_suite_against_a_release_with_xdist_junit_and_coverage(tmp_path: Path) -> None:
    """One session of the suite under two xdist workers: JUnit's outcomes, and
    the target coverage each worker's children send back to the controller
    (printed and written), so the session's interpreters start once for both."""
    ensure_release("0.29.0")
    report, out = tmp_path / "junit.xml", tmp_path / "out"
    run = _pytest(
        tmp_path,
        "--pyargs",
        "dpsim.suite",
        "--dpsim-vllm",
        "0.29.0",
        "--dpsim-examples",
        "10",
        "-n",
        "2",
        f"--junitxml={report}",
        *("--dpsim-out", str(out), "--dpsim-coverage"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "dpsim target coverage" in run.stdout
    assert "  v1/worker/gpu/dp_utils.py: lines " in run.stdout
    data = json.loads((out / "coverage" / "coverage.json").read_text())
    assert data["files"][0]["file"] == "v1/worker/gpu/dp_utils.py"
    assert data["files"][0]["lines_executed"] > 0
    # Every scenario that ran, whichever worker ran it.
    scenarios = sorted(item["scenario"] for item in data["contexts"])
    assert scenarios == ["drafter", "profile", "step"]
    assert (out / "coverage" / "index.html").is_file()
    cases = ElementTree.parse(report).getroot().iter("testcase")
    outcomes = {
        case.get("name"): [child.tag for child in case if child.tag != "system-out"]
        for case in cases
    }
    assert outcomes == {
        "test_step": [],
        "test_drafter": [],
        "test_profile": [],
        # 0.29.0 has no microbatching: skipped, saying why.
        "test_ubatch": ["skipped"],
        # The runner lane's test runs only under --dpsim-lane runner.
        "test_runner_lane": ["skipped"],
    }


@pytest.mark.release
def test_the_suite_runs_the_v1_runner_named_in_the_environment(
    tmp_path: Path,
) -> None:
    report = tmp_path / "junit.xml"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider"),
            *("--pyargs", "dpsim.suite", "--dpsim-vllm", "0.33.0"),
            *("--dpsim-examples", "5", f"--junitxml={report}", "-rs"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DPSIM_RUNNER": "v1"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    cases = ElementTree.parse(report).getroot().iter("testcase")
    skipped = {
        case.get("name"): [
            child.get("message") for child in case if child.tag == "skipped"
        ]
        for case in cases
    }
    # V1 has no drafter scenario: skipped, saying whose target it is.
    assert skipped["test_step"] == skipped["test_ubatch"] == []
    assert "(V1 runner)" in skipped["test_drafter"][0]


@pytest.mark.release
def test_a_failure_in_a_source_tree_is_replayed_first_by_another_process(
    tmp_path: Path,
) -> None:
    # A vLLM checkout, built from a cached release's package dir, whose
    # dp_utils pads each rank to its own token count.
    tree = tmp_path / "vllm-checkout"
    shutil.copytree(ensure_release(RELEASE), tree / "vllm")
    write_faulty(OWN_PADDING, tree / "vllm" / "v1" / "worker" / "gpu" / "dp_utils.py")
    database, out = tmp_path / "shared-db", tmp_path / "out"
    common = [
        "--pyargs",
        "dpsim.suite",
        "-k",
        "step",
        "--dpsim-vllm",
        str(tree),
        "--dpsim-ranks",
        "2",
        "--dpsim-out",
        str(out),
    ]

    first = _pytest(tree, *common, "--dpsim-db", str(database), "--hypothesis-seed=1")
    assert first.returncode == 1, first.stdout + first.stderr
    # The failure: the per-rank table, the file and the command that replays it.
    assert "rank |" in first.stdout
    written = next(out.glob("step-*.json"))
    assert f"counterexample: {written}" in first.stdout
    assert f"replay: dpsim replay {written}" in first.stdout
    assert cex.read(written).case.dp_size == 2

    # Another worker, another seed, one example: the shared database's
    # failure is what it runs first.
    one_example = [*common, "--hypothesis-seed=2", "--dpsim-examples", "1"]
    statistics = "--hypothesis-show-statistics"
    second = _pytest(tree, *one_example, "--dpsim-db", str(database), statistics)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "during reuse phase" in second.stdout
    assert "0 passing, 1 failing" in second.stdout
    assert "during generate phase" not in second.stdout
    # Reused, not generated, so from a database: the shared one, since the
    # default one in the checkout was never written.
    assert any(path.is_file() for path in database.rglob("*"))
    assert not (tree / ".hypothesis" / "examples").exists()


def test_bad_options_are_one_line_usage_errors(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--pyargs", "dpsim.suite", "--dpsim-profile", "nope")
    assert run.returncode == 4
    assert "dpsim: profile 'nope'" in run.stderr
    run = _pytest(tmp_path, "--pyargs", "dpsim.suite", "--dpsim-db", "ftp://x")
    assert run.returncode == 4
    assert "expected DIR, redis://" in run.stderr
    run = _pytest(tmp_path, "--pyargs", "dpsim.suite", "--dpsim-runner", "v3")
    assert run.returncode == 4
    assert "dpsim: runner 'v3': expected one of v1, v2" in run.stderr


def test_database_spellings(tmp_path: Path) -> None:
    directory = open_database(str(tmp_path / "db"))
    assert isinstance(directory, DirectoryBasedExampleDatabase)
    assert open_database("none") is None
    # Nothing is fetched until a key is read; the local directory takes writes.
    github = open_database("github:vllm-project/vllm:dpsim-db")
    assert isinstance(github, MultiplexedDatabase)
    for bad in ("", "github:vllm", "github:a/b/c", "s3://bucket", "redis://:x:y"):
        with pytest.raises(UsageError):
            open_database(bad)
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        open_database(str(tmp_path / "file"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A real Redis server on loopback, on a free port, stopped afterwards."""
    server = shutil.which("redis-server")
    if server is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail(
                "redis-server is missing but installable here: `make test` "
                "installs it (or: apt-get install redis-server)"
            )
        pytest.skip("no redis-server, and no root with apt-get to install it")
    port = _free_port()
    process = subprocess.Popen(
        [
            server,
            *("--port", str(port), "--bind", "127.0.0.1"),
            # Nothing on disk: the server lives and dies with the test.
            *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from redis import Redis
        from redis.exceptions import ConnectionError as RedisDown

        client = Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except RedisDown:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.release
def test_redis_database_round_trip_and_replay(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = open_database(redis_url)
    assert database is not None
    database.save(b"key", b"value")
    assert list(database.fetch(b"key")) == [b"value"]
    database.delete(b"key", b"value")
    assert list(database.fetch(b"key")) == []

    target_file = write_faulty(OWN_PADDING, tmp_path / "own_padding.py")
    target = load_target(RELEASE, target_file)
    step = {"scenarios": ("step",), "ranks": (2, 2)}
    found = run_check(target, CheckOptions(**step, examples=300, database=database))
    assert not found.passed
    # Another machine, another seed, one example: it replays the Redis entry.
    command = ["check", "--vllm", RELEASE, "--target", str(target_file)]
    command += ["--scenario", "step", "--ranks", "2", "--examples", "1"]
    command += ["--seed", "5", "--out", str(tmp_path / "out"), "--json"]
    assert main([*command, "--db", redis_url]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "fail"
    # The same run on an empty Redis database (index 1) finds nothing.
    assert main([*command, "--db", redis_url.removesuffix("/0") + "/1"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "pass"
