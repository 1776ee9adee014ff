"""``dpsim policy``: see and judge a capture-size policy before deploying it."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpsim.capture.policy import CapturePolicy, load_policy
from dpsim.capture.table import capture_table
from dpsim.report import describe_policy
from dpsim.scenarios.run import PolicyRefused, manager_for
from dpsim.targets import DEFAULT_RELEASE, load_target
from dpsim.targets.load import Target

HELP = "show the capture table a policy produces on a vLLM version"
EPILOG = f"""\
The table is built by the version's own CudaGraphManager from the policy, so
it is exactly what that vLLM would capture. Policy files are JSON or TOML;
see README.md ("Capture policies") for the format.

examples:
  dpsim policy show my-policy.toml
  dpsim policy show my-policy.json --vllm 0.29.0 --dp 8

(default --vllm: {DEFAULT_RELEASE})
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "policy",
        help=HELP,
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="print the capture table, one descriptor per row",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("policy", metavar="POLICY", help="a policy file (.json/.toml)")
    show.add_argument("--vllm", metavar="SPEC", help="release, tree or package dir")
    show.add_argument(
        "--dp", type=int, default=2, metavar="N", help="DP size (default 2)"
    )
    show.set_defaults(run=run_show)


def run_show(arguments: argparse.Namespace) -> int:
    policy = load_policy(Path(arguments.policy))
    target = load_target(arguments.vllm)
    print(render_tables(target, policy, arguments.dp))
    return 0


def render_tables(target: Target, policy: CapturePolicy, dp_size: int) -> str:
    sections = [_section(f"target table on {target.label}", target, policy, dp_size)]
    if policy.drafter is not None:
        query_len = policy.decode_query_len
        sections.append(
            _section(
                f"drafter prefill table (decode length {query_len}, as the target's)",
                target,
                policy.drafter,
                dp_size,
                query_len,
            )
        )
        sections.append(
            _section(
                "drafter decode table (one token per request)",
                target,
                policy.drafter,
                dp_size,
                1,
            )
        )
    return "\n\n".join(sections)


def _section(
    title: str,
    target: Target,
    policy: CapturePolicy,
    dp_size: int,
    decode_query_len: int | None = None,
) -> str:
    config = policy.manager_config(dp_size)
    if decode_query_len is not None:
        config = replace(config, decode_query_len=decode_query_len)
    lines = [title, f"  policy: {describe_policy(policy)}"]
    try:
        table = capture_table(manager_for(target, config))
    except PolicyRefused as refused:
        lines.append(f"  refused by this vLLM's manager: {refused}")
        return "\n".join(lines)
    lines.append("")
    lines.extend("  " + line for line in table.render().splitlines())
    return "\n".join(lines)
