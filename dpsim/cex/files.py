"""The counterexample file format (JSON, versioned, nothing executable).

A file holds the target (its spec and the SHA-256 of every source file loaded),
the case (policy, per-rank inputs, scenario, profile), the scheduling choices,
the properties checked, the verdicts and the simulator's full trace. Reading
one runs no code: it is parsed as JSON and validated field by field, and only
the target it names is ever executed, when the user replays it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dpsim
from dpsim.cex import validate
from dpsim.errors import UsageError
from dpsim.properties.base import Verdict
from dpsim.records.case import Case
from dpsim.records.trace import SimResult
from dpsim.targets.load import Target
from dpsim.terminal import printable

SCHEMA_VERSION = 1
KIND = "dpsim-counterexample"


@dataclass(frozen=True)
class Counterexample:
    """A counterexample file's content."""

    target: dict[str, Any]
    case: Case
    choices: tuple[int, ...]
    properties: tuple[str, ...]
    verdicts: tuple[dict[str, Any], ...]
    outcome: str
    trace: dict[str, Any]
    dpsim_version: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema": SCHEMA_VERSION,
            "dpsim_version": self.dpsim_version,
            "target": self.target,
            "case": self.case.to_dict(),
            "choices": list(self.choices),
            "properties": list(self.properties),
            "verdicts": list(self.verdicts),
            "outcome": self.outcome,
            "trace": self.trace,
        }


def build(
    target: Target,
    case: Case,
    result: SimResult,
    verdicts: tuple[Verdict, ...],
    properties: tuple[str, ...],
) -> Counterexample:
    return Counterexample(
        target={
            "label": target.label,
            "spec": target.spec.to_dict(),
            "version": target.version,
            "files": {loaded.module: loaded.sha256 for loaded in target.files},
        },
        case=case,
        choices=tuple(result.choices),
        properties=properties,
        verdicts=tuple(verdict.to_dict() for verdict in verdicts),
        outcome=str(result.outcome.value),
        trace=result.to_dict(),
        dpsim_version=dpsim.__version__,
    )


def save(
    target: Target,
    case: Case,
    result: SimResult,
    verdicts: Sequence[Verdict],
    properties: Sequence[str],
    directory: Path,
) -> Path:
    """Build the counterexample of a failing run and write it under ``directory``."""
    built = build(target, case, result, tuple(verdicts), tuple(properties))
    return write(built, directory)


def encode(counterexample: Counterexample) -> str:
    return json.dumps(counterexample.to_dict(), indent=1, sort_keys=True) + "\n"


def write(
    counterexample: Counterexample, directory: Path, name: str | None = None
) -> Path:
    """Write atomically under ``directory``; the name is derived from the
    content, its first part ``name`` when given (``dpsim diff`` names a file
    after the difference it shows, not a verdict)."""
    text = encode(counterexample)
    digest = hashlib.sha256(
        json.dumps(counterexample.case.to_dict(), sort_keys=True).encode()
    ).hexdigest()[:10]
    first = stem(counterexample, digest) if name is None else f"{name}-{digest}"
    path = directory / f"{first}.json"
    write_atomically(path, text)
    return path


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (its folder made)."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(
        dir=directory, prefix=".writing-", suffix=".json"
    )
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


#: Bigger than any counterexample dpsim writes (a 1024-rank trace is a few
#: MiB); reading stops before parsing anything larger.
MAX_FILE_BYTES = 64 * 2**20


def stem(counterexample: Counterexample, digest: str) -> str:
    first = (
        counterexample.verdicts[0]["property"] if counterexample.verdicts else "fail"
    )
    return f"{counterexample.case.scenario}-{first}-{digest}"


def read(path: Path) -> Counterexample:
    """Parse and validate a file; anything wrong is one clear UsageError.

    Nothing in the file is executed or imported: JSON only, every field
    checked (see :mod:`dpsim.cex.validate`) before a case is built from it.
    """
    try:
        return _read(Path(path))
    except UsageError as error:
        # The file's name and the keys and values it holds are not dpsim's
        # text: escaped, they can neither drive a terminal nor break the line.
        shown = printable(error)
        if shown == str(error):
            raise
        raise UsageError(shown) from error


def _read(path: Path) -> Counterexample:
    data = load_json(path)
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UsageError(f"{path}: not a dpsim counterexample file")
    if data.get("schema") != SCHEMA_VERSION:
        raise UsageError(
            f"{path}: counterexample schema {str(data.get('schema'))[:40]!r}; "
            f"this dpsim reads {SCHEMA_VERSION}"
        )
    try:
        return _parse(data)
    except UsageError as error:
        raise UsageError(f"{path}: malformed counterexample: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        # Defence in depth: validate.py should have caught it first.
        raise UsageError(
            f"{path}: malformed counterexample ({type(error).__name__}: {error})"
        ) from error


def load_json(path: Path) -> Any:
    """A file's JSON, read with the size limit and refusals every dpsim file
    shares (the runner lane's case files too); nothing in it is executed."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror})") from error
    if len(raw) > MAX_FILE_BYTES:
        raise UsageError(
            f"{path}: not a dpsim counterexample (over {MAX_FILE_BYTES // 2**20} MiB)"
        )
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        # ValueError covers JSONDecodeError and integers too long to convert.
        reason = str(error).splitlines()[0][:200] if str(error) else "too deep"
        raise UsageError(
            f"{path}: not a dpsim counterexample (not JSON: {reason})"
        ) from error
    return data


def _parse(data: dict[str, Any]) -> Counterexample:
    from dpsim.properties import PROPERTY_NAMES

    case = Case.from_dict(validate.case(validate.required(data, "case", "file")))
    known = frozenset(PROPERTY_NAMES)
    return Counterexample(
        target=validate.target(validate.required(data, "target", "file")),
        case=case,
        choices=validate.choices(
            validate.required(data, "choices", "file"), case.dp_size
        ),
        properties=validate.names(
            validate.required(data, "properties", "file"), "properties", known
        ),
        verdicts=validate.verdicts(
            validate.required(data, "verdicts", "file"), known, case.dp_size
        ),
        outcome=validate.outcome(validate.required(data, "outcome", "file")),
        trace=validate.mapping(validate.required(data, "trace", "file"), "trace"),
        dpsim_version=validate.text(
            validate.required(data, "dpsim_version", "file"), "dpsim_version"
        ),
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def rerun_dict(
    result: SimResult, verdicts: tuple[dict[str, Any], ...] | list[dict[str, Any]]
) -> dict[str, Any]:
    """The part of a file a rerun must reproduce: outcome, verdicts, trace."""
    return {
        "outcome": str(result.outcome.value),
        "verdicts": list(verdicts),
        "trace": result.to_dict(),
    }


def recorded_rerun(counterexample: Counterexample) -> dict[str, Any]:
    """The same part, as the file recorded it."""
    return {
        "outcome": counterexample.outcome,
        "verdicts": list(counterexample.verdicts),
        "trace": counterexample.trace,
    }


def canonical(data: dict[str, Any]) -> str:
    """Bytes to compare reruns by: the file's own encoding of them."""
    return json.dumps(data, indent=1, sort_keys=True)
