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
``spec-decode``   speculative decodes of the policies' decode_query_len
                  tokens each (1 + speculative tokens; it must be >= 2 and
                  the same for every policy compared), 1..64 requests per
                  rank, an occasional prefill chunk.

Trace file format (JSON Lines, ``.jsonl``): one line per step, an object
with a ``ranks`` list, one entry per DP rank, every line the same length.
A rank entry is either a list of query lengths, or an object with
``query_lens``, or an object with ``num_reqs`` and ``num_tokens`` (the tokens
spread as evenly as they go, the remainder on the last requests)::

    {"ranks": [[1, 1, 1], [1, 1, 37], []]}
    {"ranks": [{"query_lens": [1, 1]}, {"num_reqs": 3, "num_tokens": 3}, []]}

Blank lines and lines starting with ``#`` are skipped. A step where every
rank is idle is kept and counted, but not run: vLLM's DP engines do not step
while no rank has a request (the wave ends), so such a step has no sync and
no padding; the report says how many there were. Every error names the file
and line, in one line.

Sizes are bounded (:mod:`dpsim.limits`): a trace file of at most
MAX_TRACE_BYTES, at most MAX_RANKS ranks, MAX_NUM_SEQS requests of at most
MAX_INT tokens per rank, MAX_RANK_STEPS steps times ranks and
MAX_WORKLOAD_REQUESTS requests in all; built-in workloads at most
MAX_RANK_STEPS steps times ranks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

from dpsim.errors import UsageError
from dpsim.fields import Field, integer
from dpsim.limits import (
    MAX_INT,
    MAX_NUM_SEQS,
    MAX_RANK_STEPS,
    MAX_RANKS,
    MAX_TRACE_BYTES,
    MAX_WORKLOAD_REQUESTS,
    read_bounded_text,
    shown,
)

__all__ = [
    "BUILTIN_WORKLOADS",
    "Step",
    "Workload",
    "WorkloadError",
    "builtin_workload",
    "decode_query_len_for",
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

    @functools.cached_property
    def working_steps(self) -> tuple[Step, ...]:
        """The steps vLLM runs: those where some rank has a request.

        While every rank is idle vLLM's DP engines do not step at all (no
        dummy batch, no sync), so an all-idle step costs nothing and is
        counted (:attr:`idle_steps`), not run.
        """
        return tuple(step for step in self.steps if any(step))

    @property
    def idle_steps(self) -> int:
        """Steps where every rank is idle; kept, counted, not run."""
        return len(self.steps) - len(self.working_steps)

    @property
    def idle_note(self) -> str | None:
        """One line for the report about the all-idle steps, if there were any."""
        if not self.idle_steps:
            return None
        return (
            f"{self.name} at DP {self.dp_size}: {self.idle_steps} of "
            f"{len(self.steps)} steps had every rank idle; vLLM does not step "
            "then, so they are counted here and not run"
        )

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
        steps = tuple(
            tuple(stream[start : start + dp_size])
            for start in range(0, len(stream) - dp_size + 1, dp_size)
        )
        return Workload(
            f"{self.name} (dealt to {dp_size} ranks)", steps, self.from_trace
        )


# -- built-in workloads ------------------------------------------------------

#: (rng, DP size, steps, decode query length) -> steps.
_Generator = Callable[[Random, int, int, int], list[Step]]


def _decoding(
    most: int, drift: int, prefill: tuple[int, int], speculative: bool = False
) -> _Generator:
    """Ranks decoding a drifting number of requests, one in ten with a prefill.

    Decodes are one token each, or, ``speculative``, the policies' decode
    query length (1 + speculative tokens) each.
    """

    def generate(
        rng: Random, dp_size: int, steps: int, decode_query_len: int
    ) -> list[Step]:
        query_len = decode_query_len if speculative else 1
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


def _prefill_heavy(rng: Random, dp_size: int, steps: int, _q: int) -> list[Step]:
    out: list[Step] = []
    for _ in range(steps):
        step = []
        for _rank in range(dp_size):
            chunks = [rng.randint(16, 256) for _ in range(rng.randint(1, 4))]
            step.append(tuple([1] * rng.randint(0, 16) + chunks))
        out.append(tuple(step))
    return out


def _bursty(rng: Random, dp_size: int, steps: int, _q: int) -> list[Step]:
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
    "decode-heavy": _decoding(most=256, drift=12, prefill=(16, 512)),
    "prefill-heavy": _prefill_heavy,
    "bursty": _bursty,
    "spec-decode": _decoding(most=64, drift=4, prefill=(16, 256), speculative=True),
}
BUILTIN_WORKLOADS = tuple(_BUILTINS)


def builtin_workload(
    name: str,
    dp_size: int,
    steps: int,
    seed: int = 0,
    max_reqs: int = 256,
    decode_query_len: int = 1,
) -> Workload:
    """A built-in workload at ``dp_size`` ranks, ``steps`` steps long.

    No rank schedules more than ``max_reqs`` requests (vLLM's max_num_seqs):
    decodes give way first, as the prefill chunk is the newest request.
    ``spec-decode`` decodes ``decode_query_len`` tokens per request, the
    policies' own length (see :func:`decode_query_len_for`).
    """
    generate = _BUILTINS.get(name)
    if generate is None:
        raise WorkloadError(
            f"unknown workload {name!r}: give a .jsonl trace file or one of "
            f"{', '.join(BUILTIN_WORKLOADS)}"
        )
    if dp_size < 1 or steps < 1:
        raise WorkloadError("a workload needs at least 1 rank and 1 step")
    _check_rank_steps(f"{name}: {steps:,} steps at DP {dp_size:,}", steps * dp_size)
    label = name
    if name == "spec-decode":
        if decode_query_len < 2:
            raise WorkloadError(
                "spec-decode runs speculative decodes of the policies' "
                f"decode_query_len tokens, but theirs is {decode_query_len}; give "
                "policies with decode_query_len >= 2 (1 + speculative tokens)"
            )
        label = f"spec-decode (decodes of {decode_query_len} tokens)"
    # Seeded per (name, DP size) so adding a workload never shifts another.
    rng = Random(f"{name}:{dp_size}:{seed}")
    capped = tuple(
        tuple(lengths[-max_reqs:] for lengths in step)
        for step in generate(rng, dp_size, steps, decode_query_len)
    )
    return Workload(label, capped)


def decode_query_len_for(spec: str, lengths: Mapping[str, int]) -> int:
    """The decode query length workload ``spec`` runs at, for policies compared.

    ``lengths`` maps each policy's name to its decode_query_len. Only
    ``spec-decode`` depends on it; as every policy meets the same steps,
    policies that decode different lengths cannot share one.
    """
    distinct = sorted(set(lengths.values()))
    if spec == "spec-decode" and len(distinct) > 1:
        given = ", ".join(f"{name} {length}" for name, length in lengths.items())
        raise WorkloadError(
            "spec-decode decodes the policies' decode_query_len tokens per "
            f"request, but theirs differ ({given}); compare policies of one "
            "decode length, or give a trace"
        )
    return distinct[0] if distinct else 1


def _check_rank_steps(what: str, rank_steps: int) -> None:
    if rank_steps > MAX_RANK_STEPS:
        raise WorkloadError(
            f"{what} are {rank_steps:,} rank batches; at most {MAX_RANK_STEPS:,} "
            "(every rank's batch of every step is held in memory)"
        )


# -- traces ------------------------------------------------------------------

#: A query length: every request has at least one token.
_QUERY_LEN = integer(1, MAX_INT)

#: A rank object's counts, checked before the list of lengths is built from them.
_COUNTS = (
    Field("num_reqs", integer(0, MAX_NUM_SEQS)),
    Field("num_tokens", integer(0, MAX_INT)),
)


def _query_lengths(values: Any, fail: Callable[[str], WorkloadError]) -> list[int]:
    """Checked query lengths: a list of at most MAX_NUM_SEQS lengths >= 1."""
    if not isinstance(values, list):
        raise fail(f"query_lens must be a list, got {shown(values)}")
    if len(values) > MAX_NUM_SEQS:
        raise fail(f"{len(values):,} requests; at most {MAX_NUM_SEQS:,} per rank")
    for value in values:
        problem = _QUERY_LEN(value)
        if problem is not None:
            raise fail(f"query lengths: each {problem}")
    return values


def _lengths(entry: Any, where: str) -> tuple[int, ...]:
    def fail(message: str) -> WorkloadError:
        return WorkloadError(f"{where}: {message}")

    if isinstance(entry, list):
        lengths = _query_lengths(entry, fail)
    elif isinstance(entry, dict):
        unknown = sorted(set(entry) - {"query_lens", "num_reqs", "num_tokens"})
        if unknown:
            raise fail(
                f"unknown key {shown(unknown[0])} "
                "(known: query_lens, num_reqs, num_tokens)"
            )
        if "query_lens" in entry:
            lengths = _query_lengths(entry["query_lens"], fail)
            # Counts given beside the list must describe the same requests.
            given = (entry.get("num_reqs"), entry.get("num_tokens"))
            derived = (len(lengths), sum(lengths))
            for label, value, actual in zip(
                ("num_reqs", "num_tokens"), given, derived, strict=True
            ):
                if value is not None and value != actual:
                    raise fail(
                        f"{label} {shown(value)} does not match query_lens ({actual})"
                    )
        elif "num_reqs" in entry and "num_tokens" in entry:
            reqs, tokens = entry["num_reqs"], entry["num_tokens"]
            for spec in _COUNTS:
                problem = spec.problem(entry[spec.name])
                if problem is not None:
                    raise fail(f"{spec.name} {problem}")
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
        raise fail(
            f"a rank is a list of query lengths or an object, got {shown(entry)}"
        )
    if sum(lengths) > MAX_INT:
        raise fail(f"{sum(lengths):,} tokens; at most {MAX_INT:,} per rank")
    return tuple(lengths)


def parse_trace(lines: Iterable[str], source: str) -> Workload:
    """A trace's steps from its lines; ``source`` names it in errors."""
    steps: list[Step] = []
    dp_size: int | None = None
    requests = 0
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{where}: invalid JSON: {error.msg}") from None
        except RecursionError:
            raise WorkloadError(f"{where}: nested too deeply to be a step") from None
        except ValueError as error:  # e.g. an integer of over 4,300 digits
            raise WorkloadError(f"{where}: invalid JSON: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("ranks"), list):
            raise WorkloadError(
                f'{where}: expected an object with a "ranks" list, got {text[:60]}'
            )
        unknown = sorted(set(record) - {"ranks", "step"})
        if unknown:
            raise WorkloadError(f"{where}: unknown key {shown(unknown[0])}")
        ranks = record["ranks"]
        if not ranks:
            raise WorkloadError(f"{where}: ranks is empty")
        if len(ranks) > MAX_RANKS:
            raise WorkloadError(f"{where}: {len(ranks):,} ranks; at most {MAX_RANKS:,}")
        if dp_size is None:
            dp_size = len(ranks)
        elif len(ranks) != dp_size:
            raise WorkloadError(
                f"{where}: {len(ranks)} ranks, but earlier steps have {dp_size}"
            )
        _check_rank_steps(
            f"{where}: {len(steps) + 1:,} steps of {dp_size:,} ranks",
            (len(steps) + 1) * dp_size,
        )
        step = tuple(
            _lengths(entry, f"{where}: rank {i}") for i, entry in enumerate(ranks)
        )
        requests += sum(len(lengths) for lengths in step)
        if requests > MAX_WORKLOAD_REQUESTS:
            raise WorkloadError(
                f"{where}: {requests:,} requests so far; a workload holds at most "
                f"{MAX_WORKLOAD_REQUESTS:,}"
            )
        steps.append(step)
    workload = Workload(Path(source).name, tuple(steps), from_trace=True)
    if not workload.working_steps:
        raise WorkloadError(f"{source}: no step with work in it")
    return workload


def load_trace(path: str | Path) -> Workload:
    """Read a JSONL trace file (see the module docstring for the format)."""
    path = Path(path)
    text = read_bounded_text(path, MAX_TRACE_BYTES, "trace file", WorkloadError)
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
    spec: str,
    dp_size: int,
    steps: int,
    seed: int,
    max_reqs: int = 256,
    decode_query_len: int = 1,
) -> Workload:
    """A built-in name or a trace file, at ``dp_size`` ranks.

    A trace is cut to its first ``steps`` steps after dealing, so that
    ``--steps`` bounds the run time either way.
    """
    if spec in _BUILTINS:
        workload = builtin_workload(
            spec, dp_size, steps, seed, max_reqs, decode_query_len
        )
    else:
        workload = _trace_at(spec, dp_size, steps, max_reqs)
    if not workload.working_steps:
        raise WorkloadError(
            f"{spec}: every rank is idle in all {len(workload.steps)} steps at DP "
            f"{dp_size}; nothing to measure"
        )
    return workload


def _trace_at(spec: str, dp_size: int, steps: int, max_reqs: int) -> Workload:
    """The trace ``spec`` dealt to ``dp_size`` ranks, cut to ``steps`` steps."""
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
