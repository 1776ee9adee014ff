"""``dpsim targets``: fetch, load and show what each target's API looks like."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any

from dpsim import allowances
from dpsim.cli import add_command
from dpsim.errors import UsageError
from dpsim.isolation import prints_to_stderr, run_isolated
from dpsim.options import add_lane_argument, add_runner_argument, lane_runner
from dpsim.targets import Target, load_target
from dpsim.targets.cache import (
    cache_entries,
    cache_root,
    ensure_release,
    refetch_release,
)
from dpsim.targets.compat import fits
from dpsim.targets.spec import ReleaseSpec, check_release, parse_base
from dpsim.targets.v1.load import V1Target

HELP = "fetch, load and show targets (cached releases when none are named)"
EPILOG = """\
A SPEC is a vLLM release (0.29.0), a vLLM source tree or an installed vllm
package directory. With --target FILE, FILE replaces the dp_utils.py of the
single --vllm SPEC. Releases are fetched once into $DPSIM_CACHE
(default ~/.cache/dpsim) and work offline afterwards; each use checks the
cached files against the SHA-256s recorded at fetch time, and a damaged entry
is refused until --refetch replaces it. With no SPEC, every cached release
is loaded (and so checked): with --runner, those that runner runs.

Each target loads with --runner's sync, or its default (V2 where the release
has V2's sync, 0.18 and later; else V1). A V1 target also shows its caller
method (GPUModelRunner._determine_batch_execution_and_padding, with the file
and lines it was cut from, or "modelled" for 0.11.x), its CudagraphDispatcher
and the group its all-reduce runs on.

examples:
  dpsim targets 0.18.0 0.29.0 0.33.0
  dpsim targets --runner v1 0.12.0 0.33.0
  dpsim targets --target ./dp_utils.py --vllm 0.29.0
  dpsim targets --json
  dpsim targets --refetch 0.33.0
  dpsim targets --lane runner 0.29.0 0.33.0   what the runner lane runs for real
  dpsim targets --lane runner --runner v1 0.12.0 0.29.0 0.33.0
                                              the same through the V1 model runner
                                              (a release it cannot drive: refused)
  dpsim targets --lane runner --runner v1 --fetch 0.33.0
"""


def register(commands: Any) -> None:
    parser = add_command(commands, "targets", HELP, EPILOG)
    parser.add_argument(
        "specs",
        nargs="*",
        metavar="SPEC",
        help="releases, trees or package dirs (default: every cached release)",
    )
    parser.add_argument("--target", metavar="FILE", help="a single dp_utils.py")
    parser.add_argument("--vllm", metavar="SPEC", help="what --target runs against")
    add_runner_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--quiet", action="store_true", help="only fetch and load; one line each"
    )
    parser.add_argument(
        "--fetch",
        action="store_true",
        help="only make sure the releases are cached (no loading); for set-up",
    )
    parser.add_argument(
        "--refetch",
        action="store_true",
        help="download the releases again, replacing their cache entries "
        "(repairs a damaged entry)",
    )
    add_lane_argument(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    if arguments.lane == "runner":
        return _runner_lane(arguments)
    if arguments.fetch or arguments.refetch:
        if arguments.fetch and arguments.refetch:
            raise UsageError("--fetch and --refetch exclude each other")
        return fetch(arguments.specs, again=arguments.refetch, runner=arguments.runner)
    requests: list[tuple[str | None, str | None]] = []
    if arguments.target:
        if arguments.specs:
            raise UsageError("--target takes its vLLM from --vllm, not from SPECs")
        requests.append((arguments.vllm, arguments.target))
    elif arguments.vllm:
        raise UsageError("--vllm goes with --target; name releases as SPECs")
    else:
        # Damaged entries too: loading one reports its damage.
        names = arguments.specs or _cached_for(arguments.runner)
        if not names:
            print(f"no releases cached in {cache_root()}; name some, e.g. 0.33.0")
            return 0
        requests.extend((name, None) for name in names)
    # Loading runs the target's code: isolated, as in check.
    return run_isolated(
        functools.partial(_show, arguments, requests),
        allowance=allowances.from_environment(),
    )


def _runner_lane(arguments: argparse.Namespace) -> int:
    """``--lane runner``: per release, what the lane runs for real with the
    model runner ``--runner`` names (V2 by default), with line coverage of
    each function over a few small cases, and what it stands in; a release
    the lane cannot drive is refused in one line, before it is fetched."""
    if arguments.target or arguments.vllm or arguments.refetch:
        raise UsageError(
            "targets --lane runner: name the releases or trees as SPECs "
            "(--target, --vllm and --refetch are the sync lane's)"
        )
    if not arguments.specs:
        raise UsageError("targets --lane runner: name the releases, e.g. 0.33.0")
    from dpsim.lanes.runner.commands import refuse_unsupported
    from dpsim.lanes.runner.sources import lane_modules, wheel_prefixes
    from dpsim.targets.spec import parse_target

    runner = lane_runner("runner", arguments.runner)
    assert runner is not None
    names: list[str] = []
    specs: list[Any] = []
    refused = 0
    for name in arguments.specs:
        try:
            spec = parse_target(name, runner=runner)
            refuse_unsupported(spec)
        except UsageError as error:
            refused += 1
            print(f"dpsim: error: {error}", file=sys.stderr)
            continue
        names.append(name)
        specs.append(spec)
    if arguments.fetch:
        # Set-up for the lane: one download per release, with the files of
        # both runners' lanes (and V1's sync and caller), so that neither
        # lane's first use of the entry fetches it again.
        from dpsim.targets.cache import V1_WANTED

        extra = (
            *wheel_prefixes(
                tuple(dict.fromkeys((*lane_modules("v2"), *lane_modules("v1"))))
            ),
            *V1_WANTED,
        )
        fetched = fetch(names, runner=runner, extra=extra) if names else 0
        return 2 if refused else fetched
    shown = (
        run_isolated(
            functools.partial(_show_runner_lane, arguments, specs),
            allowance=allowances.from_environment(),
        )
        if specs
        else 0
    )
    return 2 if refused else shown


def _show_runner_lane(arguments: argparse.Namespace, specs: list[Any]) -> int:
    from dpsim.lanes.runner.report import coverage_json, lane_coverage, render_coverage
    from dpsim.targets import load_spec

    failures = 0
    for spec in specs:
        try:
            with prints_to_stderr():
                target = load_spec(spec)
                found = lane_coverage(target)
        except UsageError as error:
            failures += 1
            print(f"dpsim: error: {error}", file=sys.stderr)
            continue
        if not found.ran and found.refused:
            # Not one case ran: the lane cannot drive this release at all.
            failures += 1
            print(f"dpsim: error: {found.refused[0][1]}", file=sys.stderr)
            continue
        if arguments.json:
            print(json.dumps(coverage_json(target, found), sort_keys=True))
        else:
            print(render_coverage(target, found))
    return 2 if failures else 0


def _cached_for(runner: str | None) -> list[str]:
    """The cached releases to show: those ``runner`` runs, or every one (each
    with its default runner) when none is named."""
    names = cache_entries()
    if runner is None:
        return names
    runs = []
    for name in names:
        try:
            check_release(name, runner)
        except UsageError:
            continue
        runs.append(name)
    return runs


def _show(
    arguments: argparse.Namespace, requests: list[tuple[str | None, str | None]]
) -> int:
    failures = 0
    for vllm, target_file in requests:
        try:
            with prints_to_stderr():
                target = load_target(vllm, target_file, runner=arguments.runner)
        except UsageError as error:
            failures += 1
            print(f"dpsim: error: {error}", file=sys.stderr)
            continue
        if arguments.json:
            print(json.dumps(describe(target), sort_keys=True))
        elif arguments.quiet:
            print(f"ok  {target.label}")
        else:
            print(render(target))
    return 2 if failures else 0


def fetch(
    versions: list[str],
    *,
    again: bool = False,
    runner: str | None = None,
    extra: tuple[str, ...] = (),
) -> int:
    """Cache each release (``again``: replace its entry), without loading it.

    A release dpsim would refuse to load (with ``runner``, or with either
    runner) is refused here too, before its wheel is downloaded. ``extra``:
    the runner lane's files, kept with the entry (fetched again once if it
    lacks them).
    """
    flag = "--refetch" if again else "--fetch"
    if not versions:
        raise UsageError(f"{flag} needs the releases to fetch")
    failures = 0
    for version in versions:
        spec = parse_base(version)
        if not isinstance(spec, ReleaseSpec):
            raise UsageError(f"{flag} takes releases, not {version!r}")
        try:
            check_release(spec.version, runner)
            if again:
                refetch_release(spec.version)
            else:
                ensure_release(spec.version, extra=extra)
        except UsageError as error:
            failures += 1
            print(f"dpsim: error: {error}", file=sys.stderr)
            continue
        print(f"cached  vllm {spec.version}")
    return 2 if failures else 0


def describe(target: Target) -> dict[str, Any]:
    api = target.api
    described: dict[str, Any] = {
        "target": target.label,
        "runner": target.runner,
        "spec": target.spec.to_dict(),
        "version": target.version,
        "entry": api.entry,
        "parameters": list(api.parameters),
        "collective": api.collective,
        "tensor_rows": api.tensor_rows,
        "agreement": list(api.agreement_fields) or "tensor",
        "descriptor": list(api.descriptor_fields),
        "features": list(api.features),
        "files": {loaded.module: loaded.sha256 for loaded in target.files},
    }
    if isinstance(target, V1Target):
        described["v1"] = target.what_loaded()
    else:
        described["unknown"] = [misfit.to_json() for misfit in fits(target)]
    return described


def render(target: Target) -> str:
    api = target.api
    if isinstance(target, V1Target):
        agreement = f"{', '.join(api.agreement_fields)} (returned by the sync)"
    elif api.agreement_fields:
        agreement = f"DPSyncState({', '.join(api.agreement_fields)})"
    else:
        agreement = "num_tokens_across_dp tensor (no DPSyncState)"
    rows = f", {api.tensor_rows}-row tensor" if api.tensor_rows else ""
    descriptor = target.BatchExecutionDescriptor.__name__
    lines = [
        target.label,
        f"  runner:     {target.runner}",
        f"  entry:      {api.entry}({', '.join(api.parameters)})",
        *(_v1_lines(target) if isinstance(target, V1Target) else ()),
        f"  collective: {api.collective}{rows}",
        f"  agreement:  {agreement}",
        f"  descriptor: {descriptor}({', '.join(api.descriptor_fields)})",
        f"  features:   {' '.join(api.features) or '(none beyond the basic sync)'}",
    ]
    if not isinstance(target, V1Target):
        misfits = fits(target)
        if not misfits:
            lines.append("  fits:       every name dpsim drives is one it knows")
        for misfit in misfits:
            lines.append(f"  unknown:    {misfit.describe()}")
    for loaded in target.files:
        lines.append(f"  loaded:     {loaded.path}  sha256 {loaded.sha256[:12]}")
    return "\n".join(lines)


def _v1_lines(target: V1Target) -> list[str]:
    """The V1 runner's caller (real, with its lines, or modelled), its
    dispatcher and the group its sync reduces on."""
    loaded = target.what_loaded()
    caller = loaded["caller"]
    if caller == "modelled":
        said = "modelled caller (this release calls the sync inside _prepare_inputs)"
    else:
        first, last = caller["lines"]
        said = f"{caller['method']}  {caller['file']}:{first}-{last}"
        if caller["also"]:
            said += f" (with {', '.join(caller['also'])})"
    return [
        f"  caller:     {said}",
        f"  dispatcher: {loaded['dispatcher']}",
        f"  group:      {loaded['group']}",
    ]
