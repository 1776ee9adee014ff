"""The cross-version report: rows per target and scenario, links, Markdown and HTML."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from dpsim import versions
from dpsim.check import CheckOptions
from dpsim.cli import main
from dpsim.versions import (
    TargetRequest,
    VersionRow,
    cross_version,
    render_html,
    render_markdown,
    render_terminal,
)

pytestmark = pytest.mark.release


def test_a_report_over_two_targets_links_each_failure(
    per_rank_padding: Path, tmp_path: Path
) -> None:
    options = CheckOptions(scenarios=("step",), examples=150)
    requests = [TargetRequest("0.20.0"), TargetRequest("0.20.0", str(per_rank_padding))]
    rows = cross_version(requests, options, tmp_path, workers=1)
    assert [(row.target, row.runner, row.scenario, row.verdict) for row in rows] == [
        ("vllm 0.20.0", "v2", "step", "pass"),
        ("per_rank_padding.py on vllm 0.20.0", "v2", "step", "fail"),
    ]
    failed = rows[1]
    assert failed.counterexample is not None and Path(failed.counterexample).is_file()
    markdown = render_markdown(rows, options, tmp_path)
    assert "| vllm 0.20.0 | v2 | step | pass |  |" in markdown
    relative = Path(failed.counterexample).relative_to(tmp_path)
    assert f"({relative})" in markdown
    HTMLParser().feed(render_html(rows, tmp_path))  # parses without error


def test_an_unloadable_target_is_a_row_not_a_crash(tmp_path: Path) -> None:
    rows = cross_version(
        [TargetRequest("0.17.0", runner="v2")],
        CheckOptions(examples=5),
        tmp_path,
        workers=1,
    )
    assert rows[0].verdict == "error" and "0.15-0.17" in (rows[0].message or "")
    assert rows[0].runner == "v2"


def test_cli_writes_both_files_and_refuses_a_bad_target_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert (
        main(
            [
                "versions",
                "0.29.0",
                "--runner",
                "v2",
                "--examples",
                "20",
                "--workers",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert main(["versions", "--target", "no-at-sign.py"]) == 2
    assert "expected FILE@SPEC" in capsys.readouterr().err


def test_targets_checked_in_children_keep_their_order_and_a_dead_child_is_a_row(
    tmp_path: Path,
) -> None:
    exits = tmp_path / "exits.py"
    # Named like V2's sync, so it is taken for one and executed.
    exits.write_text("import os\nos._exit(7)\ndef dispatch_cg_and_sync_dp(): ...\n")
    requests = [
        TargetRequest("0.29.0", str(exits)),
        TargetRequest("0.17.0", None, "v2"),
    ]
    rows = cross_version(requests, CheckOptions(examples=5), tmp_path, workers=2)
    assert [(row.target, row.verdict, row.message) for row in rows] == [
        (f"{exits} on 0.29.0", "error", "its check ended with exit status 7"),
        (
            "0.17.0",
            "error",
            "vllm 0.17.0 is older than dpsim supports with the V2 "
            "runner (0.18.0 and later): the vLLM 0.15-0.17 API "
            "(get_cudagraph_and_dp_padding, no capture manager) and anything before "
            "it are not adapted (--runner v1 tests its V1 runner); refused without "
            "fetching it",
        ),
    ]


def test_a_check_that_crashes_is_its_targets_error_row_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crashes(*_: object) -> None:
        raise RuntimeError("dpsim bug\nmore detail")

    monkeypatch.setattr(versions, "run_check", crashes)
    rows = cross_version(
        [TargetRequest("0.33.0", runner="v1")], CheckOptions(examples=1), tmp_path, 1
    )
    assert rows == [
        VersionRow(
            "vllm 0.33.0 (V1 runner)",
            "v1",
            "-",
            "error",
            None,
            "RuntimeError: dpsim bug",
            None,
        )
    ]


def test_the_runner_is_a_column_of_every_rendering(tmp_path: Path) -> None:
    rows = [
        VersionRow("vllm 0.29.0 (V1 runner)", "v1", "step", "pass", None, None, None),
        VersionRow("vllm 0.29.0", "v2", "step", "pass", None, None, None),
    ]
    markdown = render_markdown(rows, CheckOptions(), tmp_path)
    assert "| target | runner | scenario | result | counterexample |" in markdown
    assert "| vllm 0.29.0 (V1 runner) | v1 | step | pass |  |" in markdown
    page = render_html(rows, tmp_path)
    assert "<th>runner</th>" in page and "<td>v1</td>" in page
    header = render_terminal(rows).splitlines()[0]
    assert [cell.strip() for cell in header.split("|")] == [
        "target",
        "runner",
        "scenario",
        "result",
    ]
