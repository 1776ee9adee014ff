"""What a target spec names, before anything is fetched or loaded.

A spec is one of: a vLLM release (``0.29.0``), a vLLM source tree or an
installed ``vllm`` package directory (a path), or a single ``dp_utils.py``
(a file path) that is run against the rest of vLLM from a release or tree.

Every spec also names the model runner whose DP sync it tests: ``v2``
(``v1/worker/gpu/dp_utils.py``, releases 0.18 and later) or ``v1``
(``v1/worker/dp_utils.py``'s ``coordinate_batch_across_dp`` and its caller in
``gpu_model_runner.py``, releases 0.11.1 to 0.33, the last before 0.34.0
removed that runner). Left unsaid, it is the
runner the base (or the ``--target`` file) has: V2 where its sync exists,
else V1, decided from the version or the files' text before anything is
fetched or executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import TargetError, UsageError
from dpsim.options import RUNNERS  # named once, torch-free, for the suite too

RELEASE_PATTERN = re.compile(r"^\d+\.\d+(\.\d+)?([.-]?(post|rc|dev)\d*)?$")
DEFAULT_RELEASE = "0.34.0"
#: The newest release with the V1 model runner (0.34.0 removed it): what
#: ``--runner v1`` runs when no ``--vllm`` is given.
DEFAULT_V1_RELEASE = "0.33.0"
#: The oldest (major, minor) whose V2-runner DP-sync API dpsim adapts. vLLM
#: 0.15-0.17 expose only ``get_cudagraph_and_dp_padding`` (no capture manager)
#: and older releases have no ``gpu/dp_utils.py`` at all; this one boundary
#: decides both the refusal before a fetch and the releases the cross-version
#: report runs for V2.
OLDEST_SUPPORTED = (0, 18)
OLDEST_RELEASE = f"{OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]}.0"
#: The oldest release with the V1 runner's ``coordinate_batch_across_dp``
#: (0.10.x-0.11.0 padded with ``get_dp_padding``, which dpsim does not adapt).
OLDEST_V1 = (0, 11, 1)
OLDEST_V1_RELEASE = ".".join(str(part) for part in OLDEST_V1)
#: The (major, minor) whose release removed the V1 model runner: 0.34.0 has
#: no ``v1/worker/gpu_model_runner.py`` and no ``v1/cudagraph_dispatcher.py``
#: (its ``coordinate_batch_across_dp`` stays, for the CPU runner and
#: ``forward_context``). A release from it on is refused with V1 before it is
#: fetched; a tree is judged by its files (:func:`v1_runner_removed`).
V1_REMOVED = (0, 34)
V1_REMOVED_RELEASE = f"{V1_REMOVED[0]}.{V1_REMOVED[1]}.0"

#: The sync entry points each runner's ``dp_utils.py`` defines (V2's legacy
#: 0.15-0.17 name included, so such a file is refused by V2's adapter, which
#: names the API, rather than as "no sync at all").
V1_ENTRY = "coordinate_batch_across_dp"
V2_ENTRIES = (
    "dispatch_cg_and_sync_dp",
    "sync_cudagraph_and_dp_padding",
    "get_cudagraph_and_dp_padding",
)

#: Where the sync file lives in a vLLM checkout, and in the ``vllm`` package.
DP_UTILS_IN_PACKAGE = "v1/worker/gpu/dp_utils.py"
DP_UTILS_IN_CHECKOUT = f"vllm/{DP_UTILS_IN_PACKAGE}"
#: The same for the V1 runner's sync and the file holding its caller.
V1_DP_UTILS_IN_PACKAGE = "v1/worker/dp_utils.py"
V1_DP_UTILS_IN_CHECKOUT = f"vllm/{V1_DP_UTILS_IN_PACKAGE}"
V1_CALLER_IN_PACKAGE = "v1/worker/gpu_model_runner.py"
V1_DISPATCHER_IN_PACKAGE = "v1/cudagraph_dispatcher.py"
#: The V2 model runner, which a tree that dropped the V1 runner still has.
V2_RUNNER_IN_PACKAGE = "v1/worker/gpu/model_runner.py"


@dataclass(frozen=True)
class ReleaseSpec:
    version: str

    def __str__(self) -> str:
        return self.version


@dataclass(frozen=True)
class TreeSpec:
    """A directory holding ``vllm/`` (a checkout) or being ``vllm/`` itself."""

    package_dir: Path

    def __str__(self) -> str:
        return str(self.package_dir)


BaseSpec = ReleaseSpec | TreeSpec


@dataclass(frozen=True)
class TargetSpec:
    """Where each piece of a target comes from, and which runner's sync it is.

    ``base`` supplies vLLM's manager and enums; ``dp_utils_file``, when given,
    replaces the base's own ``dp_utils.py`` (the runner's: V2's
    ``v1/worker/gpu/dp_utils.py`` or V1's ``v1/worker/dp_utils.py``);
    ``caller_file`` (V1 only) replaces ``v1/worker/gpu_model_runner.py``, the
    file the V1 caller method is taken from. :func:`parse_target` resolves
    ``runner``; a spec built directly defaults to V2, as every spec did
    before dpsim knew V1.
    """

    base: BaseSpec
    dp_utils_file: Path | None = None
    runner: str = "v2"
    caller_file: Path | None = None

    def __str__(self) -> str:
        text = str(self.base)
        if self.dp_utils_file is not None:
            text = f"{self.dp_utils_file} (on vllm {self.base})"
        if self.caller_file is not None:
            text = f"{text} with caller {self.caller_file}"
        return text if self.runner == "v2" else f"{text} [V1 runner]"

    def to_dict(self) -> dict[str, str | None]:
        """The spec as JSON values. ``runner`` and ``caller_file`` are present
        for V1 only: a V2 spec reads as it did before runners existed, and a
        record without ``runner`` is a V2 one."""
        kind = "release" if isinstance(self.base, ReleaseSpec) else "tree"
        data = {
            "kind": kind,
            "base": str(self.base),
            "dp_utils_file": str(self.dp_utils_file) if self.dp_utils_file else None,
        }
        if self.runner != "v2":
            data["runner"] = self.runner
            data["caller_file"] = str(self.caller_file) if self.caller_file else None
        return data


def check_runner(runner: str) -> str:
    """``runner`` itself when it names one; otherwise a one-line refusal."""
    if runner not in RUNNERS:
        raise UsageError(
            f"unknown runner {runner!r}: choose v1 (the V1 model runner's "
            "coordinate_batch_across_dp) or v2 (the V2 runner's dp_utils.py)"
        )
    return runner


def _release_key(version: str) -> tuple[int, int, int]:
    parts = [int(part) for part in re.findall(r"\d+", version)[:3]]
    major, minor, patch = [*parts, 0, 0][:3]
    return major, minor, patch


def default_runner(version: str) -> str:
    """The runner a release is tested with when none is named: V2 where the
    release has V2's sync (0.18 and later), else V1."""
    return "v2" if _release_key(version)[:2] >= OLDEST_SUPPORTED else "v1"


def check_release(version: str, runner: str | None = None) -> str:
    """``version`` itself when dpsim can run that release (with ``runner``, or
    with either runner when None); otherwise a one-line :class:`TargetError`,
    so a release that would be refused anyway is refused before its ~300 MB
    wheel is downloaded (or its cache entry is read)."""
    if not RELEASE_PATTERN.match(version):
        raise TargetError(
            f"{version!r} is not a vLLM release version (e.g. {DEFAULT_RELEASE})"
        )
    if runner is not None:
        check_runner(runner)
    key = _release_key(version)
    if key < OLDEST_V1:
        raise TargetError(
            f"vllm {version} is older than dpsim supports ({OLDEST_V1_RELEASE} and "
            f"later with the V1 runner, {OLDEST_RELEASE} and later with V2): "
            "before it vLLM padded DP batches with get_dp_padding, which dpsim "
            "does not adapt; refused without fetching it"
        )
    if runner == "v1" and lacks_v1_runner(ReleaseSpec(version)):
        raise TargetError(
            f"{v1_removed(f'vllm {version}')}; refused without fetching it"
        )
    if runner == "v2" and key[:2] < OLDEST_SUPPORTED:
        raise TargetError(
            f"vllm {version} is older than dpsim supports with the V2 runner "
            f"({OLDEST_RELEASE} and later): the vLLM 0.15-0.17 API "
            "(get_cudagraph_and_dp_padding, no capture manager) and anything "
            "before it are not adapted (--runner v1 tests its V1 runner); "
            "refused without fetching it"
        )
    return version


def v1_removed(what: str) -> str:
    """Why ``what`` (a release or tree) cannot be tested with the V1 runner
    when that runner is gone from it: one line, naming the V2 runner instead."""
    return (
        f"{what} has no V1 model runner (vLLM {V1_REMOVED_RELEASE} removed "
        f"vllm/{V1_CALLER_IN_PACKAGE} and vllm/{V1_DISPATCHER_IN_PACKAGE}): "
        "nothing for --runner v1 to test; its V2 runner is tested by default"
    )


def v1_runner_removed(package_dir: Path) -> bool:
    """Whether the ``vllm/`` at ``package_dir`` is one from which the V1
    model runner was removed: its V2 model runner is there and neither of the
    V1 runner's files is (a tree older than the V1 runner lacks the V2 one too)."""
    return (package_dir / V2_RUNNER_IN_PACKAGE).is_file() and not any(
        (package_dir / relative).is_file()
        for relative in (V1_CALLER_IN_PACKAGE, V1_DISPATCHER_IN_PACKAGE)
    )


def lacks_v1_runner(base: BaseSpec) -> bool:
    """Whether ``base`` is a release or tree from which the V1 model runner
    was removed (see :data:`V1_REMOVED`): it has no V1 runner to test at all."""
    if isinstance(base, ReleaseSpec):
        return (
            RELEASE_PATTERN.match(base.version) is not None
            and _release_key(base.version)[:2] >= V1_REMOVED
        )
    return v1_runner_removed(base.package_dir)


def parse_base(text: str) -> BaseSpec:
    """A release version or a directory; anything else is a clear error."""
    text = text.strip()
    if RELEASE_PATTERN.match(text):
        return ReleaseSpec(text)
    path = Path(text).expanduser()
    if path.is_dir():
        return TreeSpec(_package_dir(path))
    if path.is_file():
        raise TargetError(
            f"{text} is a file: pass a single dp_utils.py with --target FILE "
            "and the vLLM it runs against with --vllm SPEC"
        )
    raise TargetError(
        f"{text!r} is neither a vLLM release (e.g. 0.29.0) nor an existing directory"
    )


def _package_dir(path: Path) -> Path:
    path = path.resolve()
    if (path / "vllm" / "__init__.py").is_file() or (path / "vllm" / "v1").is_dir():
        return path / "vllm"
    if path.name == "vllm" and (path / "v1").is_dir():
        return path
    raise TargetError(
        f"{path} is not a vLLM source tree or installed vllm package "
        "(no vllm/v1 directory in it)"
    )


def parse_target(
    vllm: str | None,
    target_file: str | Path | None = None,
    runner: str | None = None,
    caller_file: str | Path | None = None,
) -> TargetSpec:
    """Combine ``--vllm``, ``--target``, ``--runner`` and ``--caller-file``
    into one spec, the runner resolved (see the module docstring)."""
    if runner is not None:
        check_runner(runner)
    wants_v1 = runner == "v1" or caller_file is not None
    base = parse_base(vllm or (DEFAULT_V1_RELEASE if wants_v1 else DEFAULT_RELEASE))
    path = None if target_file is None else _python_file("--target", target_file)
    caller = None if caller_file is None else _python_file("--caller-file", caller_file)
    if caller is not None:
        if runner == "v2":
            raise TargetError(
                f"--caller-file {caller_file}: only the V1 runner has a caller "
                "method dpsim runs (drop --runner v2, or pass --runner v1)"
            )
        runner = "v1"
    file_runner = None if path is None else _file_runner(path, str(target_file))
    # A file defining neither runner's sync gets the base's runner, whose
    # loader refuses it in one line after naming whatever else is wrong in it
    # (a syntax error, an exit at import).
    if runner is None:
        runner = file_runner or _base_runner(base)
    elif file_runner is not None and file_runner != runner:
        found = V1_ENTRY if file_runner == "v1" else "the V2 runner's sync"
        raise TargetError(
            f"--target {target_file} defines {found}, not the {runner.upper()} "
            f"runner's (pass --runner {file_runner})"
        )
    if isinstance(base, ReleaseSpec):
        check_release(base.version, runner)
    elif path is None:
        _check_tree(base, runner)
    return TargetSpec(base, path, runner, caller)


def _python_file(option: str, given: str | Path) -> Path:
    path = Path(given).expanduser()
    if path.is_dir():
        if option != "--target":
            raise TargetError(f"{option} {given} is a directory; expected a .py file")
        raise TargetError(
            f"--target {given} is a directory; expected a dp_utils.py file "
            f"(did you mean --vllm {given}, or --target "
            f"{_dp_utils_inside(path, str(given))}?)"
        )
    if not path.is_file():
        raise TargetError(f"{option} {given}: no such file")
    if path.suffix != ".py":
        raise TargetError(f"{option} {given}: expected a Python file (.py)")
    return path.resolve()


def _defines(text: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"^\s*def {name}\s*\(", text, re.M) for name in names)


def _file_runner(path: Path, shown: str) -> str | None:
    """The runner a ``--target`` file's sync belongs to, read off its text;
    None when it defines neither (the loader then says what it is not)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        raise TargetError(f"cannot read {shown}: {error.strerror}") from error
    if _defines(text, V2_ENTRIES):
        return "v2"
    if _defines(text, (V1_ENTRY,)):
        return "v1"
    return None


def _base_runner(base: BaseSpec) -> str:
    if isinstance(base, ReleaseSpec):
        return default_runner(base.version)
    return "v2" if _tree_has(base, "v2") else "v1"


def _tree_has(base: TreeSpec, runner: str) -> bool:
    if runner == "v1" and v1_runner_removed(base.package_dir):
        return False  # its coordinate_batch_across_dp has no V1 runner calling it
    relative = DP_UTILS_IN_PACKAGE if runner == "v2" else V1_DP_UTILS_IN_PACKAGE
    names = V2_ENTRIES[:2] if runner == "v2" else (V1_ENTRY,)
    try:
        return _defines((base.package_dir / relative).read_text(), names)
    except OSError:
        return False


def _check_tree(base: TreeSpec, runner: str) -> None:
    if runner == "v1" and v1_runner_removed(base.package_dir):
        raise TargetError(v1_removed(str(base)))
    if not _tree_has(base, runner):
        where = DP_UTILS_IN_PACKAGE if runner == "v2" else V1_DP_UTILS_IN_PACKAGE
        what = (
            "dispatch_cg_and_sync_dp or sync_cudagraph_and_dp_padding"
            if runner == "v2"
            else V1_ENTRY
        )
        raise TargetError(
            f"{base}: no {what} in {where}, so the {runner.upper()} runner's DP "
            "sync is not there to test"
        )


def _dp_utils_inside(directory: Path, shown: str) -> str:
    """The ``dp_utils.py`` a user probably meant inside ``directory``: the one
    that exists there, else where a vLLM checkout keeps it."""
    layouts = (DP_UTILS_IN_CHECKOUT, DP_UTILS_IN_PACKAGE, "dp_utils.py")
    found = next(
        (layout for layout in layouts if (directory / layout).is_file()),
        DP_UTILS_IN_CHECKOUT,
    )
    return f"{shown.rstrip('/')}/{found}"
