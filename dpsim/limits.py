"""Upper bounds on every number a user can set, each defined once with its reason.

A policy file, a counterexample, a workload trace or a flag may ask for any
size; where dpsim's memory or time grows with a number, an unbounded one
(``1e8``, ``2**62``) would swap the machine or run for hours instead of being
refused. The bounds sit well above anything a real deployment uses, each
argued from vLLM's own defaults where it has one, and are checked where the
number enters (policy, counterexample, workload, CLI), all through
:func:`int_problem`, so every refusal reads the same.
"""

from __future__ import annotations

import reprlib
from pathlib import Path

from dpsim.errors import UsageError

__all__ = [
    "MAX_CAPTURE_ENTRIES",
    "MAX_CAPTURE_SIZE",
    "MAX_DECODE_QUERY_LEN",
    "MAX_GRAPHS_PER_MODE",
    "MAX_INT",
    "MAX_LORA_CASES",
    "MAX_NUM_SEQS",
    "MAX_POLICY_BYTES",
    "MAX_RANKS",
    "MAX_RANK_STEPS",
    "MAX_SPECULATIVE_TOKENS",
    "MAX_TRACE_BYTES",
    "MAX_UBATCHES",
    "MAX_WORKLOAD_REQUESTS",
    "int_problem",
    "read_bounded_text",
    "shown",
]

#: DP ranks in one simulated deployment (``--ranks``, a counterexample's
#: dp_size): far above real DP sizes, low enough that a replay of the biggest
#: allowed case still ends in seconds.
MAX_RANKS = 1024

#: Any other count (tokens, requests, thresholds, LoRA ids): vLLM keeps batch
#: metadata in int32 tensors, so a larger value cannot describe a real batch.
MAX_INT = 2**31 - 1

#: A capture size, and max_capture_size. vLLM drops capture sizes above
#: max_num_batched_tokens, whose largest default is 16,384
#: (``EngineArgs.get_batch_defaults``); and the manager's candidate table holds
#: one entry per token count up to the largest size, per LoRA case and mode
#: (about 200 bytes and 25 us each, measured), so the size bounds its memory.
MAX_CAPTURE_SIZE = 16_384

#: Entries in a capture-size list (and any list in a counterexample's
#: policy): vLLM's own default grid up to MAX_CAPTURE_SIZE has 1,043 sizes.
MAX_CAPTURE_ENTRIES = 2048

#: Entries in lora_capture_cases: vLLM captures 0, the powers of two up to
#: max_loras and max_loras itself, about ten cases even at max_loras = 256.
MAX_LORA_CASES = 16

#: Capture sizes times LoRA cases: the graphs one mode captures. The
#: manager's constructor de-duplicates them with a list scan, so its time
#: grows with the square of this (about 5 s at the limit, measured on 0.33.0);
#: vLLM's default grid at 512 with five LoRA cases is 255.
MAX_GRAPHS_PER_MODE = 4096

#: max_num_seqs: 16 times vLLM's largest default (1,024,
#: ``EngineArgs.get_batch_defaults``). Generated and workload batches list one
#: query length per request, so memory per batch grows with it.
MAX_NUM_SEQS = 16_384

#: A policy file's size: a policy is a few hundred bytes, and a file is read
#: whole before it is parsed.
MAX_POLICY_BYTES = 2**20

#: Speculative tokens per step (decode_query_len - 1, a drafter case's
#: num_speculative_steps): the drafter scenario runs one sync per token.
MAX_SPECULATIVE_TOKENS = 64
MAX_DECODE_QUERY_LEN = 1 + MAX_SPECULATIVE_TOKENS

#: Micro-batches (microbatching.num_ubatches): DBO uses 2; vLLM's ubatch code
#: builds per-micro-batch lists and loops.
MAX_UBATCHES = 64

#: Workload steps times DP ranks (``--steps`` at a ``--ranks`` size, or a
#: trace's lines times its ranks): each is one sync per policy to simulate,
#: and each is held in memory with up to max_num_seqs query lengths (a
#: built-in workload's rank has at most 257). The default 200 steps at DP 16
#: is 3,200.
MAX_RANK_STEPS = 2**16

#: Requests (query lengths) one workload holds in all, about 8 bytes each.
MAX_WORKLOAD_REQUESTS = 2**24

#: A trace file's size, read whole before it is parsed: a request takes two
#: or three characters ("1, "), so this leaves room for MAX_WORKLOAD_REQUESTS.
MAX_TRACE_BYTES = 2**27


def int_problem(value: object, low: int, high: int) -> str | None:
    """What is wrong with ``value`` as an integer in ``low..high``, or None.

    The answer completes a sentence that starts with the field's name:
    ``"max_num_seqs: " + "must be an integer >= 1, got 0"``. ``bool`` is
    refused although Python counts it an int: ``true`` is never a count.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"must be an integer >= {low}, got {shown(value)}"
    if value > high:
        return f"must be at most {high:,}, got {shown(value)}"
    return None


def shown(value: object) -> str:
    """``value`` for a one-line message: a repr cut to a few dozen characters.

    A 5,000-digit integer has no repr at all (Python refuses to print it), a
    list nested a million deep has none within the recursion limit, and a
    list of a million sizes would not make one line.
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**64:
        return f"an integer of {value.bit_length()} bits"
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxstring = _SHORT.maxother = 40


def read_bounded_text(path: Path, most: int, kind: str, error: type[UsageError]) -> str:
    """The UTF-8 text of the ``kind`` at ``path``, or ``error`` in one line.

    The size is checked before the file is read, so one far past ``most`` is
    refused without being read into memory.
    """
    try:
        size = path.stat().st_size
        if size > most:
            raise error(f"{path}: {size:,} bytes; a {kind} is at most {most:,}")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {kind}") from None
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte {exc.start}); a {kind} is UTF-8"
        ) from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
