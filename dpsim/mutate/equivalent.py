"""The reviewed list of equivalent mutants: left out of the score, shown apart.

A mutant is equivalent when no caller of the function could tell it from the
original, so no property can kill it; counting it as a survivor would make a
perfect suite look imperfect. Each entry was reviewed by a person and says
why in one line. Entries are keyed by the SHA-256 of the exact file mutated
plus the mutant's id (operator, line, column), so an entry can never silently
apply to a different text: a changed file needs its equivalents reviewed anew.
Equivalent mutants are still checked, and one that gets killed is reported,
since then the entry is wrong.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import UsageError

#: The list shipped with dpsim, for the releases and files it was run on.
REVIEWED = Path(__file__).resolve().parent / "equivalent.toml"


@dataclass(frozen=True)
class Equivalent:
    sha256: str
    id: str
    reason: str
    #: Which file the hash is of, for a person reading the list.
    file: str = ""


def load(path: Path) -> tuple[Equivalent, ...]:
    """The entries of one list file (a ``[[mutant]]`` table per entry)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: not valid TOML: {error}") from None
    entries = []
    for index, entry in enumerate(data.get("mutant", [])):
        missing = [key for key in ("sha256", "id", "reason") if not entry.get(key)]
        if missing:
            raise UsageError(
                f"{path}: mutant entry {index + 1} lacks {', '.join(missing)}"
            )
        entries.append(
            Equivalent(
                str(entry["sha256"]),
                str(entry["id"]),
                str(entry["reason"]),
                str(entry.get("file", "")),
            )
        )
    return tuple(entries)


def for_file(sha256: str, extra: tuple[Path, ...] = ()) -> dict[str, str]:
    """Mutant id -> reason, for the file with this hash, from the reviewed list
    and any lists given."""
    found: dict[str, str] = {}
    for path in (REVIEWED, *extra):
        if path == REVIEWED and not path.exists():
            continue
        for entry in load(path):
            if entry.sha256 == sha256:
                found[entry.id] = entry.reason
    return found
