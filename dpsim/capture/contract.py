"""A manager that obeys only the documented dispatch contract.

vLLM's ``CudaGraphManager`` builds its table by fixed rules (sizes x LoRA
cases, decode twins, rounding to the decode length, microbatched twins...).
DP-sync code must be correct for *any* table those rules could produce in a
future release, not just today's, so this manager dispatches over an explicit,
arbitrary list of descriptors while keeping to what the manager promises its
callers:

    the smallest compatible captured descriptor that covers the request,
    else an eager (``CUDAGraphMode.NONE``) descriptor carrying the request's
    own token count.

"Compatible" is the rule ``_is_compatible`` documents, restated here from its
contract (not its code): a descriptor's ``uniform_token_count`` of None
serves any batch, otherwise it must equal the batch's; ``num_reqs`` None means
no request padding, otherwise it must be at least the batch's;
``max_query_len`` None does not constrain, otherwise the batch must report a
bound and stay within it; tokens must be at least the batch's; LoRA counts and
microbatch counts must be equal. Ties between descriptors of the same size go
to the one listed first, so a table's order is its priority.

Descriptors are instances of the target's own ``BatchExecutionDescriptor``;
only fields that version's class has are set or read, so one contract manager
serves every version from 0.18 on. Where the real manager and this one
disagree, the difference is a finding (see ``tests/test_capture.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import strategies as st

from dpsim.records.policy import CudagraphMode

__all__ = [
    "ContractManager",
    "descriptor_fields",
    "descriptor_tables",
    "is_compatible",
    "make_descriptor",
]


def descriptor_fields(descriptor_class: type) -> frozenset[str]:
    """The field names a version's ``BatchExecutionDescriptor`` has."""
    return frozenset(f.name for f in dataclasses.fields(descriptor_class))


def make_descriptor(descriptor_class: type, **values: Any) -> Any:
    """Build a descriptor, dropping fields this version's class lacks.

    Dropping is only allowed for values that mean "absent" (None, 0 LoRAs,
    1 microbatch); anything else the class cannot hold is an error, since
    silently losing it would describe a different graph.
    """
    names = descriptor_fields(descriptor_class)
    neutral: dict[str, Any] = {
        "uniform_token_count": None,
        "max_query_len": None,
        "num_active_loras": 0,
        "num_ubatches": 1,
    }
    kept: dict[str, Any] = {}
    for name, value in values.items():
        if name in names:
            kept[name] = value
        elif name not in neutral or value != neutral[name]:
            raise ValueError(
                f"{descriptor_class.__name__} has no field {name!r} "
                f"(cannot hold {name}={value!r})"
            )
    return descriptor_class(**kept)


def is_compatible(
    desc: Any,
    num_reqs: int,
    num_tokens: int,
    uniform_token_count: int | None,
    num_active_loras: int = 0,
    max_query_len: int | None = None,
    num_ubatches: int = 1,
) -> bool:
    """Whether a captured ``desc`` can serve the batch (the documented rule)."""
    uniform = getattr(desc, "uniform_token_count", None)
    if uniform is not None and uniform != uniform_token_count:
        return False
    bound = getattr(desc, "max_query_len", None)
    # A graph built for bounded queries must not take a batch whose caller
    # does not know its longest query (that batch may hold a prefill).
    if bound is not None and (max_query_len is None or max_query_len > bound):
        return False
    if desc.num_reqs is not None and desc.num_reqs < num_reqs:
        return False
    if desc.num_tokens < num_tokens:
        return False
    if getattr(desc, "num_active_loras", 0) != num_active_loras:
        return False
    return getattr(desc, "num_ubatches", 1) == num_ubatches


class ContractManager:
    """Dispatch over an explicit descriptor table, by the contract alone.

    ``dispatch`` accepts every version's call shape: the first three
    arguments positionally, the rest as keywords or absent. Like the real
    manager it serves nothing until graphs are captured (``graphs_captured``),
    and it exposes ``_capture_descs`` so the table view renders it too.
    """

    def __init__(
        self,
        descriptors: Iterable[Any],
        *,
        mode_enum: type,
        descriptor_class: type | None = None,
        graphs_captured: bool = True,
    ) -> None:
        self.descriptors: tuple[Any, ...] = tuple(descriptors)
        self.mode_enum = mode_enum
        if descriptor_class is None:
            if not self.descriptors:
                raise ValueError("an empty table needs descriptor_class")
            descriptor_class = type(self.descriptors[0])
        self.descriptor_class = descriptor_class
        none = mode_enum[CudagraphMode.NONE]  # type: ignore[index]
        eager = [d for d in self.descriptors if d.cg_mode == none]
        if eager:
            raise ValueError(f"a captured table holds no eager descriptor: {eager[0]}")
        self._graphs_captured = graphs_captured
        by_mode: dict[Any, list[Any]] = {}
        for desc in self.descriptors:
            by_mode.setdefault(desc.cg_mode, []).append(desc)
        # Same shape as the real manager's: per mode, largest first.
        self._capture_descs = {
            mode: sorted(descs, key=lambda d: d.num_tokens, reverse=True)
            for mode, descs in by_mode.items()
        }

    def dispatch(
        self,
        num_reqs: int,
        num_tokens: int,
        uniform_token_count: int | None,
        num_active_loras: int = 0,
        max_query_len: int | None = None,
        num_ubatches: int = 1,
    ) -> Any:
        if self._graphs_captured and num_tokens > 0:
            best = None
            for desc in self.descriptors:
                if is_compatible(
                    desc,
                    num_reqs,
                    num_tokens,
                    uniform_token_count,
                    num_active_loras,
                    max_query_len,
                    num_ubatches,
                ) and (best is None or desc.num_tokens < best.num_tokens):
                    best = desc
            if best is not None:
                return best
        return make_descriptor(
            self.descriptor_class,
            cg_mode=self.mode_enum[CudagraphMode.NONE],  # type: ignore[index]
            num_tokens=num_tokens,
            num_reqs=num_reqs,
            num_active_loras=num_active_loras,
            num_ubatches=num_ubatches,
        )

    def __repr__(self) -> str:
        return f"ContractManager({len(self.descriptors)} descriptors)"


@st.composite
def _descriptor(
    draw: st.DrawFn,
    descriptor_class: type,
    mode_enum: type,
    max_tokens: int,
    lora_cases: Sequence[int],
    ubatch_counts: Sequence[int],
) -> Any:
    names = descriptor_fields(descriptor_class)
    mode = draw(st.sampled_from((CudagraphMode.FULL, CudagraphMode.PIECEWISE)))
    num_tokens = draw(st.integers(1, max_tokens))
    values: dict[str, Any] = {
        "cg_mode": mode_enum[mode],  # type: ignore[index]
        "num_tokens": num_tokens,
        # Request padding above, at or below the token count, or none: the
        # contract allows them all; real tables only ever have <= tokens.
        "num_reqs": draw(st.one_of(st.none(), st.integers(1, max_tokens))),
    }
    if "uniform_token_count" in names:
        values["uniform_token_count"] = draw(st.one_of(st.none(), st.integers(1, 8)))
    if "max_query_len" in names:
        values["max_query_len"] = draw(st.one_of(st.none(), st.integers(1, 16)))
    if "num_active_loras" in names:
        values["num_active_loras"] = draw(st.sampled_from(tuple(lora_cases)))
    if "num_ubatches" in names:
        values["num_ubatches"] = draw(st.sampled_from(tuple(ubatch_counts)))
    return descriptor_class(**values)


def descriptor_tables(
    descriptor_class: type,
    mode_enum: type,
    *,
    max_tokens: int = 512,
    max_size: int = 12,
    lora_cases: Sequence[int] = (0, 1, 2, 4),
    ubatch_counts: Sequence[int] = (1, 2),
) -> st.SearchStrategy[tuple[Any, ...]]:
    """Arbitrary captured tables of a version's own descriptors.

    Unique descriptors in any order (order is priority among equal sizes);
    possibly empty, which is where shrinking heads. Only fields the class has
    are drawn, so a 0.20 descriptor never grows a LoRA count.
    """
    return st.lists(
        _descriptor(
            descriptor_class,
            mode_enum,
            max_tokens,
            tuple(lora_cases) or (0,),
            tuple(ubatch_counts) or (1,),
        ),
        max_size=max_size,
        unique=True,
    ).map(tuple)
