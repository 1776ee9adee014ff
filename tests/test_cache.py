"""The release cache: verified before use, refused when damaged, repaired on request.

No release is needed: entries are made by the real fetch path from a small
hand-written wheel, with the download replaced, so nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from plain_user import as_plain_user

from dpsim.cli import main
from dpsim.errors import TargetError
from dpsim.targets import cache as cache_module
from dpsim.targets.cache import (
    MANIFEST,
    STAMP,
    cache_entries,
    cached_releases,
    ensure_release,
    release_dir,
)

#: A made-up release (before 0.34.0, so it may hold the V1 runner too).
VERSION = "0.33.99"
DP_UTILS = "vllm/v1/worker/gpu/dp_utils.py"
#: The files of the hand-written wheel: dpsim's own placeholders, not vLLM's.
WHEEL_FILES = {
    DP_UTILS: "def dispatch_cg_and_sync_dp():\n    return None\n",
    "vllm/v1/worker/gpu/cudagraph_utils.py": "CUDAGRAPHS = 1\n",
    "vllm/config/compilation.py": "MODE = 'NONE'\n",
}
#: A far-future time for the stamp, so no file counts as edited in its tick.
LATER_NS = 4_000_000_000 * 10**9


class Downloads:
    """A stand-in for ``pip download`` that counts its calls."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self.calls: list[str] = []
        self.fail: TargetError | None = None

    def __call__(self, version: str, into: Path) -> Path:
        self.calls.append(version)
        if self.fail is not None:
            raise self.fail
        target = into / f"vllm-{version}-py3-none-any.whl"
        target.write_bytes(self.wheel.read_bytes())
        return target


@pytest.fixture
def downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Downloads:
    wheel = tmp_path / "wheel.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, source in WHEEL_FILES.items():
            archive.writestr(name, source)
    fake = Downloads(wheel)
    monkeypatch.setattr(cache_module, "_download", fake)
    return fake


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("DPSIM_CACHE", str(root))
    return root


@pytest.fixture
def entry(cache: Path, downloads: Downloads) -> Path:
    """A complete entry of :data:`VERSION`, fetched through the real fetch path."""
    ensure_release(VERSION)
    assert downloads.calls == [VERSION]
    return release_dir(VERSION)


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line a refused command printed (besides a fetch's progress line)."""
    assert main(argv) == 2
    lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if not line.startswith("dpsim: fetching")
    ]
    assert len(lines) == 1, lines
    return lines[0]


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    hashed: list[str] = []
    real = cache_module._sha256

    def counting(path: str, name: str) -> str:
        hashed.append(name)
        return real(path, name)

    monkeypatch.setattr(cache_module, "_sha256", counting)
    return hashed


# -- a sound entry ---------------------------------------------------------------


def test_a_fetched_entry_is_verified_then_trusted_by_its_stamp(
    entry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cached_releases() == [VERSION]
    stamp = json.loads((entry / STAMP).read_text())
    assert set(stamp["files"]) == set(WHEEL_FILES)
    os.utime(entry / STAMP, ns=(LATER_NS, LATER_NS))
    hashed = _hashes(monkeypatch)
    assert ensure_release(VERSION) == entry / "vllm"
    assert hashed == []  # nothing changed since the stamp: no file re-read


def test_a_file_older_than_its_stamp_is_still_rehashed_when_the_stamp_is_racy(
    entry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stamp written in the same clock tick as a file cannot vouch for it.
    oldest = min(os.stat(entry / name).st_ctime_ns for name in WHEEL_FILES)
    os.utime(entry / STAMP, ns=(oldest, oldest))
    hashed = _hashes(monkeypatch)
    ensure_release(VERSION)
    assert sorted(hashed) == sorted(WHEEL_FILES)


# -- damaged files -----------------------------------------------------------------


def _edit_keeping_size_and_mtime(path: Path) -> None:
    before = path.stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(b"None", b"Nope"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "edited": (
        lambda entry: (entry / DP_UTILS).write_text(
            "def dispatch_cg_and_sync_dp(): 1\n"
        ),
        f"{DP_UTILS} differs from the release",
    ),
    "edited, same size and mtime": (
        lambda entry: _edit_keeping_size_and_mtime(entry / DP_UTILS),
        f"{DP_UTILS} differs from the release",
    ),
    "truncated": (
        lambda entry: (entry / DP_UTILS).write_bytes(b""),
        f"{DP_UTILS} differs from the release",
    ),
    "missing": (
        lambda entry: (entry / DP_UTILS).unlink(),
        f"{DP_UTILS} is missing",
    ),
    "added": (
        lambda entry: (entry / "vllm/v1/worker/gpu/extra.py").write_text("X = 1\n"),
        "vllm/v1/worker/gpu/extra.py is not part of the release",
    ),
    "manifest missing": (
        lambda entry: (entry / MANIFEST).unlink(),
        f"no {MANIFEST}",
    ),
    "manifest empty": (
        lambda entry: (entry / MANIFEST).write_text(""),
        f"{MANIFEST} is empty",
    ),
    "manifest corrupt": (
        lambda entry: (entry / MANIFEST).write_text('{"version": "0.99'),
        f"{MANIFEST} is not valid JSON",
    ),
    "manifest of another version": (
        lambda entry: _rewrite_manifest(entry, version="0.29.0"),
        f"{MANIFEST} records vllm 0.29.0",
    ),
    "manifest without the sync file": (
        lambda entry: _rewrite_manifest(entry, files={}),
        f"{MANIFEST} does not list {DP_UTILS}",
    ),
    "manifest naming a path outside vllm/": (
        lambda entry: _rewrite_manifest(
            entry, files={DP_UTILS: "0" * 64, "vllm/../../x.py": "0" * 64}
        ),
        f"{MANIFEST} has a malformed entry 'vllm/../../x.py'",
    ),
}


def _rewrite_manifest(entry: Path, **fields: object) -> None:
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest.update(fields)
    (entry / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_refused_in_one_line_and_not_refetched(
    damage: str,
    entry: Path,
    downloads: Downloads,
    capsys: pytest.CaptureFixture[str],
) -> None:
    os.utime(entry / STAMP, ns=(LATER_NS, LATER_NS))  # the stamp must not hide it
    make, detail = DAMAGE[damage]
    make(entry)
    with pytest.raises(TargetError) as refused:
        ensure_release(VERSION)
    message = str(refused.value)
    assert f"the cached vllm {VERSION} is damaged ({detail}" in message
    assert f"dpsim targets --refetch {VERSION}" in message
    assert f"remove {entry}" in message
    # The CLI says the same in one line, listing cached entries included.
    assert detail in _refusal(capsys, ["targets", VERSION])
    assert detail in _refusal(capsys, ["targets"])
    assert downloads.calls == [VERSION]  # refused, never silently re-fetched
    assert cache_entries() == [VERSION]
    if damage.startswith("manifest"):
        assert cached_releases() == []


def test_a_cache_that_cannot_keep_a_stamp_is_verified_in_full_each_time(
    entry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A shared cache this user cannot write: the stamp cannot be (re)written.
    (entry / STAMP).unlink()
    (entry / STAMP).mkdir()
    hashed = _hashes(monkeypatch)
    ensure_release(VERSION)
    ensure_release(VERSION)
    assert len(hashed) == 2 * len(WHEEL_FILES)
    _edit_keeping_size_and_mtime(entry / DP_UTILS)
    with pytest.raises(TargetError, match="differs from the release"):
        ensure_release(VERSION)


# -- repair ------------------------------------------------------------------------


def test_refetch_replaces_a_damaged_entry(
    entry: Path, downloads: Downloads, capsys: pytest.CaptureFixture[str]
) -> None:
    (entry / DP_UTILS).write_text("edited\n")
    (entry / "vllm/v1/worker/gpu/extra.py").write_text("X = 1\n")
    assert main(["targets", "--refetch", VERSION]) == 0
    assert capsys.readouterr().out == f"cached  vllm {VERSION}\n"
    assert downloads.calls == [VERSION, VERSION]
    assert (entry / DP_UTILS).read_text() == WHEEL_FILES[DP_UTILS]
    assert not (entry / "vllm/v1/worker/gpu/extra.py").exists()
    assert ensure_release(VERSION) == entry / "vllm"
    assert [p.name for p in entry.parent.iterdir() if p.name.startswith(".repl")] == []


def test_a_refetch_that_fails_leaves_the_entry_as_it_was(
    entry: Path, downloads: Downloads, capsys: pytest.CaptureFixture[str]
) -> None:
    downloads.fail = TargetError("cannot fetch vllm 0.33.99 (offline)")
    err = _refusal(capsys, ["targets", "--refetch", VERSION])
    assert err == "dpsim: error: cannot fetch vllm 0.33.99 (offline)"
    assert ensure_release(VERSION) == entry / "vllm"
    assert cached_releases() == [VERSION]


# -- refused before download -------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["targets", "0.11.0"],
        ["targets", "0.10.2"],
        ["targets", "--fetch", "0.11.0"],
        ["targets", "--refetch", "0.9.2"],
        ["check", "--vllm", "0.10.0", "--examples", "1"],
    ],
)
def test_a_release_dpsim_would_refuse_is_refused_before_its_download(
    argv: list[str],
    cache: Path,
    downloads: Downloads,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refusal(capsys, argv)
    assert "is older than dpsim supports (0.11.1 and later with the V1 runner" in err
    assert "get_dp_padding" in err
    assert downloads.calls == []
    assert not cache.exists()


@pytest.mark.parametrize("version", ["../../etc", "latest", "", "0.18.0/../x"])
def test_something_that_is_not_a_release_version_is_never_fetched(
    version: str, cache: Path, downloads: Downloads
) -> None:
    with pytest.raises(TargetError, match="is not a vLLM release version"):
        ensure_release(version)
    assert downloads.calls == []
    assert not cache.exists()


def test_a_supported_release_is_let_through_to_the_download(
    cache: Path, downloads: Downloads
) -> None:
    # The boundary itself: the oldest supported release is fetched.
    ensure_release("0.18.0")
    assert downloads.calls == ["0.18.0"]


# -- DPSIM_CACHE -------------------------------------------------------------------


def test_dpsim_cache_naming_a_file_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    downloads: Downloads,
    capsys: pytest.CaptureFixture[str],
) -> None:
    afile = tmp_path / "cache-file"
    afile.write_text("not a cache\n")
    monkeypatch.setenv("DPSIM_CACHE", str(afile))
    expected = (
        f"dpsim: error: DPSIM_CACHE={afile} is not a directory; "
        "point DPSIM_CACHE at a directory dpsim may keep releases in"
    )
    assert _refusal(capsys, ["targets", VERSION]) == expected
    assert _refusal(capsys, ["targets"]) == expected
    assert _refusal(capsys, ["targets", "--fetch", VERSION]) == expected
    assert downloads.calls == []
    assert afile.read_text() == "not a cache\n"


def test_dpsim_cache_that_cannot_be_created_is_one_line_before_any_download(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    downloads: Downloads,
    capsys: pytest.CaptureFixture[str],
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    unwritable = afile / "cache"  # beneath a file: no one can create it
    monkeypatch.setenv("DPSIM_CACHE", str(unwritable))
    err = _refusal(capsys, ["targets", VERSION])
    assert err == (
        f"dpsim: error: DPSIM_CACHE={unwritable} is not writable (Not a directory): "
        f"cannot fetch vllm {VERSION} into it; point DPSIM_CACHE at a writable "
        "directory"
    )
    assert downloads.calls == []


def test_a_read_only_dpsim_cache_is_one_line_before_any_download(
    cache: Path, downloads: Downloads
) -> None:
    cache.mkdir()

    def refused() -> tuple[int, list[str], list[str]]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["targets", VERSION])
        return code, err.getvalue().splitlines(), downloads.calls

    cache.chmod(0o555)
    try:
        # Held to the mode bits as a user is, even where tests run as root.
        code, lines, downloaded = as_plain_user(refused)
    finally:
        cache.chmod(0o755)
    assert code == 2
    assert lines == [
        f"dpsim: error: DPSIM_CACHE={cache} is not writable (Permission denied): "
        f"cannot fetch vllm {VERSION} into it; point DPSIM_CACHE at a writable "
        "directory"
    ]
    assert downloaded == []


def test_a_read_only_cache_that_is_complete_still_loads(
    entry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writes into the cache fail, as in a shared read-only one; reading is enough.
    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache_module.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(cache_module.os, "mkdir", refuse)
    (entry / STAMP).unlink()
    assert ensure_release(VERSION) == entry / "vllm"
    assert not (entry / STAMP).exists()


def test_fetch_and_refetch_together_are_refused(
    cache: Path, downloads: Downloads, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refusal(capsys, ["targets", "--fetch", "--refetch", VERSION])
    assert err == "dpsim: error: --fetch and --refetch exclude each other"
    assert downloads.calls == []


# -- entries from before the V1 runner ------------------------------------------------


def _as_fetched_before_v1(entry: Path) -> None:
    """Make ``entry`` what an older dpsim wrote: a manifest without ``wanted``."""
    manifest = json.loads((entry / MANIFEST).read_text())
    del manifest["wanted"]
    (entry / MANIFEST).write_text(json.dumps(manifest, indent=1))


def test_an_entry_from_before_the_v1_runner_serves_v2_as_it_is(
    entry: Path, downloads: Downloads, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_fetched_before_v1(entry)
    capsys.readouterr()
    assert ensure_release(VERSION, runner="v2") == entry / "vllm"
    assert ensure_release(VERSION) == entry / "vllm"
    assert downloads.calls == [VERSION]
    assert capsys.readouterr().err == ""


def test_an_entry_from_before_the_v1_runner_is_fetched_again_once_for_v1(
    entry: Path, downloads: Downloads, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_fetched_before_v1(entry)
    capsys.readouterr()
    assert ensure_release(VERSION, runner="v1") == entry / "vllm"
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"dpsim: fetching vllm {VERSION} again (a ~300 MB wheel, once): its cache "
        "entry predates dpsim's V1 runner and lacks the V1 caller's files"
    ]
    assert downloads.calls == [VERSION, VERSION]
    manifest = json.loads((entry / MANIFEST).read_text())
    assert set(cache_module.V1_WANTED) <= set(manifest["wanted"])
    ensure_release(VERSION, runner="v1")
    assert downloads.calls == [VERSION, VERSION]  # once upgraded, never again
    assert capsys.readouterr().err == ""


def test_an_upgrade_that_cannot_fetch_says_why_and_keeps_the_entry(
    entry: Path, downloads: Downloads
) -> None:
    _as_fetched_before_v1(entry)
    downloads.fail = TargetError("cannot fetch vllm 0.33.99 (offline)")
    with pytest.raises(TargetError) as refused:
        ensure_release(VERSION, runner="v1")
    assert str(refused.value) == (
        f"the cached vllm {VERSION} predates dpsim's V1 runner (it lacks the V1 "
        "caller's files) and fetching it again failed: cannot fetch vllm 0.33.99 "
        "(offline)"
    )
    assert ensure_release(VERSION, runner="v2") == entry / "vllm"


def test_a_wheel_with_only_the_v1_runners_sync_is_cached(
    cache: Path, downloads: Downloads, tmp_path: Path
) -> None:
    with zipfile.ZipFile(downloads.wheel, "w") as archive:
        archive.writestr(
            "vllm/v1/worker/dp_utils.py",
            "def coordinate_batch_across_dp():\n    pass\n",
        )
        archive.writestr("vllm/v1/cudagraph_dispatcher.py", "X = 1\n")
    package = ensure_release(VERSION, runner="v1")
    assert (package / "v1/worker/dp_utils.py").is_file()
    assert cached_releases() == [VERSION]


# -- the runner lane's extra files --------------------------------------------------

LANE_FILE = "vllm/v1/engine/core.py"


def _with_lane_file(downloads: Downloads) -> None:
    with zipfile.ZipFile(downloads.wheel, "a") as archive:
        archive.writestr(LANE_FILE, "LOOP = 1\n")


def test_the_sync_lane_does_not_keep_the_runner_lanes_files(
    entry: Path, downloads: Downloads
) -> None:
    _with_lane_file(downloads)
    refetched = cache_module.refetch_release(VERSION)
    assert not (refetched / "v1/engine/core.py").exists()


def test_an_entry_is_fetched_again_once_for_extra_files_keeping_what_it_held(
    entry: Path, downloads: Downloads, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_lane_file(downloads)
    capsys.readouterr()
    package = ensure_release(VERSION, extra=(LANE_FILE,))
    assert (package / "v1/engine/core.py").read_text() == "LOOP = 1\n"
    assert capsys.readouterr().err.splitlines() == [
        f"dpsim: fetching vllm {VERSION} again (a ~300 MB wheel, once): its cache "
        "entry predates dpsim's runner lane and lacks the runner lane's files"
    ]
    assert downloads.calls == [VERSION, VERSION]
    manifest = json.loads((entry / MANIFEST).read_text())
    assert set(cache_module.WANTED) | {LANE_FILE} <= set(manifest["wanted"])
    ensure_release(VERSION, extra=(LANE_FILE,))
    ensure_release(VERSION, runner="v1")  # the V1 files were kept
    cache_module.refetch_release(VERSION)  # a repair keeps the lane's files
    assert (package / "v1/engine/core.py").is_file()
    assert downloads.calls == [VERSION, VERSION, VERSION]


def test_a_file_under_a_folder_the_entry_kept_is_not_fetched_again(
    entry: Path, downloads: Downloads
) -> None:
    """A lane naming one more file under a folder prefix every entry keeps
    (``vllm/v1/worker/gpu/``) already has it: no second download."""
    assert "vllm/v1/worker/gpu/" in cache_module.WANTED
    ensure_release(VERSION, extra=("vllm/v1/worker/gpu/sample/greedy_argmax.py",))
    assert downloads.calls == [VERSION]
    # A path outside every kept folder is still fetched, once.
    _with_lane_file(downloads)
    ensure_release(VERSION, extra=(LANE_FILE,))
    assert downloads.calls == [VERSION, VERSION]
