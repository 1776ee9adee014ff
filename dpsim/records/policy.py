"""Capture policies: what an operator decides about CUDA graphs, as data.

A policy is the handful of settings from which vLLM's ``CudaGraphManager``
builds its capture table (capture sizes, cudagraph mode, max_num_seqs, decode
query length, LoRA cases, varlen decode, max capture size, microbatching), plus
an optional drafter policy for speculative decoding, whose manager gets its
own table. It is validated on construction, field by field as declared in
:data:`_RULES`, so a nonsensical policy is refused in one clear line instead
of producing a silently empty or surprising table further down. A policy never
encodes how vLLM turns these settings into descriptors: that is the loaded
version's own code. Its mapping form (:meth:`CapturePolicy.to_dict`,
:meth:`CapturePolicy.from_dict`) is what counterexample files carry; policy
files are read and written by :mod:`dpsim.capture.policy_files`.

Numbers are bounded where dpsim's memory or time grows with them (see
:mod:`dpsim.limits` for each reason): capture sizes and max_capture_size at
most 16,384, at most 2,048 sizes and 16 LoRA cases, sizes times LoRA cases at
most 4,096, max_num_seqs at most 16,384, decode_query_len at most 65,
num_ubatches at most 64, other counts below 2**31.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from dpsim.errors import UsageError
from dpsim.fields import (
    Field,
    boolean,
    integer,
    integers,
    member,
    object_schema,
    optional,
    schema_of,
)
from dpsim.limits import (
    MAX_CAPTURE_ENTRIES,
    MAX_CAPTURE_SIZE,
    MAX_DECODE_QUERY_LEN,
    MAX_GRAPHS_PER_MODE,
    MAX_INT,
    MAX_LORA_CASES,
    MAX_NUM_SEQS,
    MAX_RANKS,
    MAX_UBATCHES,
    int_problem,
    shown,
)

__all__ = [
    "ALL_CAPABILITIES",
    "NO_CAPABILITIES",
    "Capabilities",
    "CapturePolicy",
    "CudagraphMode",
    "ManagerConfig",
    "Microbatching",
    "PolicyError",
    "vllm_default_max_capture_size",
    "vllm_default_sizes",
]


class CudagraphMode(StrEnum):
    """vLLM's ``CUDAGraphMode`` member names, in its order.

    The values are vLLM's names, so a mode is the same string in JSON, TOML
    and reports, and it resolves against each loaded version's own enum.
    """

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


class PolicyError(UsageError, ValueError):
    """A policy that cannot describe any real deployment; the message is one line.

    A :class:`~dpsim.errors.UsageError`, so the CLI prints it alone (exit 2).
    """


@dataclass(frozen=True)
class Microbatching:
    """vLLM's microbatching (DBO) settings, for versions that have them (0.30+)."""

    num_ubatches: int = 2
    decode_token_threshold: int = 32
    prefill_token_threshold: int = 512


@dataclass(frozen=True)
class ManagerConfig:
    """What a ``CudaGraphManager`` is built from: one capture table.

    ``cudagraph_mode`` is a ``CUDAGraphMode`` member name, resolved against the
    target's own enum so that every version uses its own.
    """

    capture_sizes: tuple[int, ...]
    cudagraph_mode: str
    max_num_seqs: int
    decode_query_len: int = 1
    lora_capture_cases: tuple[int, ...] | None = None
    varlen_decode: bool = False
    #: ``compilation_config.max_cudagraph_capture_size``; defaults to the
    #: largest capture size, as vLLM derives it.
    max_capture_size: int | None = None
    microbatching: Microbatching | None = None
    data_parallel_size: int = 2
    tensor_parallel_size: int = 1
    #: Whether the model is an encoder-decoder one (``model_config.is_encoder_decoder``).
    encoder_decoder: bool = False
    #: Set on a speculator's one-token draft decode table (0.34+): the
    #: target's decode query length, from which the deployment's config
    #: (and so this table's request sizes) is resolved.
    draft_decode_for: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def effective_max_capture_size(self) -> int:
        if self.max_capture_size is not None:
            return self.max_capture_size
        return max(self.capture_sizes, default=0)


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
        # Imported here, not above: reading a loaded manager is the targets
        # layer's work, and the vocabulary imports without it.
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
    since vLLM sorts them anyway and a canonical order keeps files stable. A
    mode given as its name is stored as the :class:`CudagraphMode`.
    """

    capture_sizes: tuple[int, ...]
    cudagraph_mode: CudagraphMode = CudagraphMode.FULL_AND_PIECEWISE
    max_num_seqs: int = 256
    decode_query_len: int = 1
    lora_capture_cases: tuple[int, ...] | None = None
    varlen_decode: bool = False
    max_capture_size: int | None = None
    microbatching: Microbatching | None = None
    drafter: CapturePolicy | None = None
    #: Whether the deployment serves an encoder-decoder model: the V1 runner
    #: then replays no FULL graph on a step with encoder inputs. Not part of
    #: the capture table itself, so files and outputs carry it only when set.
    encoder_decoder: bool = False

    def __post_init__(self) -> None:
        for rule in _RULES:
            problem = rule(self)
            if problem is not None:
                raise PolicyError(problem)
        set_ = object.__setattr__
        set_(self, "cudagraph_mode", CudagraphMode(self.cudagraph_mode))
        set_(self, "capture_sizes", tuple(sorted(self.capture_sizes)))
        if self.lora_capture_cases is not None:
            set_(self, "lora_capture_cases", tuple(sorted(self.lora_capture_cases)))

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
            encoder_decoder=self.encoder_decoder,
        )

    def drafter_manager_config(
        self, dp_size: int = 2, *, tp_size: int = 1
    ) -> ManagerConfig | None:
        """The drafter's manager configuration, or None without a drafter."""
        if self.drafter is None:
            return None
        return self.drafter.manager_config(dp_size, tp_size=tp_size)

    # -- the mapping form, as files carry it ------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Every key, in file-format order, with None for absent optionals;
        ``encoder_decoder`` only when set (every file before it stays as it was)."""
        data: dict[str, Any] = {
            "capture_sizes": list(self.capture_sizes),
            "cudagraph_mode": self.cudagraph_mode.value,
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
        if self.encoder_decoder:
            data["encoder_decoder"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, _where: str = "") -> CapturePolicy:
        """Build and validate a policy from the file-format mapping."""
        if not isinstance(data, Mapping):
            raise PolicyError(
                f"{_where}expected a table of policy keys, got {shown(data)}"
            )
        _refuse_unknown(data, _KEYS, _where)
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
            _refuse_unknown(mb, _MB_KEYS, f"{_where}microbatching: ")
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


def _refuse_unknown(
    data: Mapping[str, Any], known: tuple[str, ...], where: str
) -> None:
    """Refuse the first key of ``data`` not in ``known``: a typo is never a default."""
    unknown = [key for key in data if key not in known]
    if unknown:
        raise PolicyError(
            f"{where}unknown key {shown(unknown[0])} (known keys: {', '.join(known)})"
        )


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
        if _MAX_NUM_SEQS.problem(max_num_seqs) or _DECODE_QUERY_LEN.problem(q):
            return []
        ceiling = vllm_default_max_capture_size(max_num_seqs, q)
    if _MAX_CAPTURE_SIZE.problem(ceiling):
        return []
    grid = list(vllm_default_sizes(ceiling))
    if kwargs.get("max_capture_size") is not None:
        kwargs["max_capture_size"] = grid[-1]
    return grid


# -- validation, declared field by field, in the order problems are named ----

#: A rule: what is wrong with a policy (or its microbatching table), as the
#: one-line refusal, or None.
_Rule = Callable[[Any], "str | None"]


class _FieldRule:
    """The rule that ``spec`` holds for the policy's attribute of that name.

    A rule object rather than a closure, so that the declared fields can be
    read back (:func:`declared_fields`) to publish the file format.
    """

    __slots__ = ("prefix", "spec")

    def __init__(self, spec: Field, prefix: str = "") -> None:
        self.spec = spec
        self.prefix = prefix

    def __call__(self, policy: Any) -> str | None:
        problem = self.spec.problem(getattr(policy, self.spec.name))
        return None if problem is None else f"{self.prefix}{self.spec.name}: {problem}"


def _sizes_for_mode(policy: CapturePolicy) -> str | None:
    if not policy.capture_sizes and policy.cudagraph_mode != CudagraphMode.NONE:
        return (
            f"capture_sizes: empty, but cudagraph_mode {policy.cudagraph_mode} "
            "captures graphs (use cudagraph_mode NONE for an eager-only policy)"
        )
    return None


def _graphs_per_mode(policy: CapturePolicy) -> str | None:
    cases = policy.lora_capture_cases or (0,)  # the manager assumes 0 without LoRA
    graphs = len(policy.capture_sizes) * len(cases)
    if graphs > MAX_GRAPHS_PER_MODE:
        return (
            f"capture_sizes x lora_capture_cases: {graphs:,} graphs per mode; "
            f"at most {MAX_GRAPHS_PER_MODE:,} (the manager's build time grows "
            "with the square of it)"
        )
    return None


_MICROBATCHING_FIELDS = tuple(
    _FieldRule(spec, "microbatching.")
    for spec in (
        Field("num_ubatches", integer(2, MAX_UBATCHES)),
        Field("decode_token_threshold", integer(0, MAX_INT)),
        Field("prefill_token_threshold", integer(0, MAX_INT)),
    )
)


def _microbatching(policy: CapturePolicy) -> str | None:
    settings = policy.microbatching
    if settings is None:
        return None
    if not isinstance(settings, Microbatching):
        return f"microbatching: expected a table, got {shown(settings)}"
    return next(filter(None, (rule(settings) for rule in _MICROBATCHING_FIELDS)), None)


def _drafter(policy: CapturePolicy) -> str | None:
    drafter = policy.drafter
    if drafter is None:
        return None
    if not isinstance(drafter, CapturePolicy):
        return f"drafter: expected a policy table, got {shown(drafter)}"
    if drafter.drafter is not None:
        return "drafter.drafter: a drafter has no drafter of its own"
    return None


_MAX_NUM_SEQS = Field("max_num_seqs", integer(1, MAX_NUM_SEQS))
_DECODE_QUERY_LEN = Field("decode_query_len", integer(1, MAX_DECODE_QUERY_LEN))
_MAX_CAPTURE_SIZE = Field(
    "max_capture_size",
    optional(integer(1, MAX_CAPTURE_SIZE)),
    " (leave it out for the largest capture size)",
)

_RULES: tuple[_Rule, ...] = (
    _FieldRule(Field("cudagraph_mode", member(CudagraphMode, "mode"))),
    _FieldRule(_MAX_NUM_SEQS),
    _FieldRule(_DECODE_QUERY_LEN),
    _FieldRule(_MAX_CAPTURE_SIZE),
    _FieldRule(
        Field(
            "capture_sizes",
            integers(MAX_CAPTURE_ENTRIES, integer(1, MAX_CAPTURE_SIZE), "size"),
        )
    ),
    _sizes_for_mode,
    _FieldRule(Field("varlen_decode", boolean)),
    _FieldRule(Field("encoder_decoder", boolean)),
    _FieldRule(
        Field(
            "lora_capture_cases",
            optional(
                integers(
                    MAX_LORA_CASES,
                    integer(0, MAX_INT),
                    "case",
                    # The manager reads [] as [0]; say "no LoRA" one way only.
                    empty="empty; leave it out (or null) for no LoRA",
                )
            ),
        )
    ),
    _graphs_per_mode,
    _microbatching,
    _drafter,
)

_KEYS = tuple(f.name for f in fields(CapturePolicy))


def policy_schema(*, drafter: bool = True) -> dict[str, Any]:
    """The JSON Schema of a policy's mapping as :meth:`CapturePolicy.from_dict`
    reads it (a policy file's keys, and a counterexample's ``case.policy``),
    built from the checks its rules run.

    What a schema cannot say is the rules' alone: an empty size list with a
    graph mode, ``max_capture_size`` other than the largest size, sizes times
    LoRA cases above the per-mode bound.
    """
    declared = [rule.spec for rule in _RULES if isinstance(rule, _FieldRule)]
    more: dict[str, dict[str, Any]] = {}
    for spec in declared:
        if spec.name in _SCALAR_KEYS:
            # from_dict reads null as "the default".
            more[spec.name] = {"anyOf": [{"type": "null"}, schema_of(spec.check)]}
        elif spec.name == "capture_sizes":
            more[spec.name] = {"anyOf": [schema_of(spec.check), {"const": "default"}]}
    microbatching = [rule.spec for rule in _MICROBATCHING_FIELDS]
    more["microbatching"] = {
        "anyOf": [{"type": "null"}, object_schema(microbatching)],
    }
    more["drafter"] = (
        {"anyOf": [{"type": "null"}, policy_schema(drafter=False)]}
        if drafter
        else {"type": "null", "description": "a drafter has no drafter of its own"}
    )
    schema = object_schema(declared, ("capture_sizes",), more=more)
    if set(schema["properties"]) != set(_KEYS):
        raise ValueError("a policy key has no schema, or the schema one too many")
    return schema


_SCALAR_KEYS = (
    "cudagraph_mode",
    "max_num_seqs",
    "decode_query_len",
    "varlen_decode",
    "encoder_decoder",
)
_MB_KEYS = tuple(f.name for f in fields(Microbatching))
