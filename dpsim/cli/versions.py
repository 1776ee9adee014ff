"""``dpsim versions``: the cross-version report (see :mod:`dpsim.versions`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dpsim.check import CheckOptions
from dpsim.cli import add_command, check_output_directory
from dpsim.errors import UsageError
from dpsim.options import (
    PROFILE_HELP,
    SEED_HELP,
    add_lane_argument,
    add_runner_argument,
    parse_ranks,
)
from dpsim.records.case import PROFILES
from dpsim.targets import parse_target
from dpsim.versions import (
    SUPPORTED_RELEASES,
    V1_RELEASES,
    TargetRequest,
    cross_version,
    default_requests,
    exit_status,
    render_html,
    render_markdown,
    render_terminal,
    requests_for,
)

HELP = (
    "check every supported (release, runner) (and files) and write a "
    "Markdown/HTML table"
)
EPILOG = f"""\
One check per release and runner, a row per scenario. Releases default to
V2 runner: {SUPPORTED_RELEASES[0]} .. {SUPPORTED_RELEASES[-1]} (the first of each minor)
V1 runner: {V1_RELEASES[0]} .. {V1_RELEASES[-1]} (every release, patch releases too)
also when files are added with --target FILE@SPEC (FILE run against SPEC, with
the runner its sync belongs to). A named SPEC runs with each runner it has;
--runner restricts everything to one.

examples:
  dpsim versions
  dpsim versions --runner v1 --workers 2
  dpsim versions 0.29.0 0.33.0 --target ./dp_utils.py@0.29.0 --examples 500
  dpsim versions --profile contract --out report/
  dpsim versions --lane runner 0.29.0 0.33.0   the runner lane, one row per release
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "versions", HELP, EPILOG)
    parser.add_argument("specs", nargs="*", metavar="SPEC", help="releases or trees")
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="FILE@SPEC",
        help="a dp_utils.py and the release it runs against (repeatable)",
    )
    add_runner_argument(parser)
    parser.add_argument(
        "--profile", default="caller", choices=PROFILES, help=PROFILE_HELP
    )
    parser.add_argument(
        "--ranks",
        default=None,
        metavar="LO..HI",
        help="default 2..16 (runner lane: 2..4)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=None,
        metavar="N",
        help="default 300 (runner lane: 100)",
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=SEED_HELP)
    parser.add_argument(
        "--workers", type=int, metavar="N", help="processes (default: cores)"
    )
    parser.add_argument(
        "--out",
        default="dpsim-out/versions",
        metavar="DIR",
        help="where report.md and report.html go (default dpsim-out/versions)",
    )
    add_lane_argument(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    check_output_directory(Path(arguments.out), "--out")
    if arguments.lane == "runner":
        from dpsim.lanes.runner import commands

        return commands.versions(arguments)
    if arguments.specs:
        requests = [
            request
            for spec in arguments.specs
            for request in requests_for(spec, arguments.runner)
        ]
    else:
        requests = default_requests(arguments.runner)
    for pair in arguments.target:
        file, separator, vllm = pair.rpartition("@")
        if not separator or not file or not vllm:
            raise UsageError(
                f"--target {pair!r}: expected FILE@SPEC, e.g. dp_utils.py@0.29.0"
            )
        if not Path(file).is_file():
            raise UsageError(f"--target {pair!r}: no such file {file}")
        request = TargetRequest(vllm, str(Path(file).resolve()), arguments.runner)
        # Refused here, in one line, rather than as an error row.
        parse_target(request.vllm, request.target_file, runner=request.runner)
        requests.append(request)
    if arguments.examples is None:
        arguments.examples = 300
    if arguments.ranks is None:
        arguments.ranks = "2..16"
    if arguments.examples < 1:
        raise UsageError("--examples must be at least 1")
    options = CheckOptions(
        profile=arguments.profile,
        ranks=parse_ranks(arguments.ranks),
        examples=arguments.examples,
        seed=arguments.seed,
    )
    out = Path(arguments.out)
    rows = cross_version(requests, options, out, arguments.workers)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(rows, options, out))
    (out / "report.html").write_text(render_html(rows, out))
    print(render_terminal(rows))
    print(f"\nwritten: {out / 'report.md'} and {out / 'report.html'}")
    return exit_status(rows)
