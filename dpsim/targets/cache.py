"""vLLM releases, fetched once, kept as the few source files dpsim reads, and
verified before they run.

A release wheel is ~300 MB; dpsim needs well under 2 MB of it. ``fetch``
downloads the wheel with ``pip download --no-deps`` into a scratch folder
inside the cache, extracts only :data:`WANTED` into a second scratch folder,
writes a manifest with each file's SHA-256, and renames that folder into place.
The rename is the commit point: an entry either exists whole or not at all, so
an interrupted or failed fetch never leaves something that looks complete.
Concurrent fetches of one release (pytest-xdist workers) serialise on a lock
file, and the loser finds the winner's entry. A release dpsim would refuse to
load (:func:`~dpsim.targets.spec.check_release`) is refused before any of this.

Every use of an entry checks it against its manifest first: each listed file
must hash to the recorded SHA-256, and no other ``.py`` file may sit among
them (the loader would import it). Hashing ~1.6 MB on every load is cheap but
adds up over thousands of mutant loads, so a stamp beside the manifest
(:data:`STAMP`) keeps each file's size, mtime and ctime from when it last
matched; a file whose stat still agrees, and is older than the stamp (so an
edit within the same clock tick is not missed), is trusted without re-hashing.

An entry fetched by a dpsim from before the V1 runner lacks the V1 caller's
files (:data:`V1_WANTED`, 250-390 KB a release, almost all of it
``gpu_model_runner.py``). That is not damage: it serves V2 as it is, and is
fetched again once, said in one line, the first time a V1 target needs it.
The manifest's ``wanted`` list (the prefixes its fetch extracted) tells the
two apart. The runner lane (:mod:`dpsim.lanes.runner.sources`) reads more of
a release (the engine core, the worker, the scheduler's output): it asks for
those paths as ``extra``, and an entry without them is fetched again once
the same way, keeping whatever the entry already held, so the sync lane's
fetch stays as small as it was.

A damaged entry (a file edited, truncated, missing or added; a manifest
missing, empty, corrupt or naming another version) is refused in one line that
names the damage and the repair, not re-fetched behind the user's back: a
re-fetch is a ~300 MB download that fails offline, and an edited cache is often
someone's deliberate experiment, which should not vanish silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from dpsim.errors import TargetError
from dpsim.targets.spec import DP_UTILS_IN_CHECKOUT as DP_UTILS
from dpsim.targets.spec import RELEASE_PATTERN, V1_DP_UTILS_IN_CHECKOUT, check_release

MANIFEST = "dpsim-manifest.json"
#: Beside the manifest: each file's stat when it last matched its SHA-256.
STAMP = "dpsim-verified.json"

#: What the V1 runner's loader reads beyond what V2 needs: the caller's file,
#: the dispatcher, the batch descriptor and DP metadata, the LoRA capture counts.
V1_WANTED = (
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm/v1/cudagraph_dispatcher.py",
    "vllm/forward_context.py",
    "vllm/lora/utils.py",
)
#: What 0.34's sync and manager read beyond what 0.33's did: the
#: fault-tolerance switch, and the config code that resolves the split
#: capture tables (:mod:`dpsim.targets.split_sizes`).
V034_WANTED = ("vllm/config/fault_tolerance.py", "vllm/config/vllm.py")
#: Path prefixes (inside the wheel) that the loader and the generators read.
WANTED = (
    "vllm/v1/worker/gpu/",
    "vllm/config/compilation.py",
    "vllm/config/parallel.py",
    "vllm/v1/worker/ubatch_utils.py",
    "vllm/v1/worker/dp_utils.py",
    "vllm/utils/math_utils.py",
    "vllm/distributed/parallel_state.py",
    "vllm/_version.py",
    *V1_WANTED,
    *V034_WANTED,
)
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def cache_root() -> Path:
    """``$DPSIM_CACHE``, else ``~/.cache/dpsim``; a path that is not a directory
    is refused here, before anything is read from or written into it."""
    configured = os.environ.get("DPSIM_CACHE")
    if configured:
        root = Path(configured).expanduser()
    else:
        root = Path.home() / ".cache" / "dpsim"
    if root.exists() and not root.is_dir():
        raise TargetError(
            f"{_cache_name(root)} is not a directory; "
            "point DPSIM_CACHE at a directory dpsim may keep releases in"
        )
    return root


def _cache_name(root: Path) -> str:
    """How a message names the cache: by the variable when it came from there."""
    configured = os.environ.get("DPSIM_CACHE")
    if configured and Path(configured).expanduser() == root:
        return f"DPSIM_CACHE={configured}"
    return f"the dpsim cache {root}"


def release_dir(version: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "releases" / f"vllm-{version}"


def cache_entries(root: Path | None = None) -> list[str]:
    """Versions with an entry in the cache, complete or damaged, oldest first."""
    base = (root or cache_root()) / "releases"
    if not base.is_dir():
        return []
    found = [
        entry.name.removeprefix("vllm-")
        for entry in base.iterdir()
        if entry.name.startswith("vllm-")
        and RELEASE_PATTERN.match(entry.name.removeprefix("vllm-"))
    ]
    return sorted(found, key=_version_key)


def cached_releases(root: Path | None = None) -> list[str]:
    """Versions whose entry holds a sound manifest of that version, oldest first.

    The files themselves are checked when the entry is used
    (:func:`ensure_release`), which names any damage.
    """
    root = root or cache_root()
    complete = []
    for version in cache_entries(root):
        try:
            _manifest(release_dir(version, root), version)
        except _Damage:
            continue
        complete.append(version)
    return complete


def _version_key(version: str) -> tuple[tuple[int, ...], str]:
    return tuple(int(part) for part in re.findall(r"\d+", version)), version


def ensure_release(
    version: str,
    root: Path | None = None,
    *,
    runner: str | None = None,
    extra: tuple[str, ...] = (),
) -> Path:
    """The cached package directory (``.../vllm``) of ``version``, fetched once
    and verified against its manifest on every call.

    An entry fetched by a dpsim from before the V1 runner lacks V1's files; it
    is sound, not damaged, and serves V2 as it is, but for ``runner="v1"`` it
    is fetched again (once, said in one line on stderr). ``extra`` (path
    prefixes inside the wheel, the runner lane's files) is kept too: fetched
    with the entry when it is new, and an entry without them is fetched again
    once, likewise.
    """
    check_release(version, runner)
    root = root or cache_root()
    entry = release_dir(version, root)
    if not os.path.lexists(entry):
        with _fetch_lock(version, entry):
            if not os.path.lexists(entry):
                _fetch(version, entry, wanted=_union(WANTED, extra))
    _verify_or_refuse(version, entry)
    if not _extracted(entry, V034_WANTED) and _reads_v034_files(entry):
        _upgrade(
            version,
            entry,
            V034_WANTED,
            "dpsim's vLLM 0.34 support",
            "the config files 0.34's sync and manager read",
        )
    if runner == "v1" and not _extracted(entry, V1_WANTED):
        _upgrade(
            version, entry, V1_WANTED, "dpsim's V1 runner", "the V1 caller's files"
        )
    if extra and not _extracted(entry, extra):
        _upgrade(
            version, entry, extra, "dpsim's runner lane", "the runner lane's files"
        )
    return entry / "vllm"


def _reads_v034_files(entry: Path) -> bool:
    """Whether the release in ``entry`` reads :data:`V034_WANTED`: its sync
    imports the fault-tolerance config, as 0.34's does."""
    try:
        sync = (entry / DP_UTILS).read_text()
    except OSError:
        return False
    return "vllm.config.fault_tolerance" in sync


def _union(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """The prefixes of every group, each once, in order."""
    return tuple(dict.fromkeys(prefix for group in groups for prefix in group))


def _recorded(entry: Path) -> tuple[str, ...]:
    """The prefixes the fetch that made ``entry`` extracted (none when its
    manifest does not say)."""
    try:
        recorded = json.loads((entry / MANIFEST).read_bytes()).get("wanted", [])
    except (OSError, ValueError, AttributeError):
        return ()
    if not isinstance(recorded, list):
        return ()
    return tuple(prefix for prefix in recorded if isinstance(prefix, str))


def _extracted(entry: Path, wanted: tuple[str, ...]) -> bool:
    """Whether the fetch that made ``entry`` extracted every path of ``wanted``
    (recorded in its manifest, itself or under a recorded folder prefix; a
    file the release lacks is then simply absent)."""
    recorded = set(_recorded(entry))
    folders = tuple(prefix for prefix in recorded if prefix.endswith("/"))
    return all(path in recorded or path.startswith(folders) for path in wanted)


def _upgrade(
    version: str, entry: Path, needed: tuple[str, ...], feature: str, files: str
) -> None:
    """Fetch ``entry`` again for ``needed``, keeping what it already held."""
    note = (
        f"dpsim: fetching vllm {version} again (a ~300 MB wheel, once): its cache "
        f"entry predates {feature} and lacks {files}"
    )
    with _fetch_lock(version, entry):
        if _extracted(entry, needed):
            return  # another process upgraded it meanwhile
        try:
            wanted = _union(WANTED, _recorded(entry), needed)
            _fetch(version, entry, note=note, wanted=wanted)
        except TargetError as error:
            raise TargetError(
                f"the cached vllm {version} predates {feature} (it lacks "
                f"{files}) and fetching it again failed: {error}"
            ) from None
    _verify_or_refuse(version, entry)


def refetch_release(version: str, root: Path | None = None) -> Path:
    """Fetch ``version`` again, replacing its entry whatever state it is in.

    The old entry is replaced only once the new one is complete, so a refetch
    that fails (offline) leaves the cache as it was.
    """
    check_release(version)
    entry = release_dir(version, root or cache_root())
    with _fetch_lock(version, entry):
        # What a lane asked for before stays: a refetch repairs, not shrinks.
        _fetch(version, entry, wanted=_union(WANTED, _recorded(entry)))
    _verify_or_refuse(version, entry)
    return entry / "vllm"


@contextlib.contextmanager
def _fetch_lock(version: str, entry: Path) -> Iterator[None]:
    """Hold the release's fetch lock; an unwritable cache is refused here,
    before anything is downloaded."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        handle = open(entry.parent / f".vllm-{version}.lock", "w")  # noqa: SIM115
    except OSError as error:
        raise _unwritable(version, entry, error) from error
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _unwritable(version: str, entry: Path, error: OSError) -> TargetError:
    root = entry.parent.parent
    return TargetError(
        f"{_cache_name(root)} is not writable ({error.strerror or error}): cannot "
        f"fetch vllm {version} into it; point DPSIM_CACHE at a writable directory"
    )


def _fetch(
    version: str,
    entry: Path,
    note: str | None = None,
    *,
    wanted: tuple[str, ...] = WANTED,
) -> None:
    parent = entry.parent
    print(
        note
        or (
            f"dpsim: fetching vllm {version} (a ~300 MB wheel, once; "
            f"keeping under 2 MB of it in {parent})"
        ),
        file=sys.stderr,
        flush=True,
    )
    try:
        with (
            tempfile.TemporaryDirectory(dir=parent, prefix=".download-") as download,
            tempfile.TemporaryDirectory(
                dir=parent, prefix=".extract-", ignore_cleanup_errors=True
            ) as staging,
        ):
            wheel = _download(version, Path(download))
            files = _extract(wheel, Path(staging), wanted)
            wheel.unlink()
            if DP_UTILS not in files and V1_DP_UTILS_IN_CHECKOUT not in files:
                raise TargetError(
                    f"vllm {version} has no {DP_UTILS} (the V2 model runner's DP "
                    f"sync, vLLM 0.15 and later) nor {V1_DP_UTILS_IN_CHECKOUT} (the "
                    "V1 runner's, 0.11.1 and later): dpsim has nothing to test in it"
                )
            manifest = {
                "version": version,
                "source": "pip download",
                "files": files,
                "wanted": list(wanted),
            }
            (Path(staging) / MANIFEST).write_text(json.dumps(manifest, indent=1))
            os.chmod(staging, 0o755)  # shared caches: readable by every user
            _commit(Path(staging), entry)
    except OSError as error:
        raise _unwritable(version, entry, error) from error


def _commit(staging: Path, entry: Path) -> None:
    """Rename a complete entry into place, first moving aside one it replaces."""
    if not os.path.lexists(entry):
        os.rename(staging, entry)
        return
    replaced = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".replaced-"))
    os.rename(entry, replaced / entry.name)
    os.rename(staging, entry)
    shutil.rmtree(replaced, ignore_errors=True)


# -- verification ----------------------------------------------------------------


class _Damage(Exception):
    """What is wrong with a cache entry, in a few words."""


def _verify_or_refuse(version: str, entry: Path) -> None:
    try:
        _verify(version, entry)
    except _Damage as damage:
        raise TargetError(
            f"the cached vllm {version} is damaged ({damage}) and will not run "
            f"under that name; repair it with `dpsim targets --refetch {version}` "
            f"or remove {entry}"
        ) from None


def _verify(version: str, entry: Path) -> None:
    """Check every file of ``entry`` against its manifest, trusting the stamp
    for files whose stat has not changed since they last matched."""
    files, manifest_digest = _manifest(entry, version)
    stamp_path = entry / STAMP
    trusted, stamped_at = _read_stamp(stamp_path, manifest_digest)
    states: dict[str, list[int]] = {}
    hashed = False
    for name, digest in files.items():
        # Plain strings, not Paths: this runs on every load, for ~100 files.
        path = os.path.join(entry, name)
        state = _file_state(path, name)
        racy = max(state[1], state[2]) >= stamped_at
        if racy or trusted.get(name) != state:
            if _sha256(path, name) != digest:
                raise _Damage(
                    f"{name} differs from the release: not the manifest's SHA-256"
                )
            hashed = True
        states[name] = state
    unlisted = _unlisted_sources(entry, files)
    if unlisted:
        raise _Damage(f"{unlisted} is not part of the release")
    if hashed:
        _write_stamp(stamp_path, manifest_digest, states)


def _manifest(entry: Path, version: str) -> tuple[dict[str, str], str]:
    """The entry's file digests and the manifest's own SHA-256; :class:`_Damage`
    when the manifest cannot vouch for ``version``."""
    try:
        data = (entry / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise _Damage(f"no {MANIFEST}") from None
    except OSError as error:
        raise _Damage(f"{MANIFEST} cannot be read: {error.strerror}") from None
    if not data.strip():
        raise _Damage(f"{MANIFEST} is empty")
    try:
        manifest = json.loads(data)
    except ValueError:
        raise _Damage(f"{MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict):
        raise _Damage(f"{MANIFEST} is not a manifest")
    recorded = manifest.get("version")
    if recorded != version:
        raise _Damage(f"{MANIFEST} records vllm {recorded}")
    files = manifest.get("files")
    if not isinstance(files, dict) or (
        DP_UTILS not in files and V1_DP_UTILS_IN_CHECKOUT not in files
    ):
        raise _Damage(f"{MANIFEST} does not list {DP_UTILS}")
    for name, digest in files.items():
        if (
            not _sound_name(name)
            or not isinstance(digest, str)
            or not _DIGEST.match(digest)
        ):
            raise _Damage(f"{MANIFEST} has a malformed entry {name!r}")
    return files, hashlib.sha256(data).hexdigest()


def _sound_name(name: str) -> bool:
    """A manifest path the entry can hold: a source file under ``vllm/``."""
    parts = name.split("/")
    return (
        parts[0] == "vllm"
        and name.endswith(".py")
        and all(part not in ("", ".", "..") for part in parts)
    )


def _file_state(path: str, name: str) -> list[int]:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise _Damage(f"{name} is missing") from None
    except OSError as error:
        raise _Damage(f"{name} cannot be read: {error.strerror}") from None
    if not stat.S_ISREG(found.st_mode):
        raise _Damage(f"{name} is not a file")
    return [found.st_size, found.st_mtime_ns, found.st_ctime_ns]


def _sha256(path: str, name: str) -> str:
    try:
        with open(path, "rb") as source:
            return hashlib.sha256(source.read()).hexdigest()
    except OSError as error:
        raise _Damage(f"{name} cannot be read: {error.strerror}") from None


def _unlisted_sources(entry: Path, files: dict[str, str]) -> str | None:
    """The first ``.py`` file under the entry's ``vllm/`` its manifest lacks."""
    skip = len(str(entry)) + 1
    for folder, _, names in sorted(os.walk(entry / "vllm")):
        for filename in sorted(names):
            name = f"{folder[skip:]}/{filename}"
            if filename.endswith(".py") and name not in files:
                return name
    return None


def _read_stamp(path: Path, manifest_digest: str) -> tuple[dict[str, list[int]], int]:
    """The stamp's file states and when it was written; nothing when it is
    absent, unreadable or made for another manifest."""
    try:
        written = path.stat().st_mtime_ns
        stamp = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}, 0
    if not isinstance(stamp, dict) or stamp.get("manifest") != manifest_digest:
        return {}, 0
    files = stamp.get("files")
    return (files, written) if isinstance(files, dict) else ({}, 0)


def _write_stamp(
    path: Path, manifest_digest: str, states: dict[str, list[int]]
) -> None:
    """Best effort: a cache this user cannot write (a shared, read-only one)
    is simply re-hashed in full on each use."""
    stamp = json.dumps({"manifest": manifest_digest, "files": states})
    temporary: str | None = None
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".dpsim-verified-")
        with os.fdopen(handle, "w") as out:
            out.write(stamp)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _download(version: str, into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(into),
        f"vllm=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("vllm-*.whl"))
    if result.returncode == 0 and wheels:
        return wheels[0]
    output = result.stderr + result.stdout
    offered = _OFFERED.search(output)
    if offered and offered.group(1).strip() != "none":
        raise TargetError(
            f"vllm {version} is not a release on the package index "
            f"(newest there: {offered.group(1).split(',')[-1].strip()})"
        )
    if result.returncode == 0:
        raise TargetError(f"vllm {version}: the package index offers no wheel for it")
    # "from versions: none" means the index offered nothing at all: unreachable.
    detail = "the package index cannot be reached" if offered else _pip_reason(output)
    raise TargetError(
        f"cannot fetch vllm {version} ({detail}) and it is not in the dpsim cache "
        f"({cache_root()}); set DPSIM_CACHE to a cache that has it, or go online"
    )


#: pip's list of what the index offers, printed when the requested one is absent.
_OFFERED = re.compile(r"\(from versions: ([^)]*)\)")


def _pip_reason(output: str) -> str:
    lines = [
        line.strip()
        for line in output.splitlines()
        if line.strip() and not line.startswith("WARNING: Location")
    ]
    errors = [line for line in lines if line.startswith("ERROR")]
    chosen = errors[-1] if errors else (lines[-1] if lines else "pip gave no reason")
    return chosen.removeprefix("ERROR: ")


def _extract(wheel: Path, into: Path, wanted: tuple[str, ...]) -> dict[str, str]:
    """Extract the files under ``wanted``; return their wheel paths and SHA-256
    digests."""
    digests: dict[str, str] = {}
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as error:
        raise TargetError(f"{wheel.name} is not a readable wheel: {error}") from error
    with archive:
        for name in archive.namelist():
            if not name.endswith(".py") or not name.startswith(wanted):
                continue
            relative = PurePosixPath(name)
            if ".." in relative.parts:
                continue
            data = archive.read(name)
            target = into.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
    return dict(sorted(digests.items()))
