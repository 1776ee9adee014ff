"""vLLM releases, fetched once and kept as the few source files dpsim reads.

A release wheel is ~300 MB; dpsim needs well under 2 MB of it. ``fetch``
downloads the wheel with ``pip download --no-deps`` into a scratch folder
inside the cache, extracts only :data:`WANTED` into a second scratch folder,
writes a manifest with each file's SHA-256, and renames that folder into place.
The rename is the commit point: an entry either exists whole or not at all, so
an interrupted or failed fetch never leaves something that looks complete.
Concurrent fetches of one release (pytest-xdist workers) serialise on a lock
file, and the loser finds the winner's entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from dpsim.errors import TargetError

MANIFEST = "dpsim-manifest.json"

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
)
DP_UTILS = "vllm/v1/worker/gpu/dp_utils.py"


def cache_root() -> Path:
    """``$DPSIM_CACHE``, else ``~/.cache/dpsim``."""
    configured = os.environ.get("DPSIM_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "dpsim"


def release_dir(version: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "releases" / f"vllm-{version}"


def cached_releases(root: Path | None = None) -> list[str]:
    """Versions with a complete cache entry, oldest first."""
    base = (root or cache_root()) / "releases"
    if not base.is_dir():
        return []
    found = [
        entry.name.removeprefix("vllm-")
        for entry in base.iterdir()
        if entry.name.startswith("vllm-") and (entry / MANIFEST).is_file()
    ]
    return sorted(found, key=_version_key)


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(part) if part.isdigit() else part for part in version.split("."))


def ensure_release(version: str, root: Path | None = None) -> Path:
    """The cached package directory (``.../vllm``) of ``version``, fetching it once."""
    entry = release_dir(version, root)
    if (entry / MANIFEST).is_file():
        return entry / "vllm"
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _locked(entry.parent / f".vllm-{version}.lock"):
        if not (entry / MANIFEST).is_file():
            print(
                f"dpsim: fetching vllm {version} (a ~300 MB wheel, once; "
                f"keeping ~1 MB of it in {entry.parent})",
                file=sys.stderr,
                flush=True,
            )
            _fetch(version, entry)
    return entry / "vllm"


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch(version: str, entry: Path) -> None:
    parent = entry.parent
    with (
        tempfile.TemporaryDirectory(dir=parent, prefix=".download-") as download,
        tempfile.TemporaryDirectory(
            dir=parent, prefix=".extract-", ignore_cleanup_errors=True
        ) as staging,
    ):
        wheel = _download(version, Path(download))
        files = _extract(wheel, Path(staging))
        wheel.unlink()
        if DP_UTILS not in files:
            raise TargetError(
                f"vllm {version} has no {DP_UTILS} (the GPU model runner's DP "
                "sync, vLLM 0.15 and later): dpsim has nothing to test in it"
            )
        manifest = {"version": version, "source": "pip download", "files": files}
        (Path(staging) / MANIFEST).write_text(json.dumps(manifest, indent=1))
        os.chmod(staging, 0o755)  # shared caches: readable by every user
        os.rename(staging, entry)


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


def _extract(wheel: Path, into: Path) -> dict[str, str]:
    """Extract the wanted files; return their wheel paths and SHA-256 digests."""
    digests: dict[str, str] = {}
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as error:
        raise TargetError(f"{wheel.name} is not a readable wheel: {error}") from error
    with archive:
        for name in archive.namelist():
            if not name.endswith(".py") or not name.startswith(WANTED):
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


def remove_release(version: str, root: Path | None = None) -> bool:
    entry = release_dir(version, root)
    if not entry.exists():
        return False
    shutil.rmtree(entry)
    return True
