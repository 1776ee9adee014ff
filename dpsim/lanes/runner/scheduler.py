"""A MODEL of vLLM's Scheduler, answering what the real engine loop asks of it.

Why modelled, not run: vLLM's ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``)
is pure Python, but it needs the KV cache manager and its block pool, the
structured-output manager, the encoder cache manager, KV/EC connectors and
real ``Request`` objects (each with a block hasher), all built from a full
``VllmConfig``. What matters to DP is *what* it schedules on each rank, and
that is what the lane wants drawn adversarially (Hypothesis draws the
request streams, :mod:`dpsim.lanes.runner.generate`). So this class is
written from scratch, following the real scheduler's decisions that shape a
step (vLLM 0.33.0 ``Scheduler.schedule``, whose decisions 0.34.0's repeats
for what the model plays: its new paths need options the lane leaves at
their defaults, ``--max-num-inflight-kv-loads`` unset and cache-aware
admission, which needs prefix caching, off; where 0.26-0.32's differ, as
read in their scheduler.py, :class:`SchedulerRules` says how):

* running requests first, in order: ``num_new_tokens = num_tokens_with_spec +
  num_output_placeholders - num_computed_tokens``, capped by
  ``long_prefill_token_threshold`` (0.31+: only when more than one request is
  eligible; 0.29-0.30: always), by the token budget (``max_num_batched_tokens``)
  and by ``max_model_len - num_computed_tokens - 1`` (the "near
  max_model_len" clamp that cuts drafts); a request with 0 new tokens is
  skipped; its drafts (``spec_token_ids``) are scheduled up to what fits
  (``scheduled_spec_decode_tokens``);
* under async scheduling (``AsyncScheduler``), a request sure to have reached
  ``max_tokens`` is not scheduled again, output placeholders count the tokens
  in flight, and each scheduled decode gets ``num_spec_tokens_to_schedule``
  placeholder drafts (-1) for the next step;
* then waiting requests in arrival order while ``len(running) <
  max_num_seqs`` and budget remains; chunked prefill is on (vLLM's default);
  a request with one token left after a remote KV load is padded to ``1 + k``
  tokens with -1 drafts (0.30+: when no prefill is scheduled and a request
  ran or tokens were computed; 0.25-0.29: when a running request was
  scheduled and no prefill was), if ``max_model_len`` leaves room for them
  and the sampled token, else unpadded (0.26-0.28: if the padded tokens pass
  ``max_model_len``, the waiting loop stops instead; before 0.25: never); a
  ``long_prefill_token_threshold`` of at most k then
  cuts the padding and vLLM's scheduler asserts (0.29-0.34): a gap here,
  and :mod:`~dpsim.lanes.runner.generate` draws no such threshold;
* KV-transfer waits: a request with ``kv_wait = n`` is admitted into
  WAITING_FOR_REMOTE_KVS at its first chance, held with 0 tokens for that
  schedule and the next ``n - 1``, then found loaded: the remote prefill
  delivered all but its last prompt token (as a P/D decode instance sees),
  so it computes 1 token (padded as above);
* DP prefill throttling (``throttle_prefills``, the engine's
  ``_should_throttle_prefills``): prefill chunks and admissions wait while a
  decode is running, unless the last releasing step left admissible
  requests waiting (``prefill_capacity_bound``: 0.29-0.30 any waiting
  request, 0.31+ any not held back);
* ``skip_drafts`` (0.33+, ``_drafts_unused``): set when, for every scheduled
  request, the step is a non-final prefill chunk or samples its last output
  token; ``num_spec_tokens_to_schedule`` is k (no dynamic speculative decoding);
* ``update_from_output``: a sampling step verifies its drafts; how many are
  accepted is the script's ``accepted`` (cycled; the sampled tokens themselves
  are stood in for), a -1 padding draft is never accepted; rejected drafts
  roll back ``num_computed_tokens`` (and placeholders); the request stops at
  ``max_tokens`` (``output_len``) or ``max_model_len`` (``check_stop``) and
  is reported in the next step's ``finished_req_ids``, which keeps
  ``has_requests`` true until then;
* ``update_draft_token_ids`` (sync scheduling with a speculator): the drafts
  the worker proposed become the request's ``spec_token_ids``, ignored for a
  request still in prefill.

Not modelled (a refusal or a gap, never a silent answer): preemption (the KV
cache is unbounded), prefix caching, structured output (no grammar: the
bitmask is None), pause/resume (``pause_state`` is UNPAUSED;
``set_pause_state`` is a gap), aborts (``finish_requests`` is a gap),
encoder inputs, LoRA, pooling, PP, dynamic speculative decoding, streaming
sessions. ``update_from_output`` returns no client outputs (``{}``): nothing
in the simulation reads per-request outputs.

The objects it returns are the release's REAL ``SchedulerOutput``,
``NewRequestData`` and ``CachedRequestData`` (``vllm/v1/core/sched/output.py``,
executed under the targets' shim), filled field by field; a field the
release requires that the model cannot fill is a one-line TargetError.
"""

from __future__ import annotations

import types
import weakref
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Protocol

from dpsim.errors import TargetError
from dpsim.lanes.runner.stream import EngineOptions, RankStream, RequestScript
from dpsim.lanes.runner.strict import StrictObject, asked_at, gap, standin
from dpsim.targets.spec import _release_key

__all__ = [
    "BLOCK_SIZE",
    "INTERFACE_MODULE",
    "OUTPUT_MODULE",
    "ModelledScheduler",
    "SchedulerRules",
    "SchedulerTypes",
    "make_request",
    "rules_for",
    "scheduler_types",
]

OUTPUT_MODULE = "vllm.v1.core.sched.output"
#: Where ``PauseState`` lives (0.17+; 0.12-0.16 have the module, not the class).
INTERFACE_MODULE = "vllm.v1.core.sched.interface"
#: KV block size of the modelled cache (block ids only feed stood-in block tables).
BLOCK_SIZE = 16
#: The token id every prompt and output token carries: the model is stood in
#: for, so token values carry no meaning; one value keeps traces small.
TOKEN_ID = 1
#: Draft placeholder, as vLLM's scheduler writes for padded or in-flight drafts.
PLACEHOLDER = -1


class Sources(Protocol):
    """What the scheduler needs of the runner lane's sources
    (:class:`~dpsim.lanes.runner.sources.RunnerSources`)."""

    @property
    def version(self) -> str | None: ...

    def has(self, module: str) -> bool: ...

    def load_module(self, name: str, *, lenient: bool) -> types.ModuleType: ...


@dataclass(frozen=True)
class SchedulerTypes:
    """The release's real scheduler-side classes the lane hands vLLM."""

    SchedulerOutput: type
    NewRequestData: type
    CachedRequestData: type
    #: None before 0.17 (no engine path of those releases asks for it).
    PauseState: Any
    #: SchedulerOutput field names, for the fields only some releases have.
    output_fields: frozenset[str]


#: Per sources object (hashed by identity), its types: loaded once per run.
_TYPES: weakref.WeakKeyDictionary[Any, SchedulerTypes] = weakref.WeakKeyDictionary()


def scheduler_types(sources: Sources) -> SchedulerTypes:
    """The release's ``SchedulerOutput`` & co., executed strictly from its
    files through the sources' one loader (so every part of the lane, and
    every vLLM module importing them afterwards, sees the same classes)."""
    found = _TYPES.get(sources)
    if found is None:
        found = _TYPES[sources] = _load_types(sources)
    return found


def _load_types(sources: Sources) -> SchedulerTypes:
    for module in (OUTPUT_MODULE, INTERFACE_MODULE):
        if not sources.has(module):
            raise TargetError(
                f"runner lane: vLLM {sources.version or '(tree)'} has no "
                f"{module.replace('.', '/')}.py, which the modelled scheduler's "
                "output classes come from"
            )
    out = sources.load_module(OUTPUT_MODULE, lenient=False)
    interface = sources.load_module(INTERFACE_MODULE, lenient=False)
    classes: dict[str, Any] = {"PauseState": interface.__dict__.get("PauseState")}
    for loaded, name in (
        (out, "SchedulerOutput"),
        (out, "NewRequestData"),
        (out, "CachedRequestData"),
        *(((interface, "PauseState"),) if classes["PauseState"] is not None else ()),
    ):
        value = loaded.__dict__.get(name)
        if not isinstance(value, type):
            raise TargetError(
                f"runner lane: vLLM {sources.version or '(tree)'}'s "
                f"{loaded.__name__} defines no class {name}"
            )
        classes[name] = value
    return SchedulerTypes(
        output_fields=frozenset(f.name for f in fields(classes["SchedulerOutput"])),
        **classes,
    )


@dataclass(frozen=True)
class SchedulerRules:
    """Where releases' schedulers differ in what the model follows.

    ``skip_drafts`` is not here: it is computed always and handed on only
    where the release's SchedulerOutput has the field (0.33+).
    """

    #: 0.30+: a waiting request with one token left is padded to 1 + k when
    #: no prefill is scheduled and a request ran *or it has computed tokens*
    #: (0.29: only when a running request was scheduled).
    pad_after_computed_tokens: bool
    #: 0.31+: ``long_prefill_token_threshold`` applies only when more than one
    #: request is eligible (0.29-0.30: always).
    threshold_needs_company: bool
    #: 0.31+: ``prefill_capacity_bound`` counts only waiting requests not held
    #: back (0.29-0.30: any waiting request).
    capacity_bound_spares_held: bool
    #: 0.29+: a request is padded only when ``max_model_len`` leaves room for
    #: the padded tokens and the sampled one, else it is scheduled unpadded;
    #: 0.26-0.28: when the padded tokens pass ``max_model_len`` the waiting
    #: loop stops instead ("Prefer to not schedule than schedule un-padded").
    unpadded_near_max_model_len: bool = True
    #: 0.25+: a waiting request with one token left may be padded to 1 + k
    #: at all (``pad_spec_decode``); before, it is scheduled as its 1 token.
    pads_waiting_decodes: bool = True


def rules_for(version: str | None) -> SchedulerRules:
    """The rules of ``version``'s scheduler; a tree whose version is unknown
    gets the newest (the lane's everyday use is a current tree)."""
    key = _release_key(version)[:2] if version else (1 << 30, 0)
    return SchedulerRules(
        pad_after_computed_tokens=key >= (0, 30),
        threshold_needs_company=key >= (0, 31),
        capacity_bound_spares_held=key >= (0, 31),
        unpadded_near_max_model_len=key >= (0, 29),
        pads_waiting_decodes=key >= (0, 25),
    )


def make_request(script: RequestScript) -> StrictObject:
    """The request the engine's input queue hands ``add_request``.

    In vLLM the input thread turns an ``EngineCoreRequest`` into a ``Request``
    (``preprocess_add_request``); the engine's ``add_request`` and
    ``_handle_client_request`` read only the members given here, and this
    scheduler reads the script. KV waits are modelled inside the scheduler,
    so the request carries no ``kv_transfer_params`` (the engine then asks
    no KV connector about it).
    """
    return standin(
        "Request",
        request_id=script.req_id,
        pooling_params=None,
        kv_transfer_params=None,
        ec_transfer_params=None,
        abort_immediately=False,
        dpsim_script=script,
    )


@dataclass
class _Live:
    """One request's state in the model (vLLM's ``Request`` fields it mirrors)."""

    script: RequestScript
    status: str = "waiting"  # waiting | remote_kv | running | finished
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_output_placeholders: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    is_prefill_chunk: bool = True
    kv_held: int = 0
    kv_loaded: bool = False
    verifications: int = 0
    block_ids: list[int] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return self.script.prompt_len

    @property
    def num_tokens(self) -> int:
        return self.script.prompt_len + self.num_output_tokens

    @property
    def max_tokens(self) -> int:
        return self.script.output_len


@dataclass(frozen=True)
class _Scheduled:
    """What one step scheduled for one request, kept for ``update_from_output``."""

    samples: bool
    drafts: int
    padded: bool


@dataclass
class _Step:
    output: Any
    requests: dict[str, _Scheduled]


@dataclass
class _Plan:
    """The step ``schedule`` is building."""

    budget: int
    drafts_needed: bool
    prefill_scheduled: bool = False
    scheduled: dict[str, int] = field(default_factory=dict)
    spec: dict[str, list[int]] = field(default_factory=dict)
    kept: dict[str, _Scheduled] = field(default_factory=dict)
    #: Computed tokens before this step, per scheduled request.
    before: dict[str, int] = field(default_factory=dict)
    ran: list[_Live] = field(default_factory=list)
    admitted: list[_Live] = field(default_factory=list)


class ModelledScheduler(StrictObject):
    """One rank's modelled scheduler (see the module docstring).

    Strict: the engine reading anything not defined here is a gap.
    """

    OWNER = "Scheduler"

    def __init__(
        self, stream: RankStream, options: EngineOptions, sources: Sources
    ) -> None:
        stream.check_for(options)
        self._types = scheduler_types(sources)
        self._options = options
        self._scripts = {script.req_id: script for script in stream.requests}
        self._k = options.num_speculative_tokens
        # A drafter with its own forward (AR, MTP) reserves lookahead slots,
        # which is what lets a V2 scheduler skip drafts (0.33 can_skip_drafts).
        self._can_skip_drafts = self._k > 0
        self._rules = rules_for(sources.version)
        self._live: dict[str, _Live] = {}
        self._waiting: list[_Live] = []
        self._running: list[_Live] = []
        self._finished: set[str] = set()
        self._steps: list[_Step] = []
        self._next_block = 0
        self._capacity_bound = False

    # What the engine asks ------------------------------------------------------

    def add_request(self, request: Any) -> None:
        script = request.dpsim_script
        if script.req_id in self._live:
            raise gap(
                f"Scheduler.add_request: request {script.req_id} added twice "
                "(streaming sessions are not modelled)"
            )
        if self._scripts.get(script.req_id) != script:
            raise gap(
                f"Scheduler.add_request: request {script.req_id} is not in this "
                "rank's stream"
            )
        live = _Live(script)
        self._live[script.req_id] = live
        self._waiting.append(live)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def get_num_unfinished_requests(self) -> int:
        return len(self._running) + len(self._waiting)

    def has_requests(self) -> bool:
        # Finished but not yet reported to the workers counts (vLLM's
        # has_finished_requests), so the engine steps once more to free them.
        return self.has_unfinished_requests() or bool(self._finished)

    @property
    def pause_state(self) -> Any:
        pause_state = self._types.PauseState
        if pause_state is None:  # before 0.17: no engine path asks
            raise gap(f"Scheduler.pause_state read at {asked_at()}")
        return pause_state.UNPAUSED

    def get_grammar_bitmask(self, scheduler_output: Any) -> None:
        # No structured-output request is ever scheduled.
        return None

    def schedule(self, throttle_prefills: bool = False) -> Any:
        plan = _Plan(
            budget=self._options.max_num_batched_tokens,
            drafts_needed=not self._can_skip_drafts,
        )
        defer_prefills = (
            throttle_prefills
            and not self._capacity_bound
            and any(not live.is_prefill_chunk for live in self._running)
        )
        threshold = self._options.long_prefill_token_threshold
        if (
            self._rules.threshold_needs_company
            and len(self._running) + len(self._waiting) <= 1
        ):
            threshold = 0
        self._schedule_running(plan, defer_prefills, threshold)
        self._admit_waiting(plan, defer_prefills, threshold)
        if not defer_prefills:
            # A releasing step that left admissible requests waiting was
            # capacity-bound: the next throttled step does not defer.
            self._capacity_bound = (
                any(live.status == "waiting" for live in self._waiting)
                if self._rules.capacity_bound_spares_held
                else bool(self._waiting)
            )
        output = self._make_output(plan)
        self._after_schedule(plan.scheduled, plan.spec)
        self._steps.append(_Step(output, plan.kept))
        return output

    def update_from_output(
        self, scheduler_output: Any, model_runner_output: Any
    ) -> dict[int, Any]:
        if not self._steps or self._steps[0].output is not scheduler_output:
            raise gap(
                "Scheduler.update_from_output: output of a step this scheduler "
                "did not schedule next (steps are modelled in schedule order)"
            )
        step = self._steps.pop(0)
        for req_id in scheduler_output.num_scheduled_tokens:
            live = self._live[req_id]
            if live.status == "finished":
                # Finished while the step was in flight (async scheduling).
                continue
            entry = step.requests[req_id]
            if not entry.samples:
                continue
            accepted = self._accepted(live, entry)
            rejected = entry.drafts - accepted
            if rejected:
                live.num_computed_tokens -= rejected
                if live.num_output_placeholders > 0:
                    live.num_output_placeholders -= rejected
            self._append_outputs(live, 1 + accepted)
        return {}

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        for req_id, ids in zip(
            draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=True
        ):
            live = self._live.get(req_id)
            if live is None or live.status == "finished":
                continue
            if live.is_prefill_chunk:
                live.spec_token_ids = []
                continue
            live.spec_token_ids = list(ids)

    # The model's own bookkeeping ---------------------------------------------

    def _schedule_running(
        self, plan: _Plan, defer_prefills: bool, threshold: int
    ) -> None:
        """The RUNNING requests, in order (``schedule``'s first loop)."""
        options = self._options
        for live in self._running:
            if plan.budget <= 0:
                break
            if (
                options.async_scheduling
                and live.num_output_placeholders > 0
                and live.num_computed_tokens + 2 - live.num_output_placeholders
                >= live.num_prompt_tokens + live.max_tokens
            ):
                continue  # sure to reach max_tokens with the step in flight
            if defer_prefills and live.is_prefill_chunk:
                continue
            num_new = (
                live.num_tokens
                + len(live.spec_token_ids)
                + live.num_output_placeholders
                - live.num_computed_tokens
            )
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(
                num_new,
                plan.budget,
                options.max_model_len - live.num_computed_tokens - 1,
            )
            if num_new <= 0:
                continue
            drafts: list[int] = []
            if live.spec_token_ids:
                fit = (
                    num_new
                    + live.num_computed_tokens
                    - live.num_tokens
                    - live.num_output_placeholders
                )
                drafts = live.spec_token_ids[: max(fit, 0)]
                live.spec_token_ids = []
            plan.prefill_scheduled |= live.is_prefill_chunk
            plan.ran.append(live)
            self._add(plan, live, live.num_computed_tokens, num_new, drafts)

    def _admit_waiting(self, plan: _Plan, defer_prefills: bool, threshold: int) -> None:
        """The WAITING requests, in arrival order (``schedule``'s second loop),
        with remote KV loads held back as vLLM's ``skip_request`` does."""
        k = self._k
        held: list[_Live] = []
        for live in self._waiting:
            if live.status == "remote_kv":
                live.kv_held += 1
        while self._waiting and plan.budget > 0:
            if len(self._running) >= self._options.max_num_seqs:
                break
            live = self._waiting[0]
            if live.script.kv_wait and not live.kv_loaded:
                if live.status == "waiting":
                    live.status = "remote_kv"
                    live.kv_held = 1
                if live.kv_held <= live.script.kv_wait:
                    held.append(self._waiting.pop(0))
                    continue
                # Loaded: the remote prefill delivered all but the last token.
                live.kv_loaded = True
                live.num_computed_tokens = live.num_prompt_tokens - 1
            computed = live.num_computed_tokens
            if defer_prefills and computed < live.num_tokens - 1:
                break
            num_new = live.num_tokens - computed
            padded = k > 0 and num_new == 1 and self._may_pad(plan, computed)
            if padded and self._rules.unpadded_near_max_model_len:
                padded = computed + 1 + k + 1 <= self._options.max_model_len
            elif padded and computed + 1 + k > self._options.max_model_len:
                break  # before 0.29: rather not schedule than schedule unpadded
            if padded:
                # Rather not schedule than schedule unpadded.
                if 1 + k > plan.budget:
                    break
                num_new = 1 + k
            if 0 < threshold < num_new:
                if padded:
                    # vLLM cuts the padded count to the threshold and then
                    # asserts ``num_new_tokens == 1 + num_spec_tokens``
                    # (scheduler.py, the waiting loop's pad_spec_decode): the
                    # engine dies there. Not a DP question; refused rather
                    # than scheduled as 1 token carrying k drafts.
                    raise gap(
                        f"Scheduler.schedule: long_prefill_token_threshold "
                        f"{threshold} cuts request {live.script.req_id}'s "
                        f"padding to 1 + {k} tokens, where vLLM's scheduler "
                        "asserts (a threshold of at most k is not modelled)"
                    )
                num_new = threshold
            num_new = min(num_new, plan.budget)
            self._waiting.pop(0)
            self._running.append(live)
            live.status = "running"
            plan.admitted.append(live)
            drafts = [PLACEHOLDER] * k if padded else []
            self._add(plan, live, computed, num_new, drafts, padded=padded)
        self._waiting[:0] = held

    def _add(
        self,
        plan: _Plan,
        live: _Live,
        computed: int,
        num_new: int,
        drafts: list[int],
        *,
        padded: bool = False,
    ) -> None:
        """Schedule ``num_new`` tokens (``drafts`` among them) for ``live``."""
        req_id = live.script.req_id
        plan.before[req_id] = computed
        plan.scheduled[req_id] = num_new
        plan.budget -= num_new
        if drafts:
            plan.spec[req_id] = drafts
        plan.drafts_needed = plan.drafts_needed or not self._drafts_unused(
            live, computed, num_new
        )
        plan.kept[req_id] = _Scheduled(
            samples=computed + num_new >= live.num_tokens,
            drafts=len(drafts),
            padded=padded,
        )

    def _make_output(self, plan: _Plan) -> Any:
        """The release's SchedulerOutput for ``plan`` (``schedule``'s end)."""
        new_blocks = {
            req_id: self._allocate(self._live[req_id], plan.before[req_id] + count)
            for req_id, count in plan.scheduled.items()
        }
        cached_ids = [live.script.req_id for live in plan.ran]
        cached = _release_dataclass(
            self._types.CachedRequestData,
            # Through 0.33 (0.34 dropped both): no request resumes (no
            # preemption), and the V2 runner is sent no all_token_ids.
            req_ids=cached_ids,
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[
                (new_blocks[req_id],) if new_blocks[req_id] else None
                for req_id in cached_ids
            ],
            num_computed_tokens=[plan.before[req_id] for req_id in cached_ids],
            num_output_tokens=[
                live.num_output_tokens + live.num_output_placeholders
                for live in plan.ran
            ],
        )
        finished, self._finished = self._finished, set()
        return _release_dataclass(
            self._types.SchedulerOutput,
            scheduled_new_reqs=[self._new_request_data(live) for live in plan.admitted],
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=plan.scheduled,
            total_num_scheduled_tokens=sum(plan.scheduled.values()),
            scheduled_spec_decode_tokens=plan.spec,
            scheduled_encoder_inputs={},
            finished_req_ids=finished,
            free_encoder_mm_hashes=[],
            num_common_prefix_blocks=[],
            preempted_req_ids=set(),
            num_spec_tokens_to_schedule=self._k,
            skip_drafts=not plan.drafts_needed,
        )

    def _may_pad(self, plan: _Plan, computed: int) -> bool:
        """Whether a waiting request with one token left is padded to 1 + k."""
        if not self._rules.pads_waiting_decodes:
            return False
        if self._rules.pad_after_computed_tokens:
            return not plan.prefill_scheduled and (bool(plan.ran) or computed > 0)
        return bool(plan.ran) and not plan.prefill_scheduled

    def _drafts_unused(self, live: _Live, computed: int, num_new: int) -> bool:
        """vLLM 0.33's ``Scheduler._drafts_unused``: drafts proposed after
        this step are sure to go unused (non-final chunk, or last token)."""
        if computed + num_new < live.num_tokens:
            return True
        sure = live.num_output_tokens + 1
        if live.num_output_placeholders > 0:
            sure += 1
        return sure >= live.max_tokens

    def _after_schedule(
        self, scheduled: dict[str, int], spec: dict[str, list[int]]
    ) -> None:
        """``_update_after_schedule`` (and the AsyncScheduler's)."""
        for req_id, num_new in scheduled.items():
            live = self._live[req_id]
            live.num_computed_tokens += num_new
            live.is_prefill_chunk = live.num_computed_tokens < (
                live.num_tokens + live.num_output_placeholders
            )
            if self._options.async_scheduling and not live.is_prefill_chunk:
                live.num_output_placeholders += 1 + len(spec.get(req_id, ()))
                live.spec_token_ids = [PLACEHOLDER] * self._k

    def _accepted(self, live: _Live, entry: _Scheduled) -> int:
        if entry.drafts == 0 or entry.padded:
            # A -1 padding draft never matches a sampled token.
            return 0
        cycle = live.script.accepted
        live.verifications += 1
        if not cycle:
            return entry.drafts
        return min(cycle[(live.verifications - 1) % len(cycle)], entry.drafts)

    def _append_outputs(self, live: _Live, count: int) -> None:
        """Append sampled tokens one by one, stopping as ``check_stop`` does."""
        for _ in range(count):
            live.num_output_tokens += 1
            if live.num_output_placeholders > 0:
                live.num_output_placeholders -= 1
            if (
                live.num_tokens >= self._options.max_model_len
                or live.num_output_tokens >= live.max_tokens
            ):
                self._finish(live)
                return

    def _finish(self, live: _Live) -> None:
        live.status = "finished"
        live.spec_token_ids = []
        self._running.remove(live)
        self._finished.add(live.script.req_id)

    def _allocate(self, live: _Live, num_tokens: int) -> list[int]:
        """New block ids so the request holds ``num_tokens`` plus the k
        lookahead slots a drafter writes (``allocate_slots``)."""
        needed = -(-(num_tokens + self._k) // BLOCK_SIZE) - len(live.block_ids)
        fresh = list(range(self._next_block, self._next_block + max(0, needed)))
        self._next_block += len(fresh)
        live.block_ids.extend(fresh)
        return fresh

    def _new_request_data(self, live: _Live) -> Any:
        script = live.script
        prompt = [TOKEN_ID] * script.prompt_len
        return self._types.NewRequestData(
            req_id=script.req_id,
            prompt_token_ids=prompt,
            mm_features=[],
            sampling_params=_sampling_params(script.output_len),
            pooling_params=None,
            block_ids=(list(live.block_ids),),
            num_computed_tokens=live.num_computed_tokens,
            lora_request=None,
            prefill_token_ids=[TOKEN_ID] * live.num_tokens,
        )


def _release_dataclass(cls: type, **values: Any) -> Any:
    """The release's scheduler dataclass ``cls`` (``SchedulerOutput``,
    ``CachedRequestData``) from the fields it has.

    A value for a field the release lacks is dropped (that release's
    scheduler does not compute it either: 0.29 has no ``skip_drafts``, 0.34
    no ``resumed_req_ids``); a field it requires that is not here is refused.
    """
    kwargs = {}
    for spec in fields(cls):
        if spec.name in values:
            kwargs[spec.name] = values[spec.name]
        elif spec.default is MISSING and spec.default_factory is MISSING:
            raise TargetError(
                f"runner lane: this release's {cls.__name__} requires "
                f"{spec.name}, which the modelled scheduler does not fill"
            )
    return cls(**kwargs)


def _sampling_params(max_tokens: int) -> StrictObject:
    """The sampling parameters a request carries: only ``max_tokens`` is
    modelled (the sampler itself is stood in for)."""
    return standin("SamplingParams", max_tokens=max_tokens)
