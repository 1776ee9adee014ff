"""Policy files: reading a capture policy from JSON or TOML, and writing it back.

The policy itself (:class:`~dpsim.records.policy.CapturePolicy`) is plain
data; this module is the edge where it meets files: parsing, the file's own
refusals (size, encoding, syntax) naming the file, the rule that a file
describes a deployment vLLM would accept (:func:`check_ceiling`), and the
JSON and TOML text a saved policy diffs cleanly in.

File format
-----------

JSON or TOML (chosen by the file suffix: ``.json``, ``.toml``); the same keys
either way. Only ``capture_sizes`` is required; every other key has the
default shown. TOML has no null: leave a key out to get its default.

.. code-block:: toml

    # Capture sizes: token counts for which graphs are captured, any order,
    # no duplicates, each >= 1. The string "default" asks for vLLM's default
    # grid (1, 2, 4, then steps of 8 below 256, then steps of 16) up to
    # max_capture_size, or, when that is absent, up to
    # min(max_num_seqs * decode_query_len * 2, 512) as vLLM derives it.
    capture_sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    # NONE | PIECEWISE | FULL | FULL_DECODE_ONLY | FULL_AND_PIECEWISE
    cudagraph_mode = "FULL_AND_PIECEWISE"
    max_num_seqs = 256
    # 1 + number of speculative tokens.
    decode_query_len = 1
    # Active-LoRA counts captured (vLLM 0.24+). Absent / null: no LoRA.
    lora_capture_cases = [0, 1, 2, 4, 8]
    # Varlen decode graphs (vLLM 0.28+).
    varlen_decode = false
    # compilation_config.max_cudagraph_capture_size. Absent / null: the
    # largest capture size, as vLLM derives it. Given beside a list of
    # sizes it must equal the largest (vLLM refuses anything else); beside
    # "default" it is where the grid stops.
    max_capture_size = 64
    # An encoder-decoder model (model_config.is_encoder_decoder): the V1
    # runner then replays no FULL graph on a step with encoder inputs.
    # Written only when true.
    encoder_decoder = false

    # Microbatching / DBO (vLLM 0.30+). Absent / null: off.
    [microbatching]
    num_ubatches = 2
    decode_token_threshold = 32
    prefill_token_threshold = 512

    # The drafter's own table, for speculative decoding. Same keys as above
    # (a drafter has no drafter). Absent / null: no drafter.
    [drafter]
    capture_sizes = [1, 2, 4, 8]
    cudagraph_mode = "FULL_DECODE_ONLY"
    max_num_seqs = 256
    decode_query_len = 1

The JSON form is the same object: ``{"capture_sizes": [1, 2, 4], ...,
"microbatching": {"num_ubatches": 2, ...}, "drafter": {...}}``.
:func:`to_json` writes every key, in the order above, with ``null`` for
absent optionals, so a saved policy diffs cleanly; ``encoder_decoder`` only
when true (after ``drafter``), so files from before it read and write as
they did.

The TOML writer is hand-written rather than ``tomli-w``: a policy holds only
integers, booleans, strings, flat lists and two tables, and ``tomli-w``
writes every list one entry per line (a default grid is a hundred lines),
where ours keeps each list on one line as the JSON form does, and would be a
dependency for these twenty lines.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpsim.limits import MAX_POLICY_BYTES, read_bounded_text
from dpsim.records.policy import CapturePolicy, PolicyError

__all__ = ["check_ceiling", "load_policy", "to_json", "to_toml"]


def load_policy(path: str | Path) -> CapturePolicy:
    """Read a policy from a ``.json`` or ``.toml`` file.

    Every failure (missing file, bad syntax, unknown key, invalid value) is a
    :class:`~dpsim.records.policy.PolicyError` whose one-line message starts
    with the file name. A file describes a deployment, so it is also held to
    vLLM's own consistency rule for max_capture_size (:func:`check_ceiling`).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise PolicyError(
            f"{path}: unknown policy file type {suffix!r}; use .json or .toml"
        )
    text = read_bounded_text(path, MAX_POLICY_BYTES, "policy file", PolicyError)
    try:
        data = json.loads(text) if suffix == ".json" else tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:
        # The parsers recurse once per nesting level; a policy nests two deep.
        raise PolicyError(f"{path}: nested too deeply to be a policy") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise PolicyError(f"{path}: invalid {suffix[1:].upper()}: {exc}") from None
    try:
        policy = CapturePolicy.from_dict(data)
        check_ceiling(policy)
    except PolicyError as exc:
        raise PolicyError(f"{path}: {exc}") from None
    except TypeError as exc:  # e.g. a microbatching key given a list
        raise PolicyError(f"{path}: {exc}") from None
    return policy


def check_ceiling(policy: CapturePolicy) -> None:
    """Refuse a max_capture_size other than the largest capture size, as vLLM does.

    vLLM refuses a configured max_cudagraph_capture_size that differs from
    the largest configured capture size ("customized
    max_cudagraph_capture_size should be consistent with the max value of
    cudagraph_capture_sizes", ``VllmConfig``), and
    ``CompilationConfig.post_init_cudagraph_sizes`` in
    vllm/config/compilation.py asserts the two equal. Smaller would drop
    graphs the sizes ask for; larger would leave batches above the largest
    graph inside the graph range. Policy files describe deployments, so
    they are held to it; generated contract-profile policies are not, as
    they probe the manager beyond what vLLM's config builds.
    """
    for where, table in (("", policy), ("drafter: ", policy.drafter)):
        if table is None or table.max_capture_size is None or not table.capture_sizes:
            continue
        largest = max(table.capture_sizes)
        if table.max_capture_size != largest:
            raise PolicyError(
                f"{where}max_capture_size {table.max_capture_size} differs from the "
                f"largest capture size {largest}, which vLLM refuses "
                "(CompilationConfig.post_init_cudagraph_sizes, "
                "vllm/config/compilation.py); leave it out or set it to "
                f"{largest}"
            )


def to_json(policy: CapturePolicy) -> str:
    """The JSON form, one key per line and each list on one line."""
    return _json(policy.to_dict()) + "\n"


def to_toml(policy: CapturePolicy) -> str:
    """The TOML form: absent optionals are left out (TOML has no null)."""
    return _toml(policy.to_dict())


def _json(value: Any, indent: str = "") -> str:
    if not isinstance(value, Mapping):
        return json.dumps(value)
    inner = indent + "  "
    items = [f"{inner}{json.dumps(k)}: {_json(v, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _toml(data: Mapping[str, Any], prefix: str = "") -> str:
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append((f"{prefix}{key}", value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n"
    for name, table in tables:
        text += f"\n[{name}]\n" + _toml(table, prefix=f"{name}.")
    return text
