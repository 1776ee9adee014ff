"""What every runner's adapter offers its callers, whichever runner it adapts.

The V2 adapter (:class:`dpsim.targets.adapters.SyncAPI`) and the V1 one
(:class:`dpsim.targets.v1.api.V1API`) both satisfy :class:`TargetAPI`, so
scenarios, properties and reports call a target without asking which runner
it is. The first four parameters of ``call`` are positional: V2 calls the
first its capture manager, V1 its dispatcher.
"""

from __future__ import annotations

from typing import Any, Protocol

from dpsim.records.case import SyncInputs
from dpsim.records.sync import Agreement, Descriptor


class TargetAPI(Protocol):
    """How to call one loaded sync, and what it offers."""

    @property
    def entry(self) -> str: ...
    @property
    def parameters(self) -> tuple[str, ...]: ...
    @property
    def reuse_parameter(self) -> str | None: ...
    @property
    def agreement_fields(self) -> tuple[str, ...]: ...
    @property
    def descriptor_fields(self) -> tuple[str, ...]: ...
    @property
    def collective(self) -> str: ...
    @property
    def tensor_rows(self) -> int | None: ...
    @property
    def features(self) -> tuple[str, ...]: ...

    def has(self, feature: str) -> bool: ...

    def unsupported_input(self, inputs: SyncInputs) -> str | None: ...

    def call(
        self,
        table: Any,
        inputs: SyncInputs,
        dp_size: int,
        dp_rank: int,
        /,
        *,
        parallel_config: Any = None,
        reuse: Any = None,
    ) -> tuple[Any, Any]: ...

    def describe(self, native: Any) -> Descriptor: ...

    def agreement(self, native: Any) -> Agreement | None: ...
