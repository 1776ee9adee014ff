"""A version's sync API around a stand-in sync function, for adapter tests
that watch how (or whether) the adapter calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpsim.targets.adapters import DISPATCH_AND_SYNC, SyncAPI


def sync_api(parameters: tuple[str, ...], sync: Callable[..., Any]) -> SyncAPI:
    """A dispatch-and-sync entry taking ``parameters``, whose calls go to ``sync``."""
    return SyncAPI(
        entry=DISPATCH_AND_SYNC,
        parameters=parameters,
        reuse_parameter="dp_sync" if "dp_sync" in parameters else None,
        agreement_fields=(),
        descriptor_fields=(),
        collective="none found",
        tensor_rows=None,
        _sync=sync,
        _descriptor_class=object,
        _none_mode=None,
    )
