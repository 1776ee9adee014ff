"""Workloads: what the DP ranks are asked to run, step by step, as plain data.

A policy's cost depends on the batches it meets, so cost figures are only as
good as the workload behind them. A workload is a list of steps; each step
holds, per DP rank, the query lengths of the requests that rank schedules in
that step (tokens per request; an empty list is an idle rank). That is the
level at which vLLM's scheduler speaks, and the level a user can export from
their own logs, so built-in workloads and user traces are the same data.

Built-in workloads (seeded, so the same name, DP size, steps and seed give
the same steps):

``decode-heavy``  every rank decodes a slowly drifting number of requests
                  (1..256), with an occasional prefill chunk.
``prefill-heavy`` every rank runs 1..4 prefill chunks of 16..256 tokens
                  beside a few decodes.
``bursty``        quiet phases where most ranks are idle and the rest decode
                  a handful of requests, alternating with bursts where every
                  rank prefills and decodes.
``spec-decode``   decodes of 1 + 3 speculative tokens (query length 4),
                  1..64 requests per rank, an occasional prefill chunk.

Trace file format (JSON Lines, ``.jsonl``): one line per step, an object
with a ``ranks`` list, one entry per DP rank, every line the same length.
A rank entry is either a list of query lengths, or an object with
``query_lens``, or an object with ``num_reqs`` and ``num_tokens`` (the tokens
spread as evenly as they go, the remainder on the last requests)::

    {"ranks": [[1, 1, 1], [1, 1, 37], []]}
    {"ranks": [{"query_lens": [1, 1]}, {"num_reqs": 3, "num_tokens": 3}, []]}

Blank lines and lines starting with ``#`` are skipped. Steps where no rank
has work are dropped (vLLM does not step then). Every error names the file
and line, in one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

from dpsim.errors import UsageError

__all__ = [
    "BUILTIN_WORKLOADS",
    "Step",
    "Workload",
    "WorkloadError",
    "builtin_workload",
    "load_trace",
    "parse_trace",
    "resolve_workload",
    "trace_path",
]

#: One step: per rank, the query lengths of its requests (empty: idle).
Step = tuple[tuple[int, ...], ...]


class WorkloadError(UsageError):
    """A workload that cannot be read; the message is one line naming file:line."""


@dataclass(frozen=True)
class Workload:
    """Named steps; every step has one entry per DP rank."""

    name: str
    steps: tuple[Step, ...]
    #: True for a user trace, whose DP size is fixed by the file.
    from_trace: bool = False

    @property
    def dp_size(self) -> int:
        return len(self.steps[0]) if self.steps else 0

    def at_dp_size(self, dp_size: int) -> Workload:
        """The same stream of per-rank batches, dealt to ``dp_size`` ranks.

        A trace is recorded at one DP size; to ask "what if DP were N", its
        per-rank batches are taken in order (step by step, rank by rank) and
        dealt N to a step. This keeps the distribution of per-rank batches
        and lets the max across ranks grow or shrink as it would with more or
        fewer ranks; it drops correlations between ranks of one step.
        """
        if dp_size == self.dp_size:
            return self
        stream = [batch for step in self.steps for batch in step]
        steps = [
            tuple(stream[start : start + dp_size])
            for start in range(0, len(stream) - dp_size + 1, dp_size)
        ]
        return Workload(
            f"{self.name} (dealt to {dp_size} ranks)", _working(steps), self.from_trace
        )


def _working(steps: Sequence[Step]) -> tuple[Step, ...]:
    return tuple(step for step in steps if any(step))


# -- built-in workloads ------------------------------------------------------

_Generator = Callable[[Random, int, int], list[Step]]


def _decoding(
    query_len: int, most: int, drift: int, prefill: tuple[int, int]
) -> _Generator:
    """Ranks decoding a drifting number of requests, one in ten with a prefill."""

    def generate(rng: Random, dp_size: int, steps: int) -> list[Step]:
        running = [rng.randint(1, most) for _ in range(dp_size)]
        out: list[Step] = []
        for _ in range(steps):
            step = []
            for rank in range(dp_size):
                # A random walk: request counts drift as requests finish and join.
                walked = running[rank] + rng.randint(-drift, drift)
                running[rank] = min(most, max(1, walked))
                lengths = [query_len] * running[rank]
                if rng.random() < 0.1:
                    lengths.append(rng.randint(*prefill))
                step.append(tuple(lengths))
            out.append(tuple(step))
        return out

    return generate


def _prefill_heavy(rng: Random, dp_size: int, steps: int) -> list[Step]:
    out: list[Step] = []
    for _ in range(steps):
        step = []
        for _rank in range(dp_size):
            chunks = [rng.randint(16, 256) for _ in range(rng.randint(1, 4))]
            step.append(tuple([1] * rng.randint(0, 16) + chunks))
        out.append(tuple(step))
    return out


def _bursty(rng: Random, dp_size: int, steps: int) -> list[Step]:
    out: list[Step] = []
    burst = False
    for _ in range(steps):
        if rng.random() < 0.1:
            burst = not burst
        step = []
        for _rank in range(dp_size):
            if burst:
                lengths = [1] * rng.randint(8, 128)
                if rng.random() < 0.5:
                    lengths.append(rng.randint(32, 512))
            elif rng.random() < 0.7:
                lengths = []
            else:
                lengths = [1] * rng.randint(1, 8)
            step.append(tuple(lengths))
        out.append(tuple(step))
    return out


_BUILTINS: dict[str, _Generator] = {
    "decode-heavy": _decoding(query_len=1, most=256, drift=12, prefill=(16, 512)),
    "prefill-heavy": _prefill_heavy,
    "bursty": _bursty,
    "spec-decode": _decoding(query_len=4, most=64, drift=4, prefill=(16, 256)),
}
BUILTIN_WORKLOADS = tuple(_BUILTINS)


def builtin_workload(
    name: str, dp_size: int, steps: int, seed: int = 0, max_reqs: int = 256
) -> Workload:
    """A built-in workload at ``dp_size`` ranks, ``steps`` steps long.

    No rank schedules more than ``max_reqs`` requests (vLLM's max_num_seqs):
    decodes give way first, as the prefill chunk is the newest request.
    """
    generate = _BUILTINS.get(name)
    if generate is None:
        raise WorkloadError(
            f"unknown workload {name!r}: give a .jsonl trace file or one of "
            f"{', '.join(BUILTIN_WORKLOADS)}"
        )
    if dp_size < 1 or steps < 1:
        raise WorkloadError("a workload needs at least 1 rank and 1 step")
    # Seeded per (name, DP size) so adding a workload never shifts another.
    rng = Random(f"{name}:{dp_size}:{seed}")
    capped = [
        tuple(lengths[-max_reqs:] for lengths in step)
        for step in generate(rng, dp_size, steps)
    ]
    return Workload(name, _working(capped))


# -- traces ------------------------------------------------------------------


def _is_count(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _lengths(entry: Any, where: str) -> tuple[int, ...]:
    def fail(message: str) -> WorkloadError:
        return WorkloadError(f"{where}: {message}")

    if isinstance(entry, list):
        lengths: Any = entry
    elif isinstance(entry, dict):
        unknown = sorted(set(entry) - {"query_lens", "num_reqs", "num_tokens"})
        if unknown:
            raise fail(
                f"unknown key {unknown[0]!r} (known: query_lens, num_reqs, num_tokens)"
            )
        if "query_lens" in entry:
            lengths = entry["query_lens"]
            if not isinstance(lengths, list):
                raise fail(f"query_lens must be a list, got {lengths!r}")
            # Counts given beside the list must describe the same requests.
            given = (entry.get("num_reqs"), entry.get("num_tokens"))
            derived = (len(lengths), sum(v for v in lengths if _is_count(v, 1)))
            for label, value, actual in zip(
                ("num_reqs", "num_tokens"), given, derived, strict=True
            ):
                if value is not None and value != actual:
                    raise fail(
                        f"{label} {value!r} does not match query_lens ({actual})"
                    )
        elif "num_reqs" in entry and "num_tokens" in entry:
            reqs, tokens = entry["num_reqs"], entry["num_tokens"]
            if not _is_count(reqs, 0) or not _is_count(tokens, 0):
                raise fail(
                    f"num_reqs and num_tokens must be integers >= 0, got {reqs!r}, {tokens!r}"
                )
            if (reqs == 0) != (tokens == 0) or tokens < reqs:
                raise fail(
                    f"{reqs} requests cannot hold {tokens} tokens "
                    "(every request has >= 1 token; 0 and 0 is an idle rank)"
                )
            base, extra = divmod(tokens, reqs) if reqs else (0, 0)
            lengths = [base + (index >= reqs - extra) for index in range(reqs)]
        else:
            raise fail("a rank object needs query_lens, or num_reqs and num_tokens")
    else:
        raise fail(f"a rank is a list of query lengths or an object, got {entry!r}")
    bad = [value for value in lengths if not _is_count(value, 1)]
    if bad:
        raise fail(f"query lengths must be integers >= 1, got {bad[0]!r}")
    return tuple(lengths)


def parse_trace(lines: Sequence[str], source: str) -> Workload:
    """A trace's steps from its lines; ``source`` names it in errors."""
    steps: list[Step] = []
    dp_size: int | None = None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{where}: invalid JSON: {error.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("ranks"), list):
            raise WorkloadError(
                f'{where}: expected an object with a "ranks" list, got {text[:60]}'
            )
        unknown = sorted(set(record) - {"ranks", "step"})
        if unknown:
            raise WorkloadError(f"{where}: unknown key {unknown[0]!r}")
        ranks = record["ranks"]
        if not ranks:
            raise WorkloadError(f"{where}: ranks is empty")
        if dp_size is None:
            dp_size = len(ranks)
        elif len(ranks) != dp_size:
            raise WorkloadError(
                f"{where}: {len(ranks)} ranks, but earlier steps have {dp_size}"
            )
        steps.append(
            tuple(
                _lengths(entry, f"{where}: rank {i}") for i, entry in enumerate(ranks)
            )
        )
    working = _working(steps)
    if not working:
        raise WorkloadError(f"{source}: no step with work in it")
    return Workload(Path(source).name, working, from_trace=True)


def load_trace(path: str | Path) -> Workload:
    """Read a JSONL trace file (see the module docstring for the format)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such workload file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadError(f"{path}: cannot read: {error}") from None
    return parse_trace(text.splitlines(), str(path))


def trace_path(spec: str) -> Path:
    """``spec`` as a trace file, or an error listing the built-in names.

    A bare word that is no file is most likely a mistyped built-in name.
    """
    path = Path(spec)
    if path.suffix not in (".jsonl", ".json") and not path.exists():
        raise WorkloadError(
            f"unknown workload {spec!r}: give a .jsonl trace file or one of "
            f"{', '.join(BUILTIN_WORKLOADS)}"
        )
    return path


def resolve_workload(
    spec: str, dp_size: int, steps: int, seed: int, max_reqs: int = 256
) -> Workload:
    """A built-in name or a trace file, at ``dp_size`` ranks.

    A trace is cut to its first ``steps`` steps after dealing, so that
    ``--steps`` bounds the run time either way.
    """
    if spec in _BUILTINS:
        return builtin_workload(spec, dp_size, steps, seed, max_reqs)
    workload = load_trace(trace_path(spec)).at_dp_size(dp_size)
    if not workload.steps:
        raise WorkloadError(
            f"{spec}: too few rank batches to fill one step of {dp_size}"
        )
    for index, step in enumerate(workload.steps):
        for rank, lengths in enumerate(step):
            if len(lengths) > max_reqs:
                raise WorkloadError(
                    f"{spec}: step {index} rank {rank} has {len(lengths)} requests, "
                    f"more than the policies' max_num_seqs {max_reqs}"
                )
    return Workload(workload.name, workload.steps[:steps], from_trace=True)
