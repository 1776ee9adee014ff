"""The per-rank programs of each scenario (names are part of dpsim's interface).

``step``     one or more syncs, each rank with its own batch against one table.
``drafter``  a target sync, then the drafter's prefill dispatch reusing that
             agreement with the drafter's own table (a fresh sync on versions
             that cannot reuse), then the drafter's decode syncs, as vLLM's
             autoregressive speculators run them; skipped together when the
             ranks agreed to skip drafts.
``profile``  the profile run: every rank eager with no capture manager.
``ubatch``   steps with microbatching votes, for versions that microbatch.

In ``step``, ``profile`` and ``ubatch``, a step in which every rank has the
same batch is synced a second time with DP coordination skipped (``solo``
phases), on versions that let callers skip DP coordination (0.30+).

Each scenario differs from ``step`` mostly in what the generators feed it
(:mod:`dpsim.scenarios.generate`); the programs differ only where vLLM's
callers do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dpsim.records.case import Case, RankBatch

from .ranks import (
    RankSetting,
    expect,
    forward,
    mark_runner,
    no_rank_has_work,
    sync,
)

RankProgram = Callable[[RankSetting, Case, int], Any]


def _stepping(label: str, *, with_manager: bool) -> RankProgram:
    """Steps of one sync each; V2's profile run syncs with no manager at all.

    V1's caller always holds its dispatcher: its profile run
    (``_dummy_run(is_profile=True)``) forces eager through ``force_eager``,
    which the batches' ``need_eager`` carries.
    """

    def program(setting: RankSetting, case: Case, rank: int) -> None:
        mark_runner(setting)
        v1 = setting.target.runner == "v1"
        manager = setting.manager if with_manager or v1 else None
        can_skip = setting.target.skips_coordination
        for index, step in enumerate(case.steps):
            phase = f"{label} {index}"
            expected = expect(setting, rank, phase, manager, step, case.policy)
            descriptor, agreement = sync(setting, rank, phase, manager, step[rank])
            forward(setting, rank, descriptor, agreement)
            if can_skip and case.shared_steps[index]:
                # Every rank has the same batch, so a rank answering alone
                # must answer as the ranks just did together. A non-MoE
                # model runs no expert collectives: no forward to follow.
                solo = f"solo {index}"
                expected(solo)
                sync(setting, rank, solo, manager, step[rank], solo=True)

    return program


step_program = _stepping("step", with_manager=True)
profile_program = _stepping("profile", with_manager=False)
ubatch_program = _stepping("ubatch", with_manager=True)


def drafter_program(setting: RankSetting, case: Case, rank: int) -> None:
    reuse = setting.target.api.has("reuse")
    passes_query_bound = setting.target.drafter_prefill_passes_query_bound
    for index, step in enumerate(case.steps):
        batch = step[rank]
        phase = f"step {index}"
        expect(setting, rank, phase, setting.manager, step, case.policy)
        descriptor, agreement = sync(setting, rank, phase, setting.manager, batch)
        forward(setting, rank, descriptor, agreement)
        if no_rank_has_work(descriptor, agreement) or getattr(
            agreement, "skip_drafts", False
        ):
            continue
        # The drafter's prefill runs the target's padded batch shape, and
        # (0.34+) passes the query bound the target's step passed.
        prefill = RankBatch(
            num_reqs=batch.num_reqs,
            num_tokens=descriptor.num_tokens,
            uniform_token_count=batch.uniform_token_count,
            max_query_len=(batch.max_query_len if passes_query_bound else None),
            need_eager=batch.need_eager and batch.kind == "profile",
            kind=batch.kind,
        )
        # The contract profile draws what the prefill passes beside the
        # agreement it reuses (its own request count, query bound, LoRA count).
        called = (
            replace(prefill, **case.reuse_calls[index][rank].to_dict())
            if case.reuse_calls
            else prefill
        )
        prefill_descriptor, prefill_agreement = sync(
            setting,
            rank,
            f"drafter prefill {index}",
            setting.drafter_prefill_manager,
            called,
            reuse=agreement if reuse else None,
        )
        forward(setting, rank, prefill_descriptor, prefill_agreement)
        # One token per request per further draft step.
        decode = replace(
            prefill,
            num_tokens=batch.num_reqs,
            uniform_token_count=1,
            max_query_len=None,
        )
        for draft in range(1, case.num_speculative_steps):
            decode_descriptor, decode_agreement = sync(
                setting,
                rank,
                f"drafter decode {index}.{draft}",
                setting.drafter_decode_manager,
                decode,
            )
            forward(setting, rank, decode_descriptor, decode_agreement)


PROGRAMS: dict[str, RankProgram] = {
    "step": step_program,
    "drafter": drafter_program,
    "profile": profile_program,
    "ubatch": ubatch_program,
}
SCENARIOS = tuple(PROGRAMS)
