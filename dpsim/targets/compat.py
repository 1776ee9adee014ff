"""How a loaded release's DP-sync code fits what dpsim knows how to drive.

dpsim adapts to each release by introspection, so a release it has never
seen usually loads; whether dpsim then drives it *faithfully* depends on
names the release may have added since. :func:`fits` lists, for the V2
runner's sync, each thing dpsim calls, reads or stands in for whose shape
it does not know: a sync or manager parameter it never passes (required: it
cannot call it; optional: left at its default), a ``DPSyncState`` or
descriptor field it neither records nor judges, an all-reduce row beyond
those it knows, a config attribute the manager reads that dpsim's config
view leaves off. An empty list means every such name is one dpsim was
written for; ``dpsim targets`` prints either, and what to do is in the
guide to supporting a new release.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import Any

from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import Agreement, Descriptor
from dpsim.targets.adapters import (
    _OPTIONAL_INPUTS,
    DISPATCH_AND_SYNC,
    REUSE_PARAMETERS,
    dispatch,
)
from dpsim.targets.load import Target
from dpsim.targets.manager import MODELLED_OFF, OFFERED_MANAGER_ARGUMENTS

#: The largest all-reduce tensor whose rows dpsim's oracle and records know
#: (0.33's seven: tokens, mode, uniform length, query bound, requests,
#: microbatching, skip-drafts).
KNOWN_ROWS = 7
_KNOWN_SYNC_PARAMETERS = frozenset(
    {
        "cudagraph_manager",
        "num_reqs",
        "num_tokens",
        "uniform_token_count",
        "desired_batch_desc",
        "dp_size",
        "dp_rank",
        "parallel_config",
        *_OPTIONAL_INPUTS,
        *REUSE_PARAMETERS,
    }
)
_KNOWN_AGREEMENT_FIELDS = frozenset(
    field.name for field in fields(Agreement) if field.name != "reports_max_query_len"
)
_KNOWN_DESCRIPTOR_FIELDS = frozenset(field.name for field in fields(Descriptor))
#: The table whose manager is built to see what its dispatch reads: spec
#: decode, so the decode-graph paths run.
_PROBE_POLICY = CapturePolicy(capture_sizes=(1, 2, 4, 8, 16), decode_query_len=2)


@dataclass(frozen=True)
class Misfit:
    """One name of a release that dpsim was not written for."""

    #: What it belongs to: "sync", "manager", "agreement", "descriptor",
    #: "tensor" or "config".
    part: str
    name: str
    #: What dpsim does with it, in a few words.
    consequence: str

    def describe(self) -> str:
        return f"{self.part} {self.name}: {self.consequence}"

    def to_json(self) -> dict[str, str]:
        return {"part": self.part, "name": self.name, "consequence": self.consequence}


def fits(target: Target) -> tuple[Misfit, ...]:
    """Each name of ``target``'s V2 sync, manager and config reads that dpsim
    does not know, in that order; empty when everything fits."""
    api = target.api
    found: list[Misfit] = []
    entry = getattr(target.dp_utils, api.entry)
    found.extend(_parameters("sync", entry, _KNOWN_SYNC_PARAMETERS, f"{api.entry}()"))
    found.extend(
        _parameters(
            "manager",
            target.manager_class,
            frozenset(OFFERED_MANAGER_ARGUMENTS),
            "CudaGraphManager()",
        )
    )
    found.extend(
        Misfit(
            "agreement", name, "a DPSyncState field dpsim neither records nor judges"
        )
        for name in api.agreement_fields
        if name not in _KNOWN_AGREEMENT_FIELDS
    )
    found.extend(
        Misfit(
            "descriptor", name, "a descriptor field dpsim neither records nor judges"
        )
        for name in api.descriptor_fields
        if name not in _KNOWN_DESCRIPTOR_FIELDS
    )
    if api.tensor_rows is not None and api.tensor_rows > KNOWN_ROWS:
        found.append(
            Misfit(
                "tensor",
                f"{api.tensor_rows} rows",
                f"the all-reduce has rows beyond the {KNOWN_ROWS} dpsim's oracle knows",
            )
        )
    if api.entry == DISPATCH_AND_SYNC:
        found.extend(_config_reads(target))
    return tuple(found)


def _parameters(
    part: str, callable_: Any, known: frozenset[str], owner: str
) -> list[Misfit]:
    misfits = []
    for name, parameter in inspect.signature(callable_).parameters.items():
        if name in known or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        required = parameter.default is parameter.empty
        misfits.append(
            Misfit(
                part,
                name,
                f"a parameter of {owner} dpsim never passes; "
                + (
                    "required, so dpsim cannot call it"
                    if required
                    else "left at its default"
                ),
            )
        )
    return misfits


def _config_reads(target: Target) -> list[Misfit]:
    """The config attributes the manager reads, building and dispatching, that
    dpsim's view does not set (the deepest name read), or why it could not
    be built."""
    try:
        manager = target.build_manager(_PROBE_POLICY.manager_config(2))
        for uniform in (2, None):
            dispatch(manager, 3, 6, uniform)
    except Exception as error:
        return [
            Misfit(
                "manager",
                "build",
                f"building and dispatching a small table failed: "
                f"{type(error).__name__}: {error}",
            )
        ]
    read = sorted(manager.vllm_config.defaulted)
    return [
        Misfit("config", name, "read by the manager; dpsim's config view has it off")
        for name in read
        if name not in MODELLED_OFF
        and not any(other.startswith(f"{name}.") for other in read)
    ]
