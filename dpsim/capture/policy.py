"""Capture policies: what an operator decides about CUDA graphs, as data.

A policy is the handful of settings from which vLLM's ``CudaGraphManager``
builds its capture table (capture sizes, cudagraph mode, max_num_seqs, decode
query length, LoRA cases, varlen decode, max capture size, microbatching), plus
an optional drafter policy for speculative decoding, whose manager gets its
own table. It is validated on construction, so a nonsensical policy is refused
in one clear line instead of producing a silently empty or surprising table
further down, and it is plain data (JSON/TOML) so that counterexample files
and ``dpsim policy`` can carry it. A policy never encodes how vLLM turns these
settings into descriptors: that is the loaded version's own code.

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
:meth:`CapturePolicy.to_dict` writes every key, in the order above, with
``null`` for absent optionals, so a saved policy diffs cleanly.

Numbers are bounded where dpsim's memory or time grows with them (see
:mod:`dpsim.limits` for each reason): capture sizes and max_capture_size at
most 16,384, at most 2,048 sizes and 16 LoRA cases, sizes times LoRA cases at
most 4,096, max_num_seqs at most 16,384, decode_query_len at most 65,
num_ubatches at most 64, other counts below 2**31.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dpsim.errors import UsageError
from dpsim.limits import (
    MAX_CAPTURE_ENTRIES,
    MAX_CAPTURE_SIZE,
    MAX_DECODE_QUERY_LEN,
    MAX_GRAPHS_PER_MODE,
    MAX_INT,
    MAX_LORA_CASES,
    MAX_NUM_SEQS,
    MAX_POLICY_BYTES,
    MAX_RANKS,
    MAX_UBATCHES,
    int_problem,
    shown,
)
from dpsim.targets.manager import CUDAGRAPH_MODE_NAMES, ManagerConfig, Microbatching

__all__ = [
    "ALL_CAPABILITIES",
    "CUDAGRAPH_MODE_NAMES",
    "NO_CAPABILITIES",
    "Capabilities",
    "CapturePolicy",
    "Microbatching",
    "PolicyError",
    "check_ceiling",
    "load_policy",
    "vllm_default_max_capture_size",
    "vllm_default_sizes",
]


class PolicyError(UsageError, ValueError):
    """A policy that cannot describe any real deployment; the message is one line.

    A :class:`~dpsim.errors.UsageError`, so the CLI prints it alone (exit 2).
    """


# vLLM's default ceiling off Blackwell; Blackwell uses 1024. A policy that
# wants 1024 can say so with max_capture_size.
_VLLM_DEFAULT_MAX_GRAPH_SIZE = 512


def vllm_default_sizes(max_capture_size: int) -> tuple[int, ...]:
    """vLLM's default capture grid up to ``max_capture_size``.

    1, 2, 4, then every 8 below 256, then every 16 from 256: the grid vLLM's
    config builds when the user gives no sizes (its extra decode-multiple sizes
    for speculative decoding in 0.29+ are not added; list them explicitly).
    """
    sizes = [n for n in (1, 2, 4) if n <= max_capture_size]
    sizes += range(8, min(max_capture_size + 1, 256), 8)
    sizes += range(256, max_capture_size + 1, 16)
    return tuple(sizes)


def vllm_default_max_capture_size(max_num_seqs: int, decode_query_len: int) -> int:
    """The ceiling vLLM derives when none is configured."""
    return min(max_num_seqs * decode_query_len * 2, _VLLM_DEFAULT_MAX_GRAPH_SIZE)


@dataclass(frozen=True)
class Capabilities:
    """Which capture-table features a vLLM version has.

    Generated policies only use what the loaded version supports: a LoRA case
    list given to 0.20 would be silently dropped by the manager's constructor,
    and a test over such a policy would test nothing.
    """

    has_lora: bool = True
    has_varlen_decode: bool = True
    has_microbatching: bool = True

    @classmethod
    def of(
        cls, manager_class: type, descriptor_class: type | None = None
    ) -> Capabilities:
        """Read a version's capabilities off its own manager (and descriptor)."""
        from dpsim.targets.manager import manager_parameters

        params = manager_parameters(manager_class)
        desc_fields: set[str] = set()
        if descriptor_class is not None:
            desc_fields = {f.name for f in fields(descriptor_class)}
        return cls(
            has_lora="lora_capture_cases" in params,
            has_varlen_decode="varlen_decode" in params,
            has_microbatching="ubatch_runner" in params
            or "num_ubatches" in desc_fields,
        )

    @classmethod
    def of_target(cls, target: Any) -> Capabilities:
        """Capabilities of a loaded target (``dpsim.targets.load_target``)."""
        return cls.of(target.manager_class, target.BatchExecutionDescriptor)


ALL_CAPABILITIES = Capabilities()
NO_CAPABILITIES = Capabilities(
    has_lora=False, has_varlen_decode=False, has_microbatching=False
)


@dataclass(frozen=True)
class CapturePolicy:
    """One capture table's settings, and optionally the drafter's.

    Lists given as lists are stored as tuples (so a policy is hashable and
    immutable); ``capture_sizes`` and ``lora_capture_cases`` are stored sorted,
    since vLLM sorts them anyway and a canonical order keeps files stable.
    """

    capture_sizes: tuple[int, ...]
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    max_num_seqs: int = 256
    decode_query_len: int = 1
    lora_capture_cases: tuple[int, ...] | None = None
    varlen_decode: bool = False
    max_capture_size: int | None = None
    microbatching: Microbatching | None = None
    drafter: CapturePolicy | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        def fail(message: str) -> None:
            raise PolicyError(message)

        def check(name: str, value: object, low: int, high: int) -> None:
            problem = int_problem(value, low, high)
            if problem is not None:
                fail(f"{name}: {problem}")

        def check_list(name: str, items: object, most: int) -> list[Any]:
            if isinstance(items, str) or not isinstance(items, list | tuple):
                fail(f"{name}: expected a list of integers, got {shown(items)}")
            assert isinstance(items, list | tuple)
            if len(items) > most:
                fail(f"{name}: {len(items):,} entries; at most {most:,} allowed")
            return list(items)

        mode = self.cudagraph_mode
        if not isinstance(mode, str) or mode not in CUDAGRAPH_MODE_NAMES:
            fail(
                f"cudagraph_mode: unknown mode {shown(mode)}; "
                f"expected one of {', '.join(CUDAGRAPH_MODE_NAMES)}"
            )
        check("max_num_seqs", self.max_num_seqs, 1, MAX_NUM_SEQS)
        check("decode_query_len", self.decode_query_len, 1, MAX_DECODE_QUERY_LEN)
        if self.max_capture_size is not None:
            problem = int_problem(self.max_capture_size, 1, MAX_CAPTURE_SIZE)
            if problem is not None:
                fail(
                    f"max_capture_size: {problem} "
                    "(leave it out for the largest capture size)"
                )
        sizes = check_list("capture_sizes", self.capture_sizes, MAX_CAPTURE_ENTRIES)
        for size in sizes:
            problem = int_problem(size, 1, MAX_CAPTURE_SIZE)
            if problem is not None:
                fail(f"capture_sizes: every size {problem}")
        if len(set(sizes)) != len(sizes):
            dup = next(s for s in sizes if sizes.count(s) > 1)
            fail(f"capture_sizes: size {dup} is listed twice")
        if not sizes and mode != "NONE":
            fail(
                f"capture_sizes: empty, but cudagraph_mode {mode} captures graphs "
                "(use cudagraph_mode NONE for an eager-only policy)"
            )
        object.__setattr__(self, "capture_sizes", tuple(sorted(sizes)))
        if not isinstance(self.varlen_decode, bool):
            fail(
                f"varlen_decode: must be true or false, got {shown(self.varlen_decode)}"
            )
        cases: list[Any] = [0]  # what the manager assumes without LoRA
        if self.lora_capture_cases is not None:
            cases = check_list(
                "lora_capture_cases", self.lora_capture_cases, MAX_LORA_CASES
            )
            if not cases:
                # The manager reads [] as [0]; say "no LoRA" one way only.
                fail("lora_capture_cases: empty; leave it out (or null) for no LoRA")
            for case in cases:
                problem = int_problem(case, 0, MAX_INT)
                if problem is not None:
                    fail(f"lora_capture_cases: every case {problem}")
            if len(set(cases)) != len(cases):
                dup = next(c for c in cases if cases.count(c) > 1)
                fail(f"lora_capture_cases: case {dup} is listed twice")
            object.__setattr__(self, "lora_capture_cases", tuple(sorted(cases)))
        graphs = len(sizes) * len(cases)
        if graphs > MAX_GRAPHS_PER_MODE:
            fail(
                f"capture_sizes x lora_capture_cases: {graphs:,} graphs per mode; "
                f"at most {MAX_GRAPHS_PER_MODE:,} (the manager's build time grows "
                "with the square of it)"
            )
        mb = self.microbatching
        if mb is not None:
            if not isinstance(mb, Microbatching):
                fail(f"microbatching: expected a table, got {shown(mb)}")
            check("microbatching.num_ubatches", mb.num_ubatches, 2, MAX_UBATCHES)
            for name in ("decode_token_threshold", "prefill_token_threshold"):
                check(f"microbatching.{name}", getattr(mb, name), 0, MAX_INT)
        if self.drafter is not None:
            if not isinstance(self.drafter, CapturePolicy):
                fail(f"drafter: expected a policy table, got {shown(self.drafter)}")
            if self.drafter.drafter is not None:
                fail("drafter.drafter: a drafter has no drafter of its own")

    # -- what the policy means to a manager -------------------------------

    @property
    def effective_max_capture_size(self) -> int:
        """``max_capture_size``, or the largest size as vLLM derives it."""
        if self.max_capture_size is not None:
            return self.max_capture_size
        return max(self.capture_sizes, default=0)

    def uses(self) -> Capabilities:
        """The features this policy needs from a version."""
        return Capabilities(
            has_lora=self.lora_capture_cases not in (None, (0,)),
            has_varlen_decode=self.varlen_decode,
            has_microbatching=self.microbatching is not None,
        )

    def check_supported(self, capabilities: Capabilities) -> None:
        """Refuse a policy whose features the version lacks (incl. the drafter's).

        A manager without, e.g., ``lora_capture_cases`` would silently build a
        table without them; better to say so than to test the wrong table.
        """
        for who, policy in (("", self), ("drafter: ", self.drafter)):
            if policy is None:
                continue
            needed = policy.uses()
            for feature, label in (
                ("has_lora", "lora_capture_cases"),
                ("has_varlen_decode", "varlen_decode"),
                ("has_microbatching", "microbatching"),
            ):
                if getattr(needed, feature) and not getattr(capabilities, feature):
                    raise PolicyError(
                        f"{who}{label} is set but this vLLM version does not support it"
                    )

    def manager_config(self, dp_size: int = 2, *, tp_size: int = 1) -> ManagerConfig:
        """The target's manager configuration for a DP deployment of ``dp_size``."""
        problem = int_problem(dp_size, 1, MAX_RANKS)
        if problem is not None:
            raise PolicyError(f"dp_size: {problem}")
        return ManagerConfig(
            capture_sizes=self.capture_sizes,
            cudagraph_mode=self.cudagraph_mode,
            max_num_seqs=self.max_num_seqs,
            decode_query_len=self.decode_query_len,
            lora_capture_cases=self.lora_capture_cases,
            varlen_decode=self.varlen_decode,
            max_capture_size=self.max_capture_size,
            microbatching=self.microbatching,
            data_parallel_size=dp_size,
            tensor_parallel_size=tp_size,
        )

    def drafter_manager_config(
        self, dp_size: int = 2, *, tp_size: int = 1
    ) -> ManagerConfig | None:
        """The drafter's manager configuration, or None without a drafter."""
        if self.drafter is None:
            return None
        return self.drafter.manager_config(dp_size, tp_size=tp_size)

    # -- serialisation ----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every key, in file-format order, with None for absent optionals."""
        return {
            "capture_sizes": list(self.capture_sizes),
            "cudagraph_mode": self.cudagraph_mode,
            "max_num_seqs": self.max_num_seqs,
            "decode_query_len": self.decode_query_len,
            "lora_capture_cases": (
                list(self.lora_capture_cases)
                if self.lora_capture_cases is not None
                else None
            ),
            "varlen_decode": self.varlen_decode,
            "max_capture_size": self.max_capture_size,
            "microbatching": (
                {
                    "num_ubatches": self.microbatching.num_ubatches,
                    "decode_token_threshold": self.microbatching.decode_token_threshold,
                    "prefill_token_threshold": (
                        self.microbatching.prefill_token_threshold
                    ),
                }
                if self.microbatching is not None
                else None
            ),
            "drafter": self.drafter.to_dict() if self.drafter is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, _where: str = "") -> CapturePolicy:
        """Build and validate a policy from the file-format mapping."""
        if not isinstance(data, Mapping):
            raise PolicyError(
                f"{_where}expected a table of policy keys, got {shown(data)}"
            )
        unknown = [key for key in data if key not in _KEYS]
        if unknown:
            raise PolicyError(
                f"{_where}unknown key {shown(unknown[0])} (known keys: {', '.join(_KEYS)})"
            )
        if "capture_sizes" not in data:
            raise PolicyError(f"{_where}missing required key 'capture_sizes'")
        kwargs: dict[str, Any] = {
            key: data[key]
            for key in _SCALAR_KEYS
            if key in data and data[key] is not None
        }
        for key in ("lora_capture_cases", "max_capture_size"):
            if key in data:
                kwargs[key] = data[key]
        sizes = data["capture_sizes"]
        if sizes == "default":
            sizes = _default_grid(kwargs)
        kwargs["capture_sizes"] = sizes
        mb = data.get("microbatching")
        if mb is not None:
            if not isinstance(mb, Mapping):
                raise PolicyError(
                    f"{_where}microbatching: expected a table, got {shown(mb)}"
                )
            unknown = [key for key in mb if key not in _MB_KEYS]
            if unknown:
                raise PolicyError(
                    f"{_where}microbatching: unknown key {shown(unknown[0])} "
                    f"(known keys: {', '.join(_MB_KEYS)})"
                )
            kwargs["microbatching"] = Microbatching(**mb)
        drafter = data.get("drafter")
        if drafter is not None:
            if _where:
                # Said before reading further: a file could nest drafters
                # hundreds deep, one recursion and one prefix each.
                raise PolicyError(
                    "drafter.drafter: a drafter has no drafter of its own"
                )
            kwargs["drafter"] = cls.from_dict(drafter, _where=f"{_where}drafter: ")
        try:
            return cls(**kwargs)
        except PolicyError as exc:
            if _where and not str(exc).startswith(_where):
                raise PolicyError(f"{_where}{exc}") from None
            raise

    def to_json(self) -> str:
        """The JSON form, one key per line and each list on one line."""
        return _to_json(self.to_dict()) + "\n"

    def to_toml(self) -> str:
        """The TOML form: absent optionals are left out (TOML has no null)."""
        return _to_toml(self.to_dict())


def _default_grid(kwargs: dict[str, Any]) -> list[int]:
    """vLLM's default grid for the policy keys in ``kwargs``, as vLLM sizes it.

    A given max_capture_size becomes the grid's largest size, as vLLM
    truncates its ceiling to the grid it built (``VllmConfig``, with a
    warning). An invalid ceiling gives no grid: validation then names it.
    """
    ceiling = kwargs.get("max_capture_size")
    if ceiling is None:
        max_num_seqs = kwargs.get("max_num_seqs", 256)
        q = kwargs.get("decode_query_len", 1)
        if (
            int_problem(max_num_seqs, 1, MAX_NUM_SEQS) is not None
            or int_problem(q, 1, MAX_DECODE_QUERY_LEN) is not None
        ):
            return []
        ceiling = vllm_default_max_capture_size(max_num_seqs, q)
    if int_problem(ceiling, 1, MAX_CAPTURE_SIZE) is not None:
        return []
    grid = list(vllm_default_sizes(ceiling))
    if kwargs.get("max_capture_size") is not None:
        kwargs["max_capture_size"] = grid[-1]
    return grid


_KEYS = tuple(f.name for f in fields(CapturePolicy))
_SCALAR_KEYS = ("cudagraph_mode", "max_num_seqs", "decode_query_len", "varlen_decode")
_MB_KEYS = tuple(f.name for f in fields(Microbatching))


def _to_json(value: Any, indent: str = "") -> str:
    if not isinstance(value, Mapping):
        return json.dumps(value)
    inner = indent + "  "
    items = [f"{inner}{json.dumps(k)}: {_to_json(v, inner)}" for k, v in value.items()]
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


def _to_toml(data: Mapping[str, Any], prefix: str = "") -> str:
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
        text += f"\n[{name}]\n" + _to_toml(table, prefix=f"{name}.")
    return text


def load_policy(path: str | Path) -> CapturePolicy:
    """Read a policy from a ``.json`` or ``.toml`` file.

    Every failure (missing file, bad syntax, unknown key, invalid value) is a
    :class:`PolicyError` whose one-line message starts with the file name.
    A file describes a deployment, so it is also held to vLLM's own
    consistency rule for max_capture_size (:func:`check_ceiling`).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise PolicyError(
            f"{path}: unknown policy file type {suffix!r}; use .json or .toml"
        )
    try:
        size = path.stat().st_size
        if size > MAX_POLICY_BYTES:
            raise PolicyError(
                f"{path}: {size:,} bytes; a policy file is at most {MAX_POLICY_BYTES:,}"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such policy file") from None
    except UnicodeDecodeError as exc:
        raise PolicyError(
            f"{path}: not UTF-8 text (byte {exc.start}); JSON and TOML policies "
            "are UTF-8"
        ) from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror or exc}") from None
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
