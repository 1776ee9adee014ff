"""A case: everything one simulated run needs, as plain frozen data.

A case names its scenario and generator profile, the capture policy, and what
every rank passes to every sync it makes. It holds no target: the same case
runs against any version (that is how a fix is verified), and counterexample
files carry the target separately. What one rank passes to one sync
(:class:`SyncInputs`) lives here too: a case is made of them, and the
adapters hand them to every version's sync.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

from dpsim.errors import UsageError
from dpsim.records.policy import CapturePolicy

#: Generator profiles: what real callers pass, or all the contract allows.
PROFILES = ("caller", "contract")
#: Where each profile draws its capture policies from, for reports: a
#: caller-profile failure is one vLLM can build, a contract one maybe not.
POLICY_SPACES = {
    "caller": "caller profile: policies drawn from what the release's config builds",
    "contract": "contract profile: policies drawn from every valid table",
}
#: How a rank's batch came about; for people reading a counterexample.
BATCH_KINDS = (
    "decode",
    "varlen",
    "mixed",
    "prefill",
    "dummy",
    "idle",
    "profile",
    "batch",
)


@dataclass(frozen=True)
class SyncInputs:
    """What one rank passes to one sync call."""

    num_reqs: int
    num_tokens: int
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    need_eager: bool = False
    num_active_loras: int = 0
    allow_ubatching: bool = False
    uniform_decode: bool = False
    allow_skip_drafts: bool = False
    #: Requests with encoder inputs scheduled this step (the V1 caller's
    #: ``num_encoder_reqs``); no V2 sync takes it.
    num_encoder_reqs: int = 0
    #: Whether the rank's step uses cascade attention (the V1 caller's
    #: ``use_cascade_attn``, worked out from the batch's common prefix); no
    #: V2 sync takes it.
    cascade_attn: bool = False


@dataclass(frozen=True)
class RankBatch(SyncInputs):
    """What one rank passes to one sync (its :class:`SyncInputs`), and why.

    ``kind`` says how the batch came about, for people reading a
    counterexample; the sync never sees it.
    """

    kind: str = "batch"

    def to_dict(self) -> dict[str, Any]:
        """Every field, except ``num_encoder_reqs`` when 0 and ``cascade_attn``
        when false: files from before them (and every V2 case) stay as they
        were."""
        # Written once per sync of every rank: the fields straight from the
        # instance's __dict__ (a frozen dataclass keeps them there), in
        # declaration order, then the omitted ones dropped.
        values = self.__dict__
        data = {name: values[name] for name in _BATCH_FIELD_ORDER}
        for name in _OMITTED_AT_DEFAULT:
            if data[name] == _DEFAULTS[name]:
                del data[name]
        return data

    def __repr__(self) -> str:
        """The dataclass's repr, naming ``cascade_attn`` only when set (as
        :meth:`to_dict` does): a batch without it reads as before the field
        existed, so reprs of cases (and hashes of them) stay comparable."""
        values = self.__dict__
        shown = ", ".join(
            f"{name}={values[name]!r}"
            for name in _BATCH_FIELD_ORDER
            if name != "cascade_attn" or values[name]
        )
        return f"{type(self).__qualname__}({shown})"

    @staticmethod
    def completed(data: dict[str, Any]) -> dict[str, Any]:
        """``data`` (a :meth:`to_dict` mapping) with the fields it leaves out
        at their default put back."""
        missing = _OMITTED_AT_DEFAULT - data.keys()
        if not missing:
            return data
        return {**data, **{name: _DEFAULTS[name] for name in missing}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankBatch:
        unknown = set(data) - _BATCH_FIELD_NAMES
        if unknown:
            raise UsageError(
                f"rank batch has unknown keys: {', '.join(sorted(unknown))}"
            )
        return cls(**data)


_BATCH_FIELDS = fields(RankBatch)
_BATCH_FIELD_NAMES = frozenset(field.name for field in _BATCH_FIELDS)
_BATCH_FIELD_ORDER = tuple(field.name for field in _BATCH_FIELDS)
#: Fields a batch's mapping carries only when set away from their default.
_OMITTED_AT_DEFAULT = frozenset({"num_encoder_reqs", "cascade_attn"})
_DEFAULTS = {field.name: field.default for field in _BATCH_FIELDS}


@dataclass(frozen=True)
class ReuseCall:
    """What a drafter's prefill passes beside the target's agreement it reuses.

    The agreement fixes the padded token count and the uniform count; the
    contract leaves the rest to the caller: ``num_reqs`` "may differ", a
    query-length bound of the drafter's own or none, its own LoRA count.
    """

    num_reqs: int
    max_query_len: int | None = None
    num_active_loras: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_reqs": self.num_reqs,
            "max_query_len": self.max_query_len,
            "num_active_loras": self.num_active_loras,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReuseCall:
        unknown = set(data) - {"num_reqs", "max_query_len", "num_active_loras"}
        if unknown:
            raise UsageError(
                f"reuse call has unknown keys: {', '.join(sorted(unknown))}"
            )
        bound = data.get("max_query_len")
        return cls(
            num_reqs=int(data["num_reqs"]),
            max_query_len=None if bound is None else int(bound),
            num_active_loras=int(data.get("num_active_loras", 0)),
        )


@dataclass(frozen=True)
class Case:
    """One run: ``steps[s][r]`` is what rank ``r`` passes at step ``s``."""

    scenario: str
    profile: str
    policy: CapturePolicy
    steps: tuple[tuple[RankBatch, ...], ...]
    #: Speculative tokens per step (drafter scenario); the drafter runs
    #: ``num_speculative_steps - 1`` decode syncs of its own after its prefill.
    num_speculative_steps: int = 0
    #: Drafter scenario, contract profile: ``reuse_calls[s][r]`` is what rank
    #: ``r``'s drafter prefill passes at step ``s`` beside the reused
    #: agreement. Empty: the prefill passes the target batch's own request
    #: count and LoRA count, and no query bound (0.34+: the target batch's),
    #: as vLLM's drafters do.
    reuse_calls: tuple[tuple[ReuseCall, ...], ...] = ()

    @property
    def dp_size(self) -> int:
        return len(self.steps[0])

    @functools.cached_property
    def shared_steps(self) -> tuple[bool, ...]:
        """Per step, whether every rank passes the same batch; worked out once
        per case, not once per rank and step."""
        return tuple(all(batch == step[0] for batch in step) for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "scenario": self.scenario,
            "profile": self.profile,
            "dp_size": self.dp_size,
            "num_speculative_steps": self.num_speculative_steps,
            "policy": self.policy.to_dict(),
            "steps": [[batch.to_dict() for batch in step] for step in self.steps],
        }
        if self.reuse_calls:
            # Only when drawn: every other file stays as it was.
            data["reuse_calls"] = [
                [call.to_dict() for call in step] for step in self.reuse_calls
            ]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        try:
            steps = tuple(
                tuple(RankBatch.from_dict(batch) for batch in step)
                for step in data["steps"]
            )
            case = cls(
                scenario=str(data["scenario"]),
                profile=str(data["profile"]),
                policy=CapturePolicy.from_dict(data["policy"]),
                steps=steps,
                num_speculative_steps=int(data.get("num_speculative_steps", 0)),
                reuse_calls=tuple(
                    tuple(ReuseCall.from_dict(call) for call in step)
                    for step in data.get("reuse_calls", ())
                ),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise UsageError(f"malformed case: {error}") from error
        if not case.steps or len({len(step) for step in case.steps}) != 1:
            raise UsageError("malformed case: every step needs one batch per rank")
        if case.reuse_calls and [len(step) for step in case.reuse_calls] != [
            len(step) for step in case.steps
        ]:
            raise UsageError(
                "malformed case: reuse_calls needs one call per step and rank"
            )
        return case
