"""A runner-lane case, and the file that carries one with its run.

A :class:`RunnerCase` is everything one run of the runner lane needs besides
the target: the model runner (``v2`` or ``v1``), the capture policy the deployment's
managers are built from, the engine options, each rank's request stream and
the seed. Like the sync lane's :class:`~dpsim.records.case.Case` it holds no
target, so the same case runs against any release or tree (that is how a fix
is verified); the file records the target it was found on.

A :class:`RunnerCaseFile` is a runner case's JSON file (``kind``
``dpsim-runner-case``, ``lane: "runner"``): the target (spec, version and the
SHA-256 of its loaded sources), the case, the properties judged, the verdicts,
the outcome and the simulator's trace. Reading one runs no code: JSON only,
checked field by field with one-line errors, as counterexample files are
(:mod:`dpsim.cex.files`, whose reader and writer it shares). ``dpsim replay``
reruns it and compares outcome, verdicts and trace byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dpsim
from dpsim.cex import validate
from dpsim.cex.files import load_json, write_atomically
from dpsim.errors import UsageError
from dpsim.limits import MAX_INT, shown
from dpsim.records.policy import CapturePolicy

from .stream import (
    EngineOptions,
    RankStream,
    speculators_of,
    streams_from_json,
    streams_to_json,
)

#: The lane's name, as ``--lane`` and files spell it.
LANE = "runner"
#: The model runners the lane drives; a case file without ``runner`` is V2's
#: (files written before the lane drove V1 replay as they did).
RUNNERS = ("v2", "v1")
KIND = "dpsim-runner-case"
SCHEMA_VERSION = 1
#: The scenario name a runner case answers to where sync-lane code asks
#: (reports, the ``solo`` property's phase pairing).
SCENARIO = "runner"


@dataclass(frozen=True)
class RunnerCase:
    """One run of the runner lane: ``streams[r]`` is what rank ``r``'s engine serves."""

    policy: CapturePolicy
    options: EngineOptions
    streams: tuple[RankStream, ...]
    seed: int = 0
    runner: str = "v2"

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise UsageError(
                f"runner case: the runner lane drives the {' and '.join(RUNNERS)} "
                f"runners, not {shown(self.runner)}"
            )
        if self.options.speculator not in (None, *speculators_of(self.runner)):
            raise UsageError(
                f"runner case: the {self.runner.upper()} runner's speculators are "
                f"{', '.join(speculators_of(self.runner))}, not "
                f"{shown(self.options.speculator)}"
            )
        if not self.streams:
            raise UsageError("runner case: needs one request stream per rank")
        if (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not 0 <= self.seed <= MAX_INT
        ):
            raise UsageError(f"runner case: seed must be 0..{MAX_INT}, got {self.seed}")
        if self.policy.decode_query_len != self.options.decode_query_len:
            # The capture table's decode length is 1 + k in vLLM (its
            # uniform-decode graphs are sized for the verification step).
            raise UsageError(
                f"runner case: the policy's decode_query_len "
                f"({self.policy.decode_query_len}) must be 1 + num_speculative_tokens "
                f"({self.options.decode_query_len})"
            )

    @property
    def dp_size(self) -> int:
        return len(self.streams)

    @property
    def scenario(self) -> str:
        return SCENARIO

    def to_dict(self) -> dict[str, Any]:
        return {
            "lane": LANE,
            "runner": self.runner,
            "dp_size": self.dp_size,
            "seed": self.seed,
            "policy": self.policy.to_dict(),
            "options": self.options.to_json(),
            "streams": streams_to_json(self.streams),
        }

    @classmethod
    def from_dict(cls, data: Any) -> RunnerCase:
        """Read back what :meth:`to_dict` wrote; one-line UsageError otherwise."""
        case = validate.mapping(data, "case")
        known = {"lane", "runner", "dp_size", "seed", "policy", "options", "streams"}
        unknown = set(case) - known
        if unknown:
            raise UsageError(
                f"runner case: unknown keys: {', '.join(sorted(map(str, unknown)))}"
            )
        if case.get("lane") != LANE:
            raise UsageError(
                f"runner case: lane must be {LANE!r}, got {shown(case.get('lane'))}"
            )
        options = EngineOptions.from_json(validate.required(case, "options", "case"))
        streams = streams_from_json(validate.required(case, "streams", "case"), options)
        dp_size = validate.integer(
            validate.required(case, "dp_size", "case"), "case.dp_size", 1
        )
        if dp_size != len(streams):
            raise UsageError(
                f"runner case: dp_size {dp_size} but {len(streams)} request streams"
            )
        try:
            policy = CapturePolicy.from_dict(validate.required(case, "policy", "case"))
        except (KeyError, TypeError, ValueError) as error:
            raise UsageError(f"runner case: malformed policy: {error}") from error
        return cls(
            policy=policy,
            options=options,
            streams=streams,
            seed=validate.integer(validate.required(case, "seed", "case"), "case.seed"),
            runner=validate.text(case.get("runner", "v2"), "case.runner"),
        )


@dataclass(frozen=True)
class RunnerCaseFile:
    """A runner case's file: the case, the target it ran on, and what it gave."""

    target: dict[str, Any]
    case: RunnerCase
    properties: tuple[str, ...]
    verdicts: tuple[dict[str, Any], ...]
    outcome: str
    trace: dict[str, Any]
    dpsim_version: str = dpsim.__version__

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema": SCHEMA_VERSION,
            "lane": LANE,
            "dpsim_version": self.dpsim_version,
            "target": self.target,
            "case": self.case.to_dict(),
            "properties": list(self.properties),
            "verdicts": list(self.verdicts),
            "outcome": self.outcome,
            "trace": self.trace,
        }

    def encode(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    def write(self, directory: Path) -> Path:
        """Write atomically under ``directory``, named after the first verdict
        and the case's content."""
        digest = hashlib.sha256(
            json.dumps(self.case.to_dict(), sort_keys=True).encode()
        ).hexdigest()[:10]
        first = self.verdicts[0]["property"] if self.verdicts else "pass"
        path = directory / f"{SCENARIO}-{first}-{digest}.json"
        write_atomically(path, self.encode())
        return path


def is_runner_file(data: Any) -> bool:
    """Whether parsed JSON is a runner case file (replay's dispatch)."""
    return isinstance(data, Mapping) and data.get("kind") == KIND


def read(path: Path) -> RunnerCaseFile:
    """Parse and validate a runner case file; one clear UsageError otherwise."""
    return parse(load_json(Path(path)), Path(path))


def parse(data: Any, path: Path) -> RunnerCaseFile:
    """A runner case file from its parsed JSON (``path`` names it in errors)."""
    from dpsim.properties import ALL_PROPERTY_NAMES

    if not is_runner_file(data):
        raise UsageError(f"{path}: not a dpsim runner case file")
    if data.get("schema") != SCHEMA_VERSION:
        raise UsageError(
            f"{path}: runner case schema {str(data.get('schema'))[:40]!r}; "
            f"this dpsim reads {SCHEMA_VERSION}"
        )
    try:
        if data.get("lane") != LANE:
            raise UsageError(f"lane must be {LANE!r}, got {shown(data.get('lane'))}")
        case = RunnerCase.from_dict(validate.required(data, "case", "file"))
        target = validate.target(validate.required(data, "target", "file"))
        lane_files = validate.mapping(target.get("lane_files", {}), "target.lane_files")
        for module, digest in lane_files.items():
            if not isinstance(digest, str) or len(digest) != 64:
                raise UsageError(f"target.lane_files[{module[:80]!r}] is not a SHA-256")
        known = frozenset(ALL_PROPERTY_NAMES)
        return RunnerCaseFile(
            target=target,
            case=case,
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
    except UsageError as error:
        raise UsageError(f"{path}: malformed runner case: {error}") from error
