"""pytest integration: run dpsim's property suite from any checkout.

Installed with dpsim as a ``pytest11`` entry point, so in a vLLM checkout

  pytest --pyargs dpsim.suite --dpsim-vllm .

runs the suite against that tree (add ``-n auto`` for pytest-xdist and
``--junitxml FILE`` for CI). Options, each also read from an environment
variable so CI can set them once (and HypoFuzz, which runs the tests outside
pytest's configuration, sees them too):

  --dpsim-vllm SPEC       DPSIM_VLLM       release, source tree or package dir
  --dpsim-target FILE     DPSIM_TARGET     a dp_utils.py run against --dpsim-vllm
  --dpsim-runner NAME     DPSIM_RUNNER     v1 or v2: whose DP coordination (default
                                           v2 where the vLLM has V2's sync, else v1)
  --dpsim-caller-file FILE DPSIM_CALLER_FILE  V1: a gpu_model_runner.py whose
                                           caller method runs
  --dpsim-policy FILE     DPSIM_POLICY     fix the capture policy (JSON/TOML)
  --dpsim-profile NAME    DPSIM_PROFILE    caller (default) or contract
  --dpsim-ranks LO..HI    DPSIM_RANKS      DP sizes (default 2..16)
  --dpsim-out DIR         DPSIM_OUT        where counterexample files go
  --dpsim-db URL          DPSIM_HYPOTHESIS_DB  shared example database
                                           (see dpsim.database)
  --dpsim-examples N      DPSIM_EXAMPLES   examples per scenario
  --dpsim-coverage        DPSIM_COVERAGE=1 target coverage (lines and branches
                                           of vLLM's sync code the cases ran;
                                           sync lane) printed at the end and
                                           written to OUT/coverage/
  --dpsim-lane NAME       DPSIM_LANE       sync (default: the scenario tests) or
                                           runner (vLLM's real engine loop,
                                           worker, model runner, speculators;
                                           the V2 runner's unless
                                           --dpsim-runner v1)

Hypothesis settings profiles ``dev`` (fast), ``ci`` and ``nightly`` are
registered; pick one with Hypothesis' own ``--hypothesis-profile`` (default
``ci`` under CI=true, else ``dev``). They apply to the dpsim suite only: this
plugin is loaded in every pytest session of an environment that has dpsim, so
it never changes the settings of anyone else's tests.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.reporting import current_reporter

from dpsim import allowances
from dpsim.boundary import SearchStopped
from dpsim.collector import frozen_heap
from dpsim.coverage import suite as coverage_suite
from dpsim.errors import BoundaryError, UsageError, debugging
from dpsim.isolation import EXIT_INTERRUPTED, prints_to_stderr, run_in_child
from dpsim.options import LANE_HELP, RUNNER_HELP
from dpsim.suite.config import SUITE_TEST, SuiteConfig, SuiteOptions, resolve

__all__ = ["SuiteConfig", "current_suite", "suite_options", "suite_settings"]

_BASE = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # No explain phase: it reruns the minimal case a hundred times to annotate
    # Hypothesis' own report, and the suite prints a per-rank table instead.
    phases=tuple(phase for phase in Phase if phase != Phase.explain),
)
settings.register_profile("dev", parent=_BASE, max_examples=40)
settings.register_profile("ci", parent=_BASE, max_examples=150)
settings.register_profile("nightly", parent=_BASE, max_examples=5000)

_OPTIONS = (
    ("vllm", "DPSIM_VLLM", "release, source tree or vllm package dir to test"),
    ("target", "DPSIM_TARGET", "a dp_utils.py run against --dpsim-vllm"),
    ("runner", "DPSIM_RUNNER", RUNNER_HELP),
    (
        "caller-file",
        "DPSIM_CALLER_FILE",
        "V1 runner only: a gpu_model_runner.py whose caller method runs",
    ),
    ("policy", "DPSIM_POLICY", "capture policy file (JSON/TOML) to fix"),
    ("profile", "DPSIM_PROFILE", "generator profile: caller (default) or contract"),
    ("ranks", "DPSIM_RANKS", "DP sizes as LO..HI (default 2..16)"),
    ("out", "DPSIM_OUT", "directory for counterexample files (default dpsim-out)"),
    (
        "db",
        "DPSIM_HYPOTHESIS_DB",
        "shared Hypothesis example database: DIR, redis://HOST:PORT/N, "
        "github:OWNER/REPO[:ARTIFACT] or none",
    ),
    ("examples", "DPSIM_EXAMPLES", "examples per scenario (overrides the profile)"),
    ("lane", "DPSIM_LANE", LANE_HELP),
)


@dataclass(frozen=True)
class _Configured:
    options: SuiteOptions
    #: Settings the flags override (database, max_examples).
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Whether --hypothesis-profile was given (then it is the parent).
    explicit_profile: bool = False
    #: --dpsim-coverage (or DPSIM_COVERAGE): measure target coverage.
    coverage: bool = False


_configured: _Configured | None = None
#: Each suite test's target coverage, as its child sent it (--dpsim-coverage).
_coverage_results: list[dict[str, Any]] = []
_XDIST_KEY = "dpsim_coverage"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dpsim", "dpsim property suite")
    for name, variable, text in _OPTIONS:
        group.addoption(
            f"--dpsim-{name}", default=None, help=f"{text} (env {variable})"
        )
    group.addoption(
        "--dpsim-coverage",
        action="store_true",
        default=False,
        help="target coverage: the lines and branches of the target's own code "
        "the suite's cases ran, printed at the end and written to "
        "OUT/coverage/ (not the `coverage` property; env DPSIM_COVERAGE=1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _configured
    values = {name: config.getoption(f"--dpsim-{name}") for name, _, _ in _OPTIONS}
    try:
        _configured = _configure(
            values,
            config.getoption("hypothesis_profile", None) is not None,
            coverage=bool(config.getoption("--dpsim-coverage", False)),
        )
    except UsageError as error:
        raise pytest.UsageError(f"dpsim: {error}") from None


def _configure(
    values: dict[str, str | None], explicit_profile: bool, *, coverage: bool = False
) -> _Configured:
    merged = {
        name: values.get(name) or os.environ.get(variable) or None
        for name, variable, _ in _OPTIONS
    }
    options = SuiteOptions(
        vllm=merged["vllm"],
        target=merged["target"],
        runner=merged["runner"],
        caller_file=merged["caller-file"],
        policy=merged["policy"],
        profile=merged["profile"] or "caller",
        # The runner lane runs whole engines per rank: fewer ranks by default.
        ranks=merged["ranks"] or ("2..4" if merged["lane"] == "runner" else "2..16"),
        out=merged["out"] or "dpsim-out",
        lane=merged["lane"] or "sync",
    )
    options.validate()
    overrides: dict[str, Any] = {}
    if merged["db"]:
        from dpsim.database import open_database

        overrides["database"] = open_database(merged["db"])
    if merged["examples"]:
        try:
            examples = int(merged["examples"])
        except ValueError:
            examples = 0
        if examples < 1:
            raise UsageError(
                f"--dpsim-examples {merged['examples']!r}: expected a positive number"
            )
        overrides["max_examples"] = examples
    return _Configured(
        options, overrides, explicit_profile, coverage=coverage_suite.enabled(coverage)
    )


def _current() -> _Configured:
    # Outside a pytest session (HypoFuzz workers, plain imports) the
    # environment is all there is.
    return _configured if _configured is not None else _configure({}, False)


def suite_options() -> SuiteOptions:
    return _current().options


def suite_settings() -> settings:
    """The settings the suite's tests run under in this session."""
    configured = _current()
    if configured.explicit_profile:
        parent = settings.default
    else:
        parent = settings.get_profile("ci" if os.environ.get("CI") else "dev")
    return settings(
        parent,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        **configured.overrides,
    )


def current_suite() -> SuiteConfig:
    """What the suite runs against (loaded on first use, then cached)."""
    return resolve(suite_options())


@pytest.fixture(scope="session")
def dpsim_suite() -> SuiteConfig:
    return current_suite()


#: A suite test's status, in its child, when it skipped.
_SKIPPED = 3
#: ... and when dpsim could not drive a case of it (dpsim.boundary).
_CANNOT_DRIVE = 4


class CannotDrive(Exception):
    """dpsim could not drive the target in one of a test's cases: reported as
    the test's error (``E``), never as a failure of vLLM's (``F``)."""


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run each of the suite's scenario tests in a forked child.

    The target is arbitrary code: one that calls ``os._exit(0)`` or crashes
    in C, run in pytest's own process, would end the session with status 0
    and no report, a pass CI would believe. In a child, such an end fails the
    test with the reason (:mod:`dpsim.isolation`), under the same memory and
    CPU allowances as ``dpsim check``. What Hypothesis noted in the child (its
    statistics, its report lines) is handed to the parent's pytest plugin.
    """
    test = pyfuncitem.obj
    if not getattr(test, SUITE_TEST, False):
        return None
    result = run_in_child(
        functools.partial(_run_suite_test, test, pyfuncitem),
        allowance=allowances.from_environment(),
    )
    sys.stderr.write(result.stderr)
    if result.code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    try:
        sent = json.loads(result.stdout)
    except ValueError:
        sent = {"message": result.error}
    if sent.get("coverage") is not None:
        _coverage_results.append(sent["coverage"])
    if sent.get("statistics") is not None:
        pyfuncitem.hypothesis_statistics = sent["statistics"]  # type: ignore[attr-defined]
    if result.code != _CANNOT_DRIVE:  # Hypothesis' reproduce-me note misleads there
        for line in sent.get("reported") or ():
            current_reporter()(line)
    if result.code == _SKIPPED:
        pytest.skip(sent["message"])
    if result.code == _CANNOT_DRIVE:
        raise CannotDrive(sent["message"])
    if result.code != 0:
        pytest.fail(str(sent["message"]), pytrace=False)
    return True


def _run_suite_test(test: Callable[[], None], item: pytest.Function) -> int:
    """In the child: the test's status; its message and Hypothesis' notes on stdout."""
    code, message = 0, None
    measured: Any = None
    try:
        # The child searches like a check: its starting heap out of the
        # collector's full collections (dpsim.collector).
        with prints_to_stderr(), frozen_heap():
            if _current().coverage and suite_options().lane == "sync":
                target = current_suite().target
                with coverage_suite.measuring(target) as measurement:
                    test()
                measured = measurement.result(target.version).to_json()
            else:
                test()
    except pytest.skip.Exception as skipped:
        code, message = _SKIPPED, skipped.msg
    except pytest.fail.Exception as failed:
        code, message = 1, failed.msg
    except (SearchStopped, BoundaryError) as raised:
        error = raised.error if isinstance(raised, SearchStopped) else raised
        if debugging():
            traceback.print_exception(error)
        code, message = _CANNOT_DRIVE, str(error)
    except Exception:
        code, message = 1, traceback.format_exc()
    reporter = current_reporter()
    sent = {
        "message": message,
        "statistics": getattr(item, "hypothesis_statistics", None),
        "reported": getattr(reporter, "results", None),
        "coverage": measured,
    }
    print(json.dumps(sent))
    return code


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A suite test dpsim could not drive (:class:`CannotDrive`) is marked on
    its report, shown as its one line and counted as an error."""
    outcome = yield
    if call.excinfo is not None and call.excinfo.errisinstance(CannotDrive):
        report = outcome.get_result()
        report.dpsim_cannot_drive = True
        report.longrepr = f"dpsim: error: {call.excinfo.value}"


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    if getattr(report, "dpsim_cannot_drive", False):
        return "error", "E", "ERROR"
    return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker hands its tests' coverage to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None and _coverage_results:
        output[_XDIST_KEY] = json.dumps(_coverage_results)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller: what a pytest-xdist worker measured (see above)."""
    sent = getattr(node, "workeroutput", {}).get(_XDIST_KEY)
    if sent:
        _coverage_results.extend(json.loads(sent))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """--dpsim-coverage: the suite's target coverage, every test's merged
    (printed and written once, by the controller under pytest-xdist)."""
    if not _coverage_results or hasattr(terminalreporter.config, "workerinput"):
        return
    options = suite_options()
    title = options.vllm or options.target or "the default release"
    covered = coverage_suite.summary(_coverage_results, options.out, title)
    if covered is not None:
        terminalreporter.write_sep("=", "dpsim target coverage")
        terminalreporter.write_line(covered[0])
