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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dpsim
from dpsim.errors import UsageError
from dpsim.properties.base import Verdict
from dpsim.scenarios.case import Case
from dpsim.sim import SimResult
from dpsim.targets.load import Target

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
        trace=result.as_dict(),
        dpsim_version=dpsim.__version__,
    )


def encode(counterexample: Counterexample) -> str:
    return json.dumps(counterexample.to_dict(), indent=1, sort_keys=True) + "\n"


def write(counterexample: Counterexample, directory: Path) -> Path:
    """Write atomically under ``directory``; the name is derived from the content."""
    text = encode(counterexample)
    digest = hashlib.sha256(
        json.dumps(counterexample.case.to_dict(), sort_keys=True).encode()
    ).hexdigest()[:10]
    first = (
        counterexample.verdicts[0]["property"] if counterexample.verdicts else "fail"
    )
    path = directory / f"{counterexample.case.scenario}-{first}-{digest}.json"
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
    return path


def read(path: Path) -> Counterexample:
    """Parse and validate a file; anything wrong is one clear UsageError."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror})") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(
            f"{path}: not a dpsim counterexample (not JSON: {error})"
        ) from error
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UsageError(f"{path}: not a dpsim counterexample file")
    if data.get("schema") != SCHEMA_VERSION:
        raise UsageError(
            f"{path}: counterexample schema {data.get('schema')!r}; this dpsim reads {SCHEMA_VERSION}"
        )
    try:
        return Counterexample(
            target=_mapping(data["target"], "target"),
            case=Case.from_dict(_mapping(data["case"], "case")),
            choices=tuple(int(choice) for choice in data["choices"]),
            properties=tuple(str(name) for name in data["properties"]),
            verdicts=tuple(
                _mapping(verdict, "verdict") for verdict in data["verdicts"]
            ),
            outcome=str(data["outcome"]),
            trace=_mapping(data["trace"], "trace"),
            dpsim_version=str(data["dpsim_version"]),
        )
    except UsageError as error:
        raise UsageError(f"{path}: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(
            f"{path}: malformed counterexample ({type(error).__name__}: {error})"
        ) from error


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"malformed counterexample: {what} is not an object")
    return value
